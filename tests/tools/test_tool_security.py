"""The tool sandbox through a running server: what a tool can reach, and that a hostile tool neither
stops nor slows the other connections. Runs with bubblewrap when usable and without it (then, as
root, each container's tools run as the container's own uid)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from agentvm.adapters.local.local_process import probe_host
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.support.sandbox_hosts import force_host
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

SECRET_KEY = "sk-ant-api03-SECRET-must-never-reach-a-tool"


def bash_rule(trigger: str, command: str) -> str:
    return f"""
  - match: "^{trigger}$"
    responses:
      - tool_calls: [{{id: toolu_{trigger}, name: bash, input: {{command: {command!r}}}}}]
      - text: ["done"]"""


def script(other_file: Path, database: Path) -> str:
    rules = [
        bash_rule("env", "env; cat /proc/1/environ 2>&1 | tr '\\\\0' '\\\\n'"),
        bash_rule("steal", f"cat {other_file}; ls {other_file.parent}"),
        bash_rule("relative", "cat ../../c-victim/workspace/projects/secret.txt"),
        bash_rule("plant", f"echo pwned > {other_file.parent}/planted.txt"),
        bash_rule("database", f"head -c 100 {database}"),
        bash_rule("loop", "while :; do :; done"),
        bash_rule("forkbomb", "bomb() { bomb | bomb & }; bomb"),
        bash_rule("flood", "yes 0123456789abcdef | head -c 100000000"),
    ]
    return "rules:" + "".join(rules) + """
  - match: "^symlink$"
    responses:
      - tool_calls: [{id: toolu_ln, name: bash, input: {command: "ln -s / projects/host"}}]
      - tool_calls: [{id: toolu_rd, name: read_file, input: {path: projects/host/etc/hostname}}]
      - text: ["done"]
  - match: "^hello$"
    responses:
      - text: ["hi"]
"""


@pytest.fixture
def data(traversable_dir: Path) -> Path:
    return traversable_dir / "data"


@pytest.fixture(params=["none", "bwrap", "auto-forced-no-bwrap"])
def isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    host = probe_host()
    if request.param == "bwrap" and host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    if request.param != "bwrap" and os.geteuid() != 0:
        # not root and no bubblewrap: refused unless opted in (tests/tools/test_unsandboxed_host.py)
        pytest.skip("without bubblewrap, isolation between containers needs a server running as root")
    if request.param == "auto-forced-no-bwrap":  # the default setting on a root host without bubblewrap
        force_host(monkeypatch, "no-bwrap")
        return "auto"
    return str(request.param)


def results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "tool_result"]


async def test_a_tool_reaches_nothing_outside_its_workspace(data: Path, isolation: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-must-never-reach-a-tool")
    victim_file = data / "containers" / "c-victim" / "workspace" / "projects" / "secret.txt"
    driver = ScriptedDriver(parse_script(script(victim_file, data / "agentvm.db")))
    async with in_process(data, driver=driver, llm_api_key=SECRET_KEY, sandbox_isolation=isolation) as srv, \
            StockClient(srv.url) as client:
        victim = await client.new_image("c-victim", tools=["write_file"])
        attacker = await client.new_image("c-attacker", tools=["bash", "read_file"])
        await client.request("message_send_request", {"imageId": victim["imageId"], "content": "hello"})
        victim_ws = victim_file.parent.parent
        from agentvm.adapters.local.local_fs import LocalFileSystem
        from agentvm.sandbox import Workspace

        ws = await Workspace.open(victim_ws, LocalFileSystem)
        await ws.fs.write_bytes("projects/secret.txt", b"the victim's secret")

        [env] = results(await client.turn(attacker["imageId"], "env"))
        assert SECRET_KEY not in env["result"]
        assert "aws-secret" not in env["result"]
        assert "AVM_" not in env["result"]
        names = sorted(line.split("=", 1)[0] for line in env["result"].splitlines()[1:] if "=" in line)
        assert {"HOME", "LANG", "PATH", "TERM", "TMPDIR"} <= set(names)

        for trigger in ("steal", "relative", "plant", "database"):
            [res] = results(await client.turn(attacker["imageId"], trigger))
            assert res["isError"] is True, (trigger, res)
            assert "the victim's secret" not in res["result"]
            assert "SQLite" not in res["result"]
            expected = "No such file or directory" if isolation == "bwrap" else "Permission denied"
            assert expected in res["result"], (trigger, res["result"])
        assert not (victim_ws / "projects" / "planted.txt").exists()

        ln, rd = results(await client.turn(attacker["imageId"], "symlink"))
        assert ln["isError"] is False
        assert rd["isError"] is True and "symlink leads out of the workspace" in rd["result"]

        # each container's files belong to its own uid (as root), so the two never share one
        if os.geteuid() == 0:
            owners = {os.stat(data / "containers" / c / "workspace").st_uid for c in ("c-victim", "c-attacker")}
            assert len(owners) == 2 and 0 not in owners


@pytest.mark.exclusive  # it bounds the bystander's latency while hostile tools load the machine
async def test_hostile_tools_are_stopped_and_others_keep_being_served(data: Path, isolation: str) -> None:
    driver = ScriptedDriver(parse_script(script(data / "nowhere", data / "agentvm.db")))
    async with in_process(data, driver=driver, sandbox_isolation=isolation, tool_timeout_s=3) as srv, \
            StockClient(srv.url) as attacker, StockClient(srv.url) as bystander:
        bad = await attacker.new_image("c-hostile", tools=["bash"])
        good = await bystander.new_image("c-good")

        async def chat_while(task: asyncio.Task[list[dict[str, Any]]]) -> list[float]:
            latencies = []
            while not task.done():
                t0 = time.monotonic()
                events = await bystander.turn(good["imageId"], "hello", timeout=5)
                latencies.append(time.monotonic() - t0)
                assert events[-1]["data"]["status"] == "completed"
            return latencies

        for trigger, killed in (("loop", "killed: the command ran longer than 3 s"),
                                ("forkbomb", None), ("flood", "[killed: the command wrote more than")):
            t0 = time.monotonic()
            turn = asyncio.get_running_loop().create_task(attacker.turn(bad["imageId"], trigger, timeout=30))
            latencies = await chat_while(turn)
            [res] = results(turn.result())
            elapsed = time.monotonic() - t0
            assert elapsed < 10, (trigger, elapsed)
            # served all along: a starved bystander slows every turn, while one turn delayed by the shared
            # machine (the suite's other workers run beside this test) is no starvation
            assert latencies and statistics.median(latencies) < 0.5 and max(latencies) < 3.0, (trigger, latencies)
            if killed is not None:
                assert killed in res["result"], (trigger, res["result"][-300:])
            assert turn.result()[-1]["data"]["status"] == "completed"
            if trigger == "flood":
                # 100 MB were written; what the model got is a preview that fits one frame
                assert len(res["result"].encode()) < 24 * 1024
                assert res["result"].splitlines()[-1].startswith("[output truncated: ")
                assert "(read it with read_file and offset/limit)]" in res["result"]
