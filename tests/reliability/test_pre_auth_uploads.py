"""No memory before authentication (issue 15, point 2), against a real `avm serve` with keys
required: four concurrent unauthenticated 512 MiB uploads (two chunked, two with a declared
`Content-Length`; made on the fly, never held by the test) are refused and the server's RSS grows by
less than 20 MB while they run; the server stops reading them at once, so the test takes seconds.
With a key, an oversize chunked body is cut with a 413 and an archive import of a legitimate size
still works (spooled to disk)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.auth.api_keys import new_key
from tests.support.raw_http import upload, zeros
from tests.support.servers import ServeProcess, serve

pytestmark = pytest.mark.e2e

UPLOAD = 512 << 20
MISSING = {"error": {"code": "unauthorized",
                     "message": "API key required: send the header `Authorization: Bearer <key>`"}}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class RssPeak:
    """The highest RSS of a process, sampled every few milliseconds in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kb = pid, rss_kb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak_kb = max(self.peak_kb, rss_kb(self.pid))

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, rss_kb(self.pid))


async def _token(data: Path) -> str:
    store = SqliteStore(data / "agentvm.db")
    await store.open()
    try:
        key, token = new_key("acme", ("user",), name="uploads")
        await SqliteKeys(store).put_key(key)
    finally:
        await store.close()
    return token


@pytest.fixture
def keyed_serve(tmp_path: Path) -> Iterator[tuple[ServeProcess, str]]:
    data = tmp_path / "data"
    data.mkdir()
    token = asyncio.run(_token(data))
    with serve(data, env={"AVM_AUTH": "keys", "AVM_ARCHIVE_MAX_BYTES": str(1 << 20)}) as srv:
        yield srv, token


async def test_unauthenticated_uploads_cost_the_server_no_memory(keyed_serve: tuple[ServeProcess, str]) -> None:
    srv, token = keyed_serve
    pid = srv.proc.pid
    # warm up what a refusal touches (the routes, the JSON error answer), then take the baseline
    for _ in range(3):
        assert (await upload(srv.port, "POST", "/v1/images", zeros(1 << 20))).status == 401
        await upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", zeros(1 << 20), length=1 << 20)
    baseline = rss_kb(pid)

    started = time.monotonic()
    with RssPeak(pid) as rss:
        answers = await asyncio.gather(
            upload(srv.port, "POST", "/v1/images", zeros(UPLOAD)),
            upload(srv.port, "POST", "/v1/images", zeros(UPLOAD), length=UPLOAD),
            upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", zeros(UPLOAD)),
            upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", zeros(UPLOAD), length=UPLOAD))
    took = time.monotonic() - started

    for answer in answers:
        # the server answers from the headers and closes; a reset may follow the answer
        assert answer.status in (401, None), answer
        if answer.status is not None:
            assert answer.json() == MISSING and answer.headers["connection"] == "close"
        assert answer.sent < 64 << 20, answer.sent  # not read to the end: refused after its first bytes
    assert sum(a.status == 401 for a in answers) >= 3, answers  # at most one answer lost to a reset
    growth_kb = rss.peak_kb - baseline
    assert growth_kb * 1024 < 20_000_000, f"server RSS grew by {growth_kb} kB"
    assert took < 20, took  # seconds; typically 0.01: nothing is read past the headers

    # with a key: an oversize chunked body is cut with a 413; a legitimate archive import works
    auth = {"authorization": f"Bearer {token}"}
    over = await upload(srv.port, "POST", "/v1/images", zeros(UPLOAD), headers=auth)
    assert over.status == 413 and over.json()["error"] == {
        "code": "payload_too_large", "field": "body",
        "message": "body: larger than this server's limit of 4194304 bytes (AVM_HTTP_MAX_BODY_BYTES)"}
    over = await upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", zeros(UPLOAD), headers=auth)
    assert over.status == 413 and over.json()["error"]["code"] == "archive_too_large"
    async with httpx.AsyncClient(base_url=srv.http, headers=auth, timeout=10) as http:
        image = (await http.post("/v1/images", json={"containerId": "c1", "config": {
            "name": "Kept", "systemPrompt": "x" * 190_000}})).json()
        raw = (await http.get(f"/v1/sessions/{image['sessionId']}/export")).content
        assert 190_000 < len(raw) <= 1 << 20
        done = await http.post("/v1/sessions/import", params={"containerId": "c2"}, content=raw)
        assert done.status_code == 201, done.text
        assert (await http.get(f"/v1/images/{done.json()['imageId']}")).json()["name"] == "Kept"
    assert rss_kb(pid) - baseline < 100_000  # nothing of the refused uploads stayed
