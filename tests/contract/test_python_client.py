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
