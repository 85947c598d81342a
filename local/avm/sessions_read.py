"""`avm sessions list|show|search`: the caller's sessions on a running server, over its HTTP API
(`GET /v1/sessions`, `/v1/sessions/{id}` with its messages and turns, `/v1/sessions/search`).
Plain lines for people; `--json` for scripts (one JSON document on standard output)."""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import click
import orjson

from agentvm_client.management import ManagementClient
from avm.runner import Args, Command, run
from avm.server_args import F, server_options
from avm.server_call import over_server

JSON = dict[str, Any]
_MARK = re.compile(r"<mark>(.*?)</mark>", re.S)
_TAG = re.compile(r"<[^>]+>")


def paging(default: int) -> Callable[[F], F]:
    """--limit, --cursor, --all and --json of a command that answers in pages."""
    options = [
        click.option("--limit", type=int, default=default, help=f"at most this many a page (1-200, default {default})"),
        click.option("--cursor", help="the page after a previous answer's (printed at its end)"),
        click.option("--all", "every", is_flag=True, help="every page, not only the first"),
        click.option("--json", "as_json", is_flag=True, help="the items (and nextCursor) as one JSON document"),
    ]

    def apply(command: F) -> F:
        for option in reversed(options):  # the last applied is listed first
            command = option(command)
        return command
    return apply


@click.command("list", cls=Command, help="Your sessions, newest first (every image's, or one image's).")
@click.option("--image", metavar="IMAGE_ID", help="only this image's sessions")
@paging(20)
@server_options
def list_(**_: Any) -> int:
    return run(read)


@click.command(cls=Command, help="One session: its image, turns and cost, and its conversation.")
@click.argument("session_id", metavar="SESSION_ID")
@click.option("--json", "as_json", is_flag=True, help="the session, messages and turns as one JSON document")
@server_options
def show(**_: Any) -> int:
    return run(read)


@click.command(cls=Command, help="Full-text search of your messages, best first.")
@click.argument("query", metavar="WORDS...", nargs=-1, required=True)
@paging(10)
@server_options
def search(**_: Any) -> int:
    return run(read)


async def read(args: Args) -> int:
    return await over_server(args, "sessions", lambda avm: _read(avm, args))


def when(ms: Any) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def plain_snippet(snippet: str, *, bold: bool) -> str:
    """The server's HTML snippet as text: matches in bold on a terminal, the rest unescaped."""
    marked = _MARK.sub(lambda m: f"\x1b[1m{m.group(1)}\x1b[0m" if bold else m.group(1), snippet)
    return html.unescape(_TAG.sub("", marked)).replace("\n", " ")


async def _read(avm: ManagementClient, args: Args) -> int:
    if args.action == "show":
        return await _show(avm, args)
    if not 1 <= args.limit <= 200:
        print(f"avm sessions {args.action}: --limit: must be 1 to 200, not {args.limit}", file=sys.stderr)
        return 2
    items: list[JSON] = []
    cursor = args.cursor
    while True:
        if args.action == "list":
            page = await avm.sessions.page(image_id=args.image, limit=args.limit, cursor=cursor)
        else:
            page = await avm.sessions.search(" ".join(args.query), limit=args.limit, cursor=cursor)
        items += page["items"]
        cursor = page.get("nextCursor")
        if not args.every or cursor is None:
            break
    if args.as_json:
        sys.stdout.write(orjson.dumps({"items": items, "nextCursor": cursor}, option=orjson.OPT_INDENT_2).decode()
                         + "\n")
        return 0
    if args.action == "list":
        for s in items:
            print(f"{s['sessionId']}  {when(s.get('createdAt'))}  {s['imageId']}  {s['containerId']}  "
                  f"{s.get('title') or '-'}")
        if not items:
            print("(no sessions)")
    else:
        bold = sys.stdout.isatty()
        for h in items:
            print(f"{h['sessionId']}  {when(h.get('timestamp'))}  {h.get('role') or '-':<9}  "
                  f"{plain_snippet(str(h.get('snippet', '')), bold=bold)}")
        if not items and cursor is None:
            print("(no matches)")
    if cursor is not None:
        print(f"(more: --cursor {cursor}, or --all)", file=sys.stderr)
    return 0


async def _show(avm: ManagementClient, args: Args) -> int:
    from avm.chat_render import describe_message

    session = (await avm.sessions.get(args.session_id)).data
    messages = await avm.sessions.messages(args.session_id)
    turns = await avm.sessions.turns(args.session_id)
    if args.as_json:
        doc = {"session": session, "messages": messages, "turns": turns}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    image = session.get("image") or {}
    config = image.get("config") or {}
    print(f"session   {session['sessionId']}{'  (primary)' if session.get('primary') else ''}")
    print(f"image     {session['imageId']}  {image.get('name') or ''}".rstrip())
    print(f"container {session['containerId']}")
    print(f"title     {session.get('title') or '-'}")
    print(f"created   {when(session.get('createdAt'))} UTC")
    if config.get("model"):
        print(f"model     {config['model']}")
    print(f"turns     {len(turns)}  billed {_total(turns)} USD")
    for message in messages:
        who, body = describe_message(message)
        print(f"{who}: {body}")
    return 0


def _total(turns: list[JSON]) -> str:
    total = Decimal(0)
    for t in turns:
        try:
            total += Decimal(str(t.get("billedCost") or 0))
        except InvalidOperation:
            continue
    return format(total.normalize(), "f") if total else "0"
