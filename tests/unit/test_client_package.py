"""The Python client is a package of its own (`client/agentvm_client`): it imports, and its clients can be
built, where neither the server nor its dependencies (FastAPI, Starlette, the AWS SDK) can be imported.

Each check runs in a fresh interpreter whose only source folder is `client/`, with an import hook that
refuses the server's packages and records every attempt to import one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT = REPO_ROOT / "client"
SERVER_ONLY = ("agentvm", "avm", "fastapi", "starlette", "uvicorn", "boto3", "botocore", "aioboto3", "mangum",
               "aws_lambda_powertools", "anthropic", "mcp", "pydantic", "pydantic_settings", "yaml")

# Refuses (and records) any import of a server-only package, ahead of the editable install's finder.
_BLOCKER = textwrap.dedent(f"""
    import json, sys
    BLOCKED = {SERVER_ONLY!r}
    attempts = []

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ModuleNotFoundError(f"{{name}} is blocked", name=name)
            return None

    sys.meta_path.insert(0, Blocker())

    def report():
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print(json.dumps({{"attempts": attempts, "loaded": loaded}}))
""")


def _run(code: str) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(CLIENT)}
    proc = subprocess.run([sys.executable, "-c", _BLOCKER + textwrap.dedent(code) + "\nreport()\n"], cwd=CLIENT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def test_the_blocker_refuses_the_server() -> None:
    result = _run("""
        try:
            import agentvm.api.http_app
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("the server was importable")
    """)
    assert result == {"attempts": ["agentvm"], "loaded": []}


def test_the_client_imports_and_runs_without_the_server() -> None:
    result = _run("""
        import asyncio, os
        import agentvm_client
        import agentvm_client.client, agentvm_client.errors, agentvm_client.frames
        import agentvm_client.management, agentvm_client.turns
        from agentvm_client import AgentVMClient, ClientError, ManagementClient, TurnResult

        assert agentvm_client.__file__.startswith(os.environ["PYTHONPATH"])
        for name in agentvm_client.__all__:
            getattr(agentvm_client, name)

        async def main() -> None:
            async with ManagementClient("http://127.0.0.1:9", timeout=1) as avm:
                assert avm.sessions.ws_url == "ws://127.0.0.1:9/ws"
            client = AgentVMClient("ws://127.0.0.1:9/ws", reconnect=False, connect_timeout=1)
            try:
                await client.connect()
            except ClientError:
                pass  # nothing listens there: the point is that it got this far
            await client.close()
            assert TurnResult(image_id="img").ok

        asyncio.run(main())
    """)
    assert result == {"attempts": [], "loaded": []}


def test_the_management_client_alone_does_not_load_the_websocket_client() -> None:
    result = _run("""
        from agentvm_client import ManagementClient
        assert "agentvm_client.client" not in sys.modules and "websockets" not in sys.modules
    """)
    assert result == {"attempts": [], "loaded": []}


def test_the_client_distribution_declares_what_it_imports() -> None:
    """`pip install ./client` gets the client's run-time needs, in the ranges the server's install allows."""
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    server = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {canonicalize_name(r.name): r for r in map(Requirement, client["dependencies"])}
    assert set(declared) == {"httpx", "orjson", "websockets"}
    ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, server["dependencies"])}
    for name, requirement in declared.items():
        assert requirement.specifier == ranges[name], f"{name}: the client and the server disagree"
