"""`avm sessions list|show|search` (avm/sessions_read.py), `avm sessions export SESSION_ID [--out FILE]`
and `avm sessions import FILE --container C`: the caller's sessions and portable session archives
(docs/sessions.md) on a running server, over its HTTP API. Big archives show a progress bar on
stderr when it is a terminal."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from agentvm_client.management import ManagementClient
from avm import sessions_read
from avm.runner import Args, Group, run
from avm.server_args import server_options
from avm.server_call import over_server

BAR_MIN_BYTES = 1024 * 1024  # smaller archives move too fast for a bar to say anything


@click.group(cls=Group, short_help="your sessions on a server: list, show, search, export, import",
             help="Your sessions on a running server, over its HTTP API (--url, --token; default "
                  "$AVM_URL/$AVM_TOKEN): list, show and search them; export one as a portable archive and "
                  "import it into any container (docs/sessions.md).")
@server_options
def sessions(**_: Any) -> None:
    pass


for read_command in (sessions_read.list_, sessions_read.show, sessions_read.search):
    sessions.add_command(read_command)


@sessions.command(help="Write a session (image snapshot, messages, turns, usage) as JSON.")
@click.argument("session_id", metavar="SESSION_ID")
@click.option("--out", "-o", type=click.Path(path_type=Path), help="the file to write (default: standard output)")
@click.option("--include-secrets", is_flag=True,
              help="keep the image's secrets (MCP server env values, headers, URL tokens) in the archive, a file "
                   "then readable by you only; without it they are written as <redacted>")
@server_options
def export(**_: Any) -> int:
    return run(run_archive)


@sessions.command("import", help="Restore an archive into a container (a new image and session).")
@click.argument("file", metavar="FILE")
@click.option("--container", "-c", required=True, help="the container to restore into (created if needed)")
@server_options
def import_(**_: Any) -> int:
    return run(run_archive)


class ProgressBar:
    """A one-line text bar on a terminal: `label [#####-----]  52%  3.1/6.0 MB`. Silent unless
    `stream` is a terminal and the transfer is (or turns out to be) bigger than `min_bytes`."""

    def __init__(self, label: str, stream: TextIO | None = None, *, min_bytes: int = BAR_MIN_BYTES,
                 width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.min_bytes, self.width = min_bytes, width
        self.enabled = self.stream.isatty()
        self.shown = False
        self._last = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled or max(done, total or 0) <= self.min_bytes:
            return
        now = time.monotonic()
        if self.shown and now - self._last < 0.1 and done != total:
            return
        self._last, self.shown = now, True
        mb = done / 1_048_576
        if total:
            filled = min(self.width, self.width * done // total)
            line = (f"{self.label} [{'#' * filled}{'-' * (self.width - filled)}] {100 * done // total:3d}%  "
                    f"{mb:.1f}/{total / 1_048_576:.1f} MB")
        else:
            line = f"{self.label} {mb:.1f} MB"
        self.stream.write("\r" + line)
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Whole or not at all: a temporary file next to it, renamed over it; `private`: mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _read(name: str) -> bytes:
    return sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()


async def run_archive(args: Args) -> int:
    archive = b""
    if args.action == "import":  # a missing file: one line, before any request
        try:
            archive = await asyncio.to_thread(_read, args.file)
        except OSError as exc:
            return _fail(exc)
    bar = ProgressBar("exporting" if args.action == "export" else "importing")

    async def work(avm: ManagementClient) -> int:
        try:
            if args.action == "export":
                data = await avm.sessions.export_bytes(args.session_id, include_secrets=args.include_secrets,
                                                       progress=bar)
                bar.close()
                if args.out is None:
                    sys.stdout.buffer.write(data)
                    sys.stdout.flush()
                    return 0
                try:
                    await asyncio.to_thread(functools.partial(_write, private=args.include_secrets), args.out, data)
                except OSError as exc:
                    return _fail(exc)
                print(f"wrote session {args.session_id} to {args.out} ({len(data)} bytes)")
                return 0
            done = await avm.sessions.import_(archive, args.container, progress=bar)
        finally:
            bar.close()
        print(f"imported session {done['sessionId']} (image {done['imageId']}, container {done['containerId']}): "
              f"{_count(done['messages'], 'message')}, {_count(done['turns'], 'turn')}")
        return 0
    return await over_server(args, "sessions", work, timeout=300)


def _fail(exc: OSError) -> int:
    print(f"avm sessions: {exc.filename}: {exc.strerror}" if exc.filename else f"avm sessions: {exc}",
          file=sys.stderr)
    return 1


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
