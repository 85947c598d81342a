"""Portable session archives: export → import into another container → export gives the same content
(messages, turns, usage, the image snapshot with its pins) under new ids, and the imported session
goes on; corrupted, truncated, oversize and malformed archives are refused with one clear error and
leave nothing behind; `avm sessions export/import` does the same from the command line."""

from __future__ import annotations

import asyncio
import io
import re
import sqlite3
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentvm.domain.models import Principal
from agentvm.errors import NotFound
from agentvm.services.session_archive import (
    UNFINISHED_CODE,
    UNFINISHED_TEXT,
    WRITE_CHUNK,
    SessionArchive,
    checksum_of,
    content_of,
)
from agentvm_client.management import ManagementClient, ManagementError
from avm import cli
from avm.sessions_cmd import ProgressBar
from tests.api.test_sessions_http import finished_turns
from tests.support.scripts import RecordingDriver, reference_driver
from tests.support.servers import InProcess, in_process

JSON = dict[str, Any]
CORRUPTED = "checksum: the archive is corrupted (its content does not match its checksum)"


@pytest.fixture
async def srv(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with in_process(tmp_path / "data", driver=RecordingDriver(reference_driver())) as server:
        yield server


async def session_with_turns(http: httpx.AsyncClient) -> tuple[JSON, str]:
    """An image built from a prompt resource (so it pins it), and a titled second session of it with
    a text turn, a tool turn and a failed turn."""
    await http.post("/v1/resources", json={"kind": "prompt", "name": "archived", "version": "1.0.0",
                                           "content": {"text": "You are archived."}})
    image = (await http.post("/v1/images", json={"containerId": "c-home", "config": {
        "name": "Archivist", "systemPrompt": "resource://prompts/archived", "tools": ["read_file"]}})).json()
    sid = (await http.post(f"/v1/images/{image['imageId']}/sessions", json={"title": "Kept"})).json()["sessionId"]
    for n, text in enumerate(["Hello", "tool turn", "error turn"], 1):
        assert (await http.post(f"/v1/sessions/{sid}/messages", json={"content": text})).status_code == 202
        await finished_turns(http, sid, n)
    return image, sid


def db_counts(srv: InProcess) -> dict[str, int]:
    with sqlite3.connect(srv.runtime.settings.database_path()) as db:
        return {table: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("containers", "images", "sessions", "messages", "turns")}


def resealed(archive: JSON) -> bytes:
    """The archive with its checksum recomputed: a well-formed archive of this (edited) content."""
    return orjson.dumps({**archive, "checksum": checksum_of(archive)})


def turn_view(turn: JSON) -> JSON:
    return {k: v for k, v in turn.items() if k not in ("turnId", "sessionId", "imageId", "containerId")}


async def test_export_import_export_round_trips_under_new_ids(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        image, sid = await session_with_turns(http)
        res = await http.get(f"/v1/sessions/{sid}/export")
        assert res.status_code == 200, res.text
        assert res.headers["content-type"] == "application/json"
        first = res.json()
        assert (first["format"], first["version"]) == ("agentvm.session-archive", 1)
        assert first["origin"] == {"sessionId": sid, "imageId": image["imageId"], "containerId": "c-home"}
        assert first["checksum"] == checksum_of(first) and first["checksum"].startswith("sha256:")
        assert first["session"]["title"] == "Kept"
        assert first["image"]["config"]["pins"] == {"resource://prompts/archived": "1.0.0"}
        assert first["image"]["systemPrompt"] == "You are archived."
        turns = (await http.get(f"/v1/sessions/{sid}/turns")).json()["items"]
        assert [t["turnRef"] for t in first["turns"]] == ["t1", "t2", "t3"]
        assert [t["status"] for t in first["turns"]] == ["completed", "completed", "failed"]
        assert first["turns"][2]["error"] == {"code": "rate_limit_error", "message": "Rate limit exceeded"}
        # no id of this server in the content: it does not depend on where the session lived
        content_text = orjson.dumps(content_of(first)).decode()
        for some_id in [sid, image["imageId"], *(t["turnId"] for t in turns)]:
            assert some_id not in content_text
        # usage: the turns' own records, totals as Decimal text (never floats)
        assert first["usage"] == {
            "inputTokens": 252, "outputTokens": 28, "cacheReadTokens": 80, "cacheWriteTokens": 0,
            "listCost": str(sum(Decimal(t["listCost"]) for t in turns)),
            "billedCost": str(sum(Decimal(t["billedCost"]) for t in turns))}
        assert Decimal(first["usage"]["billedCost"]) > 0

        images_before = (await http.get("/v1/images")).json()["items"]
        res = await http.post("/v1/sessions/import", params={"containerId": "c-away"}, content=res.content)
        assert res.status_code == 201, res.text
        done = res.json()
        new_sid, new_iid = done["sessionId"], done["imageId"]
        assert done == {"sessionId": new_sid, "imageId": new_iid, "containerId": "c-away", "messages": 9, "turns": 3}
        assert new_sid != sid and new_iid != image["imageId"]
        assert len((await http.get("/v1/images")).json()["items"]) == len(images_before) + 1

        got = (await http.get(f"/v1/sessions/{new_sid}")).json()
        assert (got["title"], got["containerId"], got["primary"]) == ("Kept", "c-away", True)
        assert got["image"]["pins"] == image["pins"] and got["image"]["tools"] == ["read_file"]
        old_messages = (await http.get(f"/v1/sessions/{sid}/messages")).json()["items"]
        assert (await http.get(f"/v1/sessions/{new_sid}/messages")).json()["items"] == old_messages
        new_turns = (await http.get(f"/v1/sessions/{new_sid}/turns")).json()["items"]
        assert [turn_view(t) for t in new_turns] == [turn_view(t) for t in turns]
        assert not {t["turnId"] for t in new_turns} & {t["turnId"] for t in turns}

        second = (await http.get(f"/v1/sessions/{new_sid}/export")).json()
        assert content_of(second) == content_of(first)
        assert second["checksum"] == first["checksum"]
        assert second["origin"] == {"sessionId": new_sid, "imageId": new_iid, "containerId": "c-away"}

        # the imported session goes on: its next turn runs with the imported history
        sent = await http.post(f"/v1/sessions/{new_sid}/messages", json={"content": "go on"})
        assert sent.status_code == 202, sent.text
        latest = (await finished_turns(http, new_sid, 4))[-1]
        assert (latest["turnId"], latest["status"]) == (sent.json()["turnId"], "completed")
        history = (await http.get(f"/v1/sessions/{new_sid}/messages")).json()["items"]
        assert history[:9] == old_messages and len(history) == 11
        driver = srv.runtime.driver
        assert isinstance(driver, RecordingDriver)
        request = driver.requests[-1]
        assert request.system == "You are archived."
        assert "Two files." in orjson.dumps(request.messages).decode()
        assert request.messages[-1] == {"role": "user", "content": [  # the failed turn's message, then this one
            {"type": "text", "text": "error turn"}, {"type": "text", "text": "go on"}]}
        # and the original is untouched
        assert (await http.get(f"/v1/sessions/{sid}/messages")).json()["items"] == old_messages


async def test_bad_archives_are_refused_with_one_clear_error_and_leave_nothing(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)
        raw = (await http.get(f"/v1/sessions/{sid}/export")).content
        archive = orjson.loads(raw)
        assert b"Two files." in raw
        messages = archive["messages"]
        cut = len(raw) // 2
        cases: list[tuple[bytes, str, str | None]] = [
            (raw[:cut], "the archive is not valid JSON (truncated or corrupted): unexpected end of data: "
                        f"line 1 column {cut + 1} (char {cut})", "archive"),
            (raw[:-1], "the archive is not valid JSON (truncated or corrupted): unexpected end of data: "
                       f"line 1 column {len(raw)} (char {len(raw) - 1})", "archive"),
            (b"", "the archive is not valid JSON (truncated or corrupted): Input is a zero-length, empty "
                  "document: line 1 column 1 (char 0)", "archive"),
            (raw.replace(b"Two files.", b"Two filez."), CORRUPTED, "checksum"),
            (orjson.dumps({**archive, "version": 2}), "version: unknown archive version 2 (this server reads 1)",
             "version"),
            (orjson.dumps({**archive, "version": "1"}), "version: must be an integer (this server reads 1)",
             "version"),
            (orjson.dumps({**archive, "format": "zip"}),
             'format: not a session archive (expected "agentvm.session-archive")', "format"),
            (b"[1, 2]", "the archive is not a JSON object (a session archive is one)", "archive"),
            (orjson.dumps({k: v for k, v in archive.items() if k != "checksum"}),
             "checksum: missing (an archive carries the sha256 of its content)", "checksum"),
            # well-formed archives (checksum recomputed) with content of the wrong shape
            (resealed({k: v for k, v in archive.items() if k != "messages"}), "messages: missing", "messages"),
            (resealed({**archive, "messages": [messages[0], {**messages[1], "body": "Hello there"}, *messages[2:]]}),
             "messages[1].body: must be an object (an AgentX message)", "messages[1].body"),
            (resealed({**archive, "messages": [{**messages[0], "messageId": "msg_other"}, *messages[1:]]}),
             "messages[0].body.id: must equal messageId", "messages[0].body.id"),
            (resealed({**archive, "messages": [{**messages[0], "turnRef": "t9"}, *messages[1:]]}),
             "messages[0].turnRef: t9 names no turn of the archive", "messages[0].turnRef"),
            (resealed({**archive, "messages": messages[1:]}),
             f"turns[0].userMessageId: {messages[0]['messageId']} names no message of the archive",
             "turns[0].userMessageId"),
            (resealed({**archive, "turns": [{**archive["turns"][0], "listCost": 0.0004}, *archive["turns"][1:]]}),
             "turns[0].listCost: must be a decimal number as text (money is never a float)", "turns[0].listCost"),
            (resealed({**archive, "turns": [{**archive["turns"][0], "status": "done"}, *archive["turns"][1:]]}),
             "turns[0].status: must be one of queued, running, completed, failed, interrupted", "turns[0].status"),
            (resealed({**archive, "turns": [{**archive["turns"][0], "usage": {**archive["turns"][0]["usage"],
                                                                               "inputTokens": -1}},
                                            *archive["turns"][1:]]}),
             "turns[0].usage.inputTokens: must be a non-negative integer", "turns[0].usage.inputTokens"),
            (resealed({**archive, "turns": [{**archive["turns"][0], "firstTokenMs": 2**64 - 1},
                                            *archive["turns"][1:]]}),
             "turns[0].firstTokenMs: must be at most 9007199254740991", "turns[0].firstTokenMs"),
            (resealed({**archive, "turns": [{**archive["turns"][0], "createdAt": 2**63}, *archive["turns"][1:]]}),
             "turns[0].createdAt: must be at most 9007199254740991", "turns[0].createdAt"),
            (resealed({**archive, "usage": {**archive["usage"], "outputTokens": 1}}),
             "usage: the token totals do not match the sum of the turns", "usage"),
            (resealed({**archive, "session": {"title": 7, "createdAt": 1}}),
             "session.title: must be a string or null", "session.title"),
            (resealed({**archive, "image": {**archive["image"], "config": {**archive["image"]["config"],
                                                                           "tools": ["rm_rf"]}}}),
             "image.config.tools: unknown tool 'rm_rf' (built-in: bash, read_file, write_file, edit_file, "
             "list_files)", "image.config.tools"),
            (resealed({**archive, "extra": True}), "extra: unknown field (known: format, version, exportedAt, "
             "origin, image, session, messages, turns, usage, checksum)", "extra"),
        ]
        images = (await http.get("/v1/images")).json()
        counts = db_counts(srv)
        for body, message, field in cases:
            res = await http.post("/v1/sessions/import", params={"containerId": "c-new"}, content=body)
            assert res.status_code == 400, (message, res.text)
            assert res.json()["error"] == {"code": "invalid_request", "message": message, "field": field}
            assert (await http.get("/v1/images")).json() == images
            assert db_counts(srv) == counts, message

        res = await http.post("/v1/sessions/import", params={"containerId": "../etc"}, content=raw)
        assert res.status_code == 400
        assert res.json()["error"]["message"] == ("containerId: 1 to 128 letters, digits and . _ : @ -, starting "
                                                  "with a letter or digit")
        res = await http.post("/v1/sessions/import", content=raw)
        assert res.status_code == 400 and res.json()["error"]["field"] == "containerId"
        missing = await http.get("/v1/sessions/sess_nope/export")
        assert missing.status_code == 404
        assert missing.json()["error"] == {"code": "not_found", "message": "Session not found: sess_nope",
                                           "field": "sessionId"}
        assert db_counts(srv) == counts and "c-new" not in str(images)


async def test_an_oversize_archive_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=reference_driver(), archive_max_bytes=2048) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)
        raw = (await http.get(f"/v1/sessions/{sid}/export")).content
        assert len(raw) > 2048  # exports are not limited; imports are
        counts = db_counts(srv)
        expected = {"code": "archive_too_large", "field": "archive",
                    "message": "archive: larger than this server's limit of 2048 bytes (AVM_ARCHIVE_MAX_BYTES)"}
        declared = await http.post("/v1/sessions/import", params={"containerId": "c-new"}, content=raw)
        assert (declared.status_code, declared.json()["error"]) == (413, expected)

        async def undeclared() -> AsyncIterator[bytes]:  # chunked: no content-length to go by
            for i in range(0, len(raw), 1000):
                yield raw[i:i + 1000]

        streamed = await http.post("/v1/sessions/import", params={"containerId": "c-new"}, content=undeclared())
        assert (streamed.status_code, streamed.json()["error"]) == (413, expected)
        async with ManagementClient(srv.http) as avm:
            with pytest.raises(ManagementError) as refused:
                await avm.sessions.import_(raw, "c-new")
        assert (refused.value.status, refused.value.message) == (413, expected["message"])
        assert db_counts(srv) == counts


