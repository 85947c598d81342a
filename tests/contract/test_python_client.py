"""agentvm_client against the real server: a dropped connection mid-stream loses nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from agentvm_client import AgentVMClient
from tests.contract.conftest import Server
from tests.support import wire
from tests.support.stock_client import StockClient


async def test_reconnect_resubscribes_with_after_seq_and_nothing_is_lost_or_doubled(server: Server) -> None:
    async with StockClient(server.url) as watcher:
        await asyncio.sleep(0.05)
        others = server.connection_ids()
        async with AgentVMClient(server.url, min_reconnect_delay=0.05, max_reconnect_delay=0.2) as client:
            client.on("*", wire.check_frame)  # every event it dispatches matches the protocol models
            await asyncio.sleep(0.05)
            (own,) = server.connection_ids() - others
            seen, dropped_at = await stream_and_drop(client, watcher, server, own)
    expected = [e["seq"] for e in watcher.events if "seq" in e and e["type"] != "user_message"]
    assert [e["seq"] for e in seen] == expected  # every event exactly once, in order
    assert dropped_at < len(seen)
    text = "".join(e["data"]["text"] for e in seen if e["type"] == "text_delta")
    assert text == "one two three four five six seven eight"


async def stream_and_drop(client: AgentVMClient, watcher: StockClient, server: Server,
                          own: str) -> tuple[list[dict[str, Any]], int]:
    res = await client.request_ok("image_create", {"containerId": "c1", "config": {"name": "n"}})
    image = res["data"]["record"]
    await watcher.request("image_get_request", {"imageId": image["imageId"]})
    await server.settle()  # the watcher's subscribe is handled
    seen: list[dict[str, Any]] = []
    reconnected, second_delta = asyncio.Event(), asyncio.Event()

    def record(ev: dict[str, Any]) -> None:
        if "seq" in ev:
            seen.append(ev)
        if ev["type"] == "text_delta" and ev["data"]["text"] == "two ":
            second_delta.set()

    client.on("*", record)
    client.on_reconnected(reconnected.set)
    await client.request_ok("message_send", {"imageId": image["imageId"], "content": "slow reply"})
    await asyncio.wait_for(second_delta.wait(), 5)
    dropped_at = len(seen)
    server.drop(own)  # mid-stream
    await asyncio.wait_for(reconnected.wait(), 5)
    await watcher.wait_type("turn_response")
    for _ in range(100):
        if seen and seen[-1]["type"] == "turn_response":
            break
        await asyncio.sleep(0.02)
    return seen, dropped_at


async def test_the_client_asks_for_batched_frames_and_dispatches_the_same_events(server: Server) -> None:
    """The Python client connects with `?frames=batch`: frames holding several events arrive, and what
    it dispatches is what a stock client (one event per frame) gets; `batch_frames=False` gets no batch."""
    async with StockClient(server.url) as watcher:
        for batch in (True, False):
            async with AgentVMClient(server.url, batch_frames=batch) as client:
                client.on("*", wire.check_frame)
                frames: list[str | bytes] = []
                handle = client._handle_frame

                async def spy(ws: Any, raw: str | bytes, handle: Any = handle, frames: list[Any] = frames) -> None:
                    frames.append(raw)
                    await handle(ws, raw)

                client._handle_frame = spy  # type: ignore[method-assign]
                seen: list[dict[str, Any]] = []
                client.on("*", lambda ev, seen=seen: seen.append(ev) if "seq" in ev else None)
                res = await client.request_ok("image_create", {"containerId": f"c-{batch}", "config": {"name": "n"}})
                image = res["data"]["record"]
                start = len(watcher.events)
                await watcher.request("image_get_request", {"imageId": image["imageId"]})
                await server.settle()
                result = await client.send_message(image["imageId"], "hello")
                await watcher.wait_type("turn_response", start=start)
                await server.settle()
                expected = [e for e in watcher.events[start:] if "seq" in e and e["type"] != "user_message"]
                assert seen == expected and result.text
                batches = [f for f in frames if (f if isinstance(f, str) else f.decode()).startswith("[")]
                assert bool(batches) is batch
                assert len(frames) < len(seen) if batch else len(frames) >= len(seen)
