"""Files the server writes are not readable by tool uids: the log file 0600 (in a 0700 directory, rotated
files too), the database with its WAL files and the tool-uid file 0600, and the directories above the
workspaces 0711 (a tool's uid passes through to its own workspace, but lists no tenant or container).
Then the attack: a tool, as its container's uid, tries to read each of them on a running server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from agentvm.adapters.local.local_disk import LocalDisk
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import DEFAULT_TENANT
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.logs import setup_logging
from agentvm.sandbox.uids import ToolUids
from tests.sandbox.conftest import needs_root
from tests.support.sandbox_hosts import force_host
from tests.support.servers import in_process
from tests.support.stock_client import StockClient


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)



def test_the_log_file_is_private_and_stays_so_when_rotated(tmp_path: Path, root_logging: None) -> None:
    log_file = tmp_path / "data" / "logs" / "avm.log"
    log_file.parent.mkdir(parents=True)
    log_file.parent.chmod(0o755)
    log_file.write_text("")
    log_file.chmod(0o644)  # made by an older version
    setup_logging("INFO", log_file=log_file, max_bytes=1_000, backups=2)
    for i in range(40):
        logging.getLogger("agentvm.test").info("filler", extra={"i": i, "pad": "x" * 50})
    files = sorted(log_file.parent.iterdir())
    assert [p.name for p in files] == ["avm.log", "avm.log.1", "avm.log.2"]
    assert {p.name: mode(p) for p in files} == {"avm.log": 0o600, "avm.log.1": 0o600, "avm.log.2": 0o600}
    assert mode(log_file.parent) == 0o700


async def test_the_database_and_the_uid_file_are_private(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "agentvm.db")
    await store.open()
    try:
        await store.last_seq("t", "s")  # WAL mode: the -wal and -shm files exist while it is open
        names = {p.name: mode(p) for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir()))}
        assert names == {"agentvm.db": 0o600, "agentvm.db-wal": 0o600, "agentvm.db-shm": 0o600}
    finally:
        await store.close()
    uids = ToolUids(tmp_path / "tool-uids.json")
    await uids.uid_for("t/c")
    assert mode(tmp_path / "tool-uids.json") == 0o600


async def test_workspace_parents_are_traversable_but_not_listable(tmp_path: Path) -> None:
    disk = LocalDisk(tmp_path)
    (tmp_path / "containers").mkdir(mode=0o755)  # a `mkdir -p` of an older version: corrected
    (tmp_path / "containers").chmod(0o755)
    local = await disk.mount(DEFAULT_TENANT, "c1")
    keyed = await disk.mount("acme corp", "c2")
    assert local == tmp_path / "containers" / "c1" / "workspace"
    assert keyed == tmp_path / "tenants" / "acme%20corp" / "containers" / "c2" / "workspace"
    assert {str(p.relative_to(tmp_path)): mode(p) for p in (*local.parents, *keyed.parents, local, keyed)
            if p.is_relative_to(tmp_path) and p != tmp_path} == {
        "containers": 0o711, "containers/c1": 0o711, "containers/c1/workspace": 0o700,
        "tenants": 0o711, "tenants/acme%20corp": 0o711, "tenants/acme%20corp/containers": 0o711,
        "tenants/acme%20corp/containers/c2": 0o711, "tenants/acme%20corp/containers/c2/workspace": 0o700}


READS = ("ls {data}/containers", "cat {data}/logs/avm.log", "head -c 16 {data}/agentvm.db",
         "cat {data}/tool-uids.json", "cat /proc/{pid}/environ")


def script(data: Path) -> str:
    rules = []
    for i, command in enumerate(READS):
        cmd = command.format(data=data, pid=os.getpid()) + "; echo rc=$?"
        rules.append(f"""
  - match: "^read {i}$"
    responses:
      - tool_calls: [{{id: toolu_{i}, name: bash, input: {{command: {json.dumps(cmd)}}}}}]
      - text: ["done"]""")
    rules.append("""
  - match: "^home$"
    responses:
      - tool_calls: [{id: toolu_home, name: bash,
                      input: {command: "echo hi > $HOME/projects/x && cat $HOME/projects/x"}}]
      - text: ["done"]""")
    return "rules:" + "".join(rules)


@needs_root
@pytest.mark.parametrize("sandbox", ["uid", "bubblewrap"])
async def test_a_tool_reads_none_of_the_servers_files(traversable_dir: Path, sandbox: str, root_logging: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if sandbox == "uid":
        force_host(monkeypatch, "no-bwrap")
    data = traversable_dir / "data"
    setup_logging("INFO", log_file=data / "logs" / "avm.log")
    async with in_process(data, driver=ScriptedDriver(parse_script(script(data)))) as srv, \
            StockClient(srv.url) as client:
        if srv.runtime.tool_sandbox is None or srv.runtime.tool_sandbox.mode != sandbox:
            pytest.skip(f"this host gives {srv.runtime.tool_sandbox}")
        image = await client.new_image("c-probe", tools=["bash"])
        await client.new_image("c-other", tools=["bash"])
        logging.getLogger("agentvm.test").warning("a line in the log file")
        assert (data / "logs" / "avm.log").stat().st_size > 0
        for i, command in enumerate(READS):
            events = await client.turn(image["imageId"], f"read {i}")
            assert (data / "tool-uids.json").exists()
            [result] = [e["data"]["result"] for e in events if e["type"] == "tool_result"]
            assert "c-other" not in result and "a line in the log file" not in result
            if sandbox == "bubblewrap" and i == 0:  # only the path down to its own workspace exists there
                assert result.splitlines()[1:] == ["c-probe", "rc=0"], result
                continue
            denied = "No such file or directory" if sandbox == "bubblewrap" else "Permission denied"
            assert denied in result and "rc=0" not in result, (command, result)
        events = await client.turn(image["imageId"], "home")  # its own workspace, by absolute path
        [home] = [e["data"]["result"] for e in events if e["type"] == "tool_result"]
        assert home.splitlines()[-1] == "hi", home