async def test_a_failure_after_the_first_write_leaves_nothing(srv: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many messages (several checkpoints); the store fails on the second one, then at the commit
    point: every row written before is deleted again, and nothing was ever visible."""
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)
        archive = (await http.get(f"/v1/sessions/{sid}/export")).json()
    user, answer = archive["messages"][0], archive["messages"][1]
    turn = archive["turns"][0]
    messages, turns = [], []
    for n in range(1, WRITE_CHUNK + 51):
        ref = f"t{n}"
        for m in (user, answer):
            mid = f"{m['messageId']}_{n}"
            messages.append({"messageId": mid, "turnRef": ref, "body": {**m["body"], "id": mid}})
        turns.append({**turn, "turnRef": ref, "userMessageId": f"{user['messageId']}_{n}"})
    big = {**archive, "messages": messages, "turns": turns, "usage": {
        "inputTokens": turn["usage"]["inputTokens"] * len(turns), "outputTokens": turn["usage"]["outputTokens"] *
        len(turns), "cacheReadTokens": 0, "cacheWriteTokens": 0,
        "listCost": str(Decimal(turn["listCost"]) * len(turns)),
        "billedCost": str(Decimal(turn["billedCost"]) * len(turns))}}
    big["checksum"] = checksum_of(big)
    s = srv.runtime.services
    archives = SessionArchive(s.deps, s.images, s.image_sessions)
    p = Principal("local")
    store = srv.runtime.store
    counts = db_counts(srv)

    real_commit, real_create = store.commit, store.create_image
    calls: list[int] = []

    async def failing_commit(checkpoint: Any) -> None:
        calls.append(len(checkpoint.messages))
        if len(calls) == 2:
            raise OSError("disk full")
        await real_commit(checkpoint)

    monkeypatch.setattr(store, "commit", failing_commit)
    with pytest.raises(OSError, match="disk full"):
        await archives.import_(p, "c-big", big)
    assert calls == [WRITE_CHUNK, WRITE_CHUNK]
    assert db_counts(srv) == counts

    async def failing_create(*_args: Any) -> None:
        raise OSError("gone")

    monkeypatch.setattr(store, "commit", real_commit)
    monkeypatch.setattr(store, "create_image", failing_create)
    with pytest.raises(OSError, match="gone"):
        await archives.import_(p, "c-big", big)
    after = db_counts(srv)
    assert {k: v for k, v in after.items() if k != "containers"} == {
        k: v for k, v in counts.items() if k != "containers"}

    monkeypatch.setattr(store, "create_image", real_create)
    done = await archives.import_(p, "c-big", big)
    assert (done.messages, done.turns) == (2 * len(turns), len(turns))
    again = await archives.export(p, done.session_id)
    assert content_of(again) == content_of(big)


async def test_unfinished_turns_come_in_interrupted_and_other_tenants_see_nothing(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)
        archive = (await http.get(f"/v1/sessions/{sid}/export")).json()
        archive["turns"][2] = {**archive["turns"][2], "status": "running", "error": None, "endedAt": None}
        res = await http.post("/v1/sessions/import", params={"containerId": "c-away"}, content=resealed(archive))
        assert res.status_code == 201, res.text
        new_sid = res.json()["sessionId"]
        last = (await http.get(f"/v1/sessions/{new_sid}/turns")).json()["items"][-1]
        assert last["status"] == "interrupted" and last["endedAt"] is not None
        assert last["error"] == {"code": UNFINISHED_CODE, "message": UNFINISHED_TEXT}
        await http.post(f"/v1/sessions/{new_sid}/messages", json={"content": "go on"})
        assert (await finished_turns(http, new_sid, 4))[-1]["status"] == "completed"

    s = srv.runtime.services
    archives = SessionArchive(s.deps, s.images, s.image_sessions)
    with pytest.raises(NotFound, match=f"Session not found: {sid}"):
        await archives.export(Principal("another-tenant"), sid)
    assert (await archives.export(Principal("local"), sid))["origin"]["sessionId"] == sid


async def test_avm_sessions_export_and_import(srv: InProcess, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)

    def avm(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["sessions", "--url", srv.url, *argv])
        out, err = capsys.readouterr()
        # the command's own lines (other tests' log handlers may write here too)
        return code, out, "".join(f"{line}\n" for line in err.splitlines() if line.startswith("avm sessions:"))

    path = tmp_path / "kept.json"
    code, out, err = await asyncio.to_thread(avm, "export", sid, "--out", str(path))
    assert (code, err) == (0, "")
    assert out == f"wrote session {sid} to {path} ({path.stat().st_size} bytes)\n"
    code, out, err = await asyncio.to_thread(avm, "import", str(path), "--container", "c-cli")
    assert (code, err) == (0, "")
    imported = re.fullmatch(r"imported session (sess_\S+) \(image img_\S+, container c-cli\): 9 messages, "
                            r"3 turns\n", out)
    assert imported is not None, out
    new_sid = imported.group(1)
    async with ManagementClient(srv.http) as client:
        assert content_of(await client.sessions.export(new_sid)) == content_of(orjson.loads(path.read_bytes()))

    path.write_bytes(path.read_bytes().replace(b"Two files.", b"Two filez."))
    assert await asyncio.to_thread(avm, "import", str(path), "--container", "c-cli") == (
        1, "", f"avm sessions: {CORRUPTED}\n")
    path.write_bytes(path.read_bytes()[:100])
    code, _, err = await asyncio.to_thread(avm, "import", str(path), "--container", "c-cli")
    assert (code, err) == (1, "avm sessions: the archive is not valid JSON (truncated or corrupted): "
                              "unexpected end of data: line 1 column 101 (char 100)\n")
    assert await asyncio.to_thread(avm, "import", str(tmp_path / "none.json"), "--container", "c-cli") == (
        1, "", f"avm sessions: {tmp_path / 'none.json'}: No such file or directory\n")
    assert await asyncio.to_thread(avm, "export", "sess_nope") == (
        1, "", "avm sessions: Session not found: sess_nope\n")
    # --url (and --token) also after the action, where users type them
    after = await asyncio.to_thread(cli.main, ["sessions", "export", sid, "--url", srv.url, "--out", str(path)])
    assert after == 0 and path.stat().st_size > 0
    capsys.readouterr()
    nowhere = await asyncio.to_thread(cli.main, ["sessions", "--url", "http://127.0.0.1:9", "export", sid,
                                                 "--url", srv.url, "--out", str(path)])
    assert nowhere == 0  # the action's --url wins


async def test_big_archives_stream_with_progress(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        _image, sid = await session_with_turns(http)
        archive = (await http.get(f"/v1/sessions/{sid}/export")).json()
    first = archive["messages"][0]
    big_text = "lorem ipsum " * 250_000  # 3 MB
    archive["messages"][0] = {**first, "body": {**first["body"], "content": big_text}}
    raw = resealed(archive)
    sent: list[tuple[int, int | None]] = []
    received: list[tuple[int, int | None]] = []
    async with ManagementClient(srv.http) as avm:
        done = await avm.sessions.import_(raw, "c-big", progress=lambda n, total: sent.append((n, total)))
        back = await avm.sessions.export_bytes(done["sessionId"], progress=lambda n, t: received.append((n, t)))
    assert len(sent) > 10 and sent[-1] == (len(raw), len(raw))
    assert [n for n, _ in sent] == sorted(n for n, _ in sent)
    assert received[-1] == (len(back), len(back)) and len(received) > 1
    assert content_of(orjson.loads(back)) == content_of(archive)


def test_the_progress_bar_shows_only_for_big_transfers_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    bar = ProgressBar("importing", tty)
    bar(1000, 1000)  # small: no bar
    assert tty.getvalue() == ""
    bar(2 * 1_048_576, 4 * 1_048_576)
    bar(4 * 1_048_576, 4 * 1_048_576)  # the last one always shows
    bar.close()
    assert tty.getvalue() == (f"\rimporting [{'#' * 15}{'-' * 15}]  50%  2.0/4.0 MB"
                              f"\rimporting [{'#' * 30}] 100%  4.0/4.0 MB\n")
    piped = io.StringIO()
    quiet = ProgressBar("exporting", piped)
    quiet(5 * 1_048_576, None)
    quiet.close()
    assert piped.getvalue() == ""
