"""A raw WebSocket client that behaves like the stock AgentX client (agentxjs 1.9, spec §1.8):
unwraps `{__msgId, __payload}` and ACKs each wrapper before processing, correlates responses by
`category == "response"` and `data.requestId`, and subscribes to every session named in
`__subscriptions`. It records every frame it receives, in order, for exact assertions, and checks
each against the protocol models (tests/support/wire.py).

`batch=True` makes it the stock client plus the batched-frames extension (docs/protocol.md): it
connects with `?frames=batch` and takes a frame holding a JSON array as its events in order."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support import wire

Event = dict[str, Any]
_req = itertools.count(1)


class StockClient:
    def __init__(self, url: str, *, ack: bool = True, batch: bool = False) -> None:
        self.url = url + ("&" if "?" in url else "?") + "frames=batch" if batch else url
        self.batch = batch
        self.ack = ack
        self.ws: ClientConnection | None = None
        self.events: list[Event] = []  # every unwrapped event, responses included
        self.raw: list[Any] = []  # frames as received (wrappers included)
        self.acks_sent = 0
        self.subscribed: list[str] = []
        self._pending: dict[str, asyncio.Future[Event]] = {}
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    async def __aenter__(self) -> StockClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self, **kwargs: Any) -> None:
        self.ws = await connect(self.url, max_size=None, **kwargs)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for frame in self.ws:
                try:
                    body = json.loads(frame)
                except ValueError:
                    continue
                self.raw.append(body)
                if isinstance(body, list):
                    size = len(frame.encode() if isinstance(frame, str) else frame)
                    if not self.batch or len(body) < 2 or size > 32 * 1024:
                        wire.DRIFT.append(f"batched frame: {len(body)} events in {size} bytes to a client "
                                          f"that {'asked' if self.batch else 'did not ask'} for batches")
                for item in body if isinstance(body, list) else [body]:
                    await self._unwrap(item)
        except Exception:
            pass
        finally:
            self.closed.set()
            self._changed.set()

    async def _unwrap(self, body: Any) -> None:
        assert self.ws is not None
        if isinstance(body, dict) and "__msgId" in body and "__payload" in body:
            wire.check_wrapper(body)
            assert isinstance(body["__payload"], str), "__payload must be a JSON string"
            if self.ack:
                await self.ws.send(json.dumps({"__ack": body["__msgId"]}))
                self.acks_sent += 1
            body = json.loads(body["__payload"])
        self._dispatch(body)

    def _dispatch(self, ev: Event) -> None:
        wire.check_frame(ev)
        self.events.append(ev)
        data = ev.get("data") or {}
        if ev.get("category") == "response":
            fut = self._pending.pop(str(data.get("requestId")), None)
            if fut is not None and not fut.done():
                fut.set_result(ev)
        self._changed.set()

    async def send_raw(self, frame: Any) -> None:
        assert self.ws is not None
        await self.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))

    async def request(self, type_: str, data: dict[str, Any] | None = None, timeout: float = 10.0) -> Event:
        rid = f"req_{int(time.time() * 1000)}_{next(_req)}"
        payload = {**(data or {}), "requestId": rid}
        fut: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        await self.send_raw({"type": type_, "timestamp": int(time.time() * 1000), "data": payload,
                             "source": "command", "category": "request", "intent": "request"})
        ev = await asyncio.wait_for(fut, timeout)
        for sid in ev["data"].get("__subscriptions") or []:
            if sid not in self.subscribed:
                self.subscribed.append(sid)
                await self.send_raw({"type": "subscribe", "sessionId": sid})
        return ev

    async def wait_for(self, pred: Callable[[Event], bool], timeout: float = 10.0, start: int = 0) -> Event:
        deadline = asyncio.get_running_loop().time() + timeout
        idx = start
        while True:
            while idx < len(self.events):
                ev = self.events[idx]
                idx += 1
                if pred(ev):
                    return ev
            if self.closed.is_set():
                raise ConnectionError("connection closed while waiting")
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"no matching event; got {[e.get('type') for e in self.events[start:]]}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def wait_type(self, type_: str, timeout: float = 10.0, start: int = 0) -> Event:
        return await self.wait_for(lambda e: e.get("type") == type_, timeout, start)

    def types(self, start: int = 0, *, session_only: bool = False) -> list[str]:
        return [e["type"] for e in self.events[start:] if not session_only or "seq" in e]

    # conveniences for scenarios
    async def new_image(self, container: str = "c1", **config: Any) -> Event:
        await self.request("container_create_request", {"containerId": container})
        res = await self.request("image_create_request", {"containerId": container, "config": config})
        assert "error" not in res["data"], res
        return dict(res["data"]["record"])

    async def turn(self, image_id: str, content: Any, timeout: float = 10.0) -> list[Event]:
        """Send a message and return the session events of that turn (until turn_response)."""
        start = len(self.events)
        res = await self.request("message_send_request", {"imageId": image_id, "content": content})
        assert "error" not in res["data"], res["data"]
        await self.wait_for(lambda e: e.get("type") == "turn_response"
                            and (e.get("context") or {}).get("imageId") == image_id, timeout, start)
        return [e for e in self.events[start:] if (e.get("context") or {}).get("imageId") == image_id
                and "seq" in e]
