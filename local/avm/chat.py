"""`avm chat`: talk to an agent from the terminal over the AgentX WebSocket protocol.

Creates a container and an image (or continues `--image`), then reads messages and shows each reply
as it streams: Markdown, tool calls, the cost of the turn (chat_render.py). Line editing, history
and multi-line input come from prompt_toolkit (chat_input.py); slash commands switch sessions and
images (chat_commands.py); the loop and Ctrl-C are chat_loop.py's. Without a terminal it reads
plain lines and writes plain text, for scripts.

Addresses: `avm serve` answers everything on one base URL (`--url ws://host:port/ws` or
`http://host:port`). A cloud stack has a WebSocket URL of its own (`--url wss://…/prod`, the key as
`--token` or `?token=` in the URL) and its sessions API at ChatStreamUrl (`--http-url`).
"""

from __future__ import annotations

import getpass
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

import click

from agentvm.config import ClientSettings
from avm.runner import Args, Command, complete_file, run
from avm.server_args import env_token

from .chat_keys import KEYS_HELP, default_history_path

DEFAULT_URL = "ws://127.0.0.1:8080/ws"


def _default_container() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name in this environment
        user = ""
    return "user-" + (re.sub(r"[^A-Za-z0-9_.-]", "-", user) or "local")


@click.command(cls=Command, short_help="chat with an agent in the terminal",
               help="Chat with an agent over the AgentX WebSocket protocol. Type /help in the chat for its commands "
                    "(/new, /sessions, /resume, /images, /history, /exit). " + KEYS_HELP)
@click.option("--url", metavar="URL", default=lambda: ClientSettings().url,
              help=f"the server: avm serve's ws://host:port/ws or http://host:port; a stack: its WebSocketUrl "
                   f"(default: $AVM_URL or {DEFAULT_URL})")
@click.option("--http-url", metavar="URL",
              help="the sessions API for /new, /sessions, /resume sess_… (default: the server of --url; a stack: "
                   "its ChatStreamUrl)")
@click.option("--token", metavar="KEY", default=env_token,
              help="API key sent as a Bearer token (default: $AVM_TOKEN, else a ?token= in --url)")
@click.option("--container", default=_default_container,
              help="container for a new image (default: user-<login name>)")
@click.option("--image", metavar="IMAGE_ID", help="continue this existing image instead of creating one")
@click.option("--name", help="name of the new image")
@click.option("--system", help="system prompt of the new image")
@click.option("--tools", help="built-in tools the new image's agent may use, comma-separated "
                              "(bash,read_file,write_file,edit_file,list_files)")
@click.option("--history", metavar="FILE", shell_complete=complete_file,
              default=lambda: str(ClientSettings().chat_history or default_history_path()),
              help="file keeping the lines typed, across runs (default: $AVM_CHAT_HISTORY or "
                   "$XDG_DATA_HOME/agentvm/chat-history); '' keeps none")
def chat(**_: Any) -> int:
    return run(run_chat)


def shown(url: str) -> str:
    """`url` as printed: without its query, where a `?token=` would be."""
    return url.split("?", 1)[0]


async def run_chat(args: Args, *, stdin_fd: int | None = None, stdout: TextIO | None = None,
                   stderr: TextIO | None = None) -> int:
    """Run the chat. Returns 0 on a clean exit, 1 when the server cannot be reached or refuses."""
    # loaded here: every `avm` command registers this one (prompt_toolkit and rich take ~0.4 s)
    from agentvm_client import AgentVMClient, ConnectError
    from agentvm_client.management import ManagementClient, http_base, ws_url_for

    from .chat_input import LineInput, PipeInput, TerminalInput
    from .chat_loop import ChatLoop
    from .chat_render import Screen

    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    fd = stdin_fd if stdin_fd is not None else sys.stdin.fileno()
    interactive = _isatty(out) and _fd_isatty(fd)
    screen = Screen(out, err, rich=interactive)
    ws_url = ws_url_for(args.url)
    token = args.token or _query_token(args.url)
    http_url = getattr(args, "http_url", None) or http_base(args.url)
    client = AgentVMClient(ws_url, token=args.token or None)
    try:
        await client.connect()
    except ConnectError as exc:
        # the one line a refused or unreachable connection gets
        hint = " (check --token or $AVM_TOKEN)" if exc.status in (401, 403) else ""
        screen.error(f"avm chat: {str(exc).replace(ws_url, shown(ws_url))}{hint}")
        return 1
    lines: LineInput
    if interactive:
        history = getattr(args, "history", None)
        lines = TerminalInput(_history_path(history))
        if lines.history_note:
            screen.notice(lines.history_note)
    else:
        lines = PipeInput(fd)
    http = ManagementClient(http_url, token=token, ws_url=ws_url)
    try:
        return await ChatLoop(client, http, http_url, args, lines, screen).run()
    finally:
        await http.close()
        await client.close()


def _history_path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _query_token(url: str) -> str | None:
    values = parse_qs(urlsplit(url).query).get("token")
    return values[0] if values else None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fd_isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
