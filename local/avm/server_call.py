"""One way for every `avm` command to talk to a running server over its HTTP API: the server's
errors printed as one line (`avm <command>: <message>`, exit 1), an unreachable server as one line
with the fix (exit 2)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import httpx

from agentvm_client.management import ManagementClient, ManagementError, http_base
from avm.runner import Args
from avm.server_args import server


def unreachable(command: str, url: str, exc: Exception, *, local: bool) -> str:
    """The line for a server that does not answer; `local`: the command can read a database instead."""
    reason = str(exc) or type(exc).__name__
    fix = "start `avm serve`, or pass --url URL (or set AVM_URL)"
    if local:
        fix += "; to read a stopped server's database, pass its --data-dir DIR"
    return f"avm {command}: cannot reach {http_base(url)} ({reason}): {fix}"


async def over_server(args: Args, command: str, work: Callable[[ManagementClient], Awaitable[int]],
                      *, local: bool = False, timeout: float = 30) -> int:
    url, token = server(args.url, args.token)
    async with ManagementClient(url, token=token, timeout=timeout) as avm:
        try:
            return await work(avm)
        except ManagementError as exc:
            hint = " (check --token or $AVM_TOKEN)" if exc.status in (401, 403) else ""
            print(f"avm {command}: {exc.message}{hint}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(unreachable(command, url, exc, local=local), file=sys.stderr)
            return 2
