"""The baseline of `make bench`: a bare `websockets` asyncio server (on uvloop, like `avm serve`)
that answers each request frame with pre-encoded frames captured from AgentVM in the same run.

It does the least a server can do for the same wire traffic: parse each inbound frame (requests
and ACKs alike), look the reply up by request type, splice the requestId into it (the capture used
a placeholder of the same width) and send the frames. No storage, no models, no fan-out.

    python -m tests.bench.baseline_server --port P --plan plan.json

plan.json: {"placeholder": "R99999999", "replies": {"<type>_request": ["<frame>", ...], ...}}
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import orjson
import uvloop
from websockets.asyncio.server import ServerConnection, serve

Reply = list[tuple[str, bool]]  # (frame, contains the placeholder)


def load_plan(path: Path) -> tuple[str, dict[str, Reply]]:
    plan = orjson.loads(path.read_bytes())
    placeholder: str = plan["placeholder"]
    replies = {t: [(f, placeholder in f) for f in frames] for t, frames in plan["replies"].items()}
    return placeholder, replies


async def main(port: int, plan_path: Path) -> int:
    placeholder, replies = load_plan(plan_path)

    async def handler(ws: ServerConnection) -> None:
        async for msg in ws:
            body = orjson.loads(msg)
            reply = replies.get(body.get("type", ""))
            if reply is None:
                continue  # an ACK (or anything else): parsed and dropped, like AgentVM does
            request_id = str(body["data"]["requestId"])
            for frame, templated in reply:
                await ws.send(frame.replace(placeholder, request_id) if templated else frame)

    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    async with serve(handler, "127.0.0.1", port, compression=None, max_size=None, ping_interval=None,
                     backlog=1024):
        print("ready", flush=True)
        await stop
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--plan", type=Path, required=True)
    args = parser.parse_args()
    sys.exit(uvloop.run(main(args.port, args.plan)))
