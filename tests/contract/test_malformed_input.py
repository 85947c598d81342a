"""Bad input never kills the server or another connection; requests get an error naming the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentvm.protocol.refused import DEEP_SCAN_MAX
from tests.contract.conftest import Server
from tests.support.servers import in_process
from tests.support.stock_client import StockClient


async def error_for(client: StockClient, type_: str, data: dict[str, object]) -> str:
    res = await client.request(type_, data)
    err = res["data"].get("error")
    assert isinstance(err, str) and err, res
    return err


@pytest.mark.parametrize(("type_", "data", "message"), [
    ("message_send_request", {"imageId": "img_x"}, "message_send_request: data.content: is required"),
    ("message_send_request", {"imageId": "img_x", "content": "   "},
     "message_send_request: data.content: must not be empty"),
    ("message_send_request", {"imageId": "img_x", "content": []},
     "message_send_request: data.content: must contain at least one part"),
    ("message_send_request", {"imageId": "img_x", "content": [{"type": "video", "data": "x"}]},
     "message_send_request: data.content[0]: type 'video' is not one of 'text', 'image', 'file'"),
    ("message_send_request", {"imageId": 42, "content": "hi"},
     "message_send_request: data.imageId: must be a string"),
    ("container_create_request", {}, "container_create_request: data.containerId: is required"),
    ("container_create_request", {"containerId": 5},
     "container_create_request: data.containerId: must be a string"),
    ("container_create_request", {"containerId": "../etc"},
     "container_create_request: data.containerId: must match the pattern ^[A-Za-z0-9][A-Za-z0-9._:@-]*$"),
    ("image_create_request", {"containerId": "c1"}, "image_create_request: data.config: is required"),
    ("image_create_request", {"containerId": "c1", "config": {"name": ["x"]}},
     "image_create_request: data.config.name: must be a string"),
    ("image_update_request", {"imageId": "img_x", "updates": "rename"},
     "image_update_request: data.updates: must be a JSON object"),
    ("agent_list_request", {}, "agent_list_request: data.containerId: is required"),
    ("teleport_request", {}, "Unknown request type: teleport_request"),
])
async def test_invalid_requests_get_an_error_naming_the_field(client: StockClient, type_: str,
                                                              data: dict[str, object], message: str) -> None:
    start = len(client.events)
    assert await error_for(client, type_, data) == message
    assert client.types(start) == ["system_error", type_.replace("_request", "_response")]
    assert client.events[-1]["data"]["errorCode"] == "invalid_request"


async def test_frames_that_cannot_be_answered_do_not_break_the_connection(server: Server) -> None:
    async with StockClient(server.url) as c, StockClient(server.url) as other:
        for frame in ["{not json", "[1,2,3]", "42", '"str"', "", "null", json.dumps({"__ack": "unknown"})]:
            await c.send_raw(frame)
        await c.send_raw(b'{"type":"container_list_request","data":{"requestId":"bin1"}}')  # binary frame
        await c.wait_for(lambda e: e["data"].get("requestId") == "bin1")
        start = len(c.events)
        await c.send_raw({"type": "message_send_request", "data": {"content": "no id"}})
        await c.send_raw({"type": "message_send_request", "data": "nope"})
        await c.send_raw({"type": "made_up_event", "data": {"secret": "x"}})
        await c.send_raw({"type": "auth", "headers": {"Authorization": "Bearer sk-secret"}})
        await c.send_raw({"type": "subscribe", "sessionId": "sess_nope"})
        await c.send_raw({"type": "subscribe", "sessionId": 7})
        await c.send_raw({"type": "subscribe", "sessionId": "sess_nope", "afterSeq": -1})
        # frames are handled concurrently (spec §2.1), so the answers may come in any order, and
        # after the answer to a later request
        await c.wait_for(lambda _: sum(e["type"] == "system_error" for e in c.events[start:]) >= 6)
        await c.request("container_list_request")
        messages = sorted(e["data"]["message"] for e in c.events[start:] if e["type"] == "system_error")
        assert messages == sorted([
            "message_send_request: data.requestId: is required",
            "message_send_request: data: must be an object",
            "Unsupported frame 'made_up_event': send *_request commands, subscribe, auth or ACK frames",
            "Session not found: sess_nope",
            "subscribe: sessionId: must be a non-empty string",
            "subscribe: afterSeq: must be a non-negative integer",
        ])
        await asyncio.sleep(0.05)
        # nothing a client sends is ever echoed to another connection
        assert other.events == []
        assert "sk-secret" not in json.dumps(c.events)


async def test_frames_nested_too_deep_are_answered_and_name_the_limit(server: Server) -> None:
    """orjson reads 1024 levels; deeper frames are read by a scanner up to DEEP_SCAN_MAX characters.
    A request that deep gets its error response; a frame too large to scan, whose requestId is thus
    unknown, a system_error naming both limits; the connection stays up."""
    deep = "[" * 2000 + "]" * 2000
    scanned = '{"type":"image_get_request","data":{"imageId":' + deep + ',"requestId":"deep1"}}'
    no_id = '{"type":"image_get_request","data":{"imageId":' + deep + "}}"
    big = '{"type":"image_get_request","data":{"imageId":' + "[" * 10_000 + "]" * 10_000 + ',"requestId":"deep2"}}'
    assert len(scanned) < DEEP_SCAN_MAX < len(big) < 64 * 1024  # under API Gateway's frame limit too
    async with StockClient(server.url) as c:
        for frame in (scanned, no_id, big):
            await c.send_raw(frame)
        await c.wait_for(lambda _: sum(e["type"] == "system_error" for e in c.events) >= 3
                         and any(e["type"] == "image_get_response" for e in c.events))
        res = next(e for e in c.events if e["type"] == "image_get_response")
        assert res["data"]["requestId"] == "deep1"
        assert res["data"]["error"] == "image_get_request: frame: nests deeper than 1024 levels"
        assert res["data"]["errorCode"] == "invalid_request"
        errors = sorted((e["data"].get("requestId", ""), e["data"]["message"], e["data"]["code"])
                        for e in c.events if e["type"] == "system_error")
        assert errors == [
            ("", "frame: nests deeper than 1024 levels; a frame that deep is read only up to 16384 characters "
                 f"and this one has {len(big)}, so it was not read (no response: its requestId is unknown)",
             "invalid_request"),
            ("", "image_get_request: frame: nests deeper than 1024 levels", "invalid_request"),
            ("deep1", "image_get_request: frame: nests deeper than 1024 levels", "invalid_request"),
        ]
        res = await c.request("container_list_request")  # the connection is still up
        assert "error" not in res["data"], res
        assert [e for e in c.events if e["type"] == "image_get_response"
                and e["data"]["requestId"] == "deep2"] == []


@pytest.mark.local_only("the limit is avm serve's max_frame_bytes; API Gateway's 128 KB is tests/cloud/test_edge.py's")
async def test_oversize_frame_closes_only_that_connection_with_a_reason(tmp_path: Path) -> None:
    async with in_process(tmp_path / "d", max_frame_bytes=64 * 1024) as srv, StockClient(srv.url) as other:
        async with connect(srv.url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "message_send_request",
                                      "data": {"requestId": "big", "imageId": "x", "content": "a" * 70_000}}))
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 5)
        close = info.value.rcvd
        assert close is not None and close.code == 1009
        assert "65536" in close.reason and "exceed" in close.reason
        res = await other.request("container_list_request")
        assert res["data"]["containerIds"] == []
