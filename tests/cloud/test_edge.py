"""Self-tests of the emulated API Gateway edge (tests/support/cloud_edge.py), with throwaway handlers."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends
from moto.core.models import DEFAULT_ACCOUNT_ID
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentvm.adapters.aws.botocore_async import dummy_session
from tests.support.cloud_edge import MAX_MESSAGE_BYTES, CloudEdge, HandlerFailed, cloud_edge

HANDLERS = {
    # $connect: a token check in miniature
    "connect.py": """
        def handler(event, context):
            token = (event.get("queryStringParameters") or {}).get("token")
            if token != "good":
                return {"statusCode": 401, "body": "Unauthorized"}
            return {"statusCode": 200}
    """,
    # $default: answers by posting through botocore to moto, like the real handlers
    "default.py": """
        import json, os, threading, time, uuid
        import botocore.session

        _client = None  # one client per execution environment

        def post(connection_id, frame):
            global _client
            if _client is None:
                _client = botocore.session.get_session().create_client(
                    "apigatewaymanagementapi", endpoint_url=os.environ["AVM_WS_ENDPOINT"],
                    region_name=os.environ["AWS_REGION"])
            _client.post_to_connection(ConnectionId=connection_id, Data=json.dumps(frame).encode())

        def handler(event, context):
            ctx = event["requestContext"]
            cid = ctx["connectionId"]
            body = event["body"]
            if event["isBase64Encoded"]:
                post(cid, {"binary": body})
                return {"statusCode": 200}
            cmd = json.loads(body)
            if cmd["op"] == "echo":
                post(cid, {"echo": cmd, "route": ctx["routeKey"], "eventType": ctx["eventType"]})
            elif cmd["op"] == "burst":
                for i in range(cmd["n"]):
                    post(cid, {"i": i})
            elif cmd["op"] == "sleep":
                started = time.time()
                time.sleep(cmd["s"])
                post(cid, {"slept": cmd["id"], "from": started, "to": time.time()})
            elif cmd["op"] == "invoke":
                client = botocore.session.get_session().create_client(
                    "lambda", endpoint_url=os.environ["AVM_LAMBDA_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"])
                res = client.invoke(FunctionName="agentvm-chat-turn:live", InvocationType="Event",
                                    Payload=json.dumps({"connectionId": cid, "n": cmd["n"]}).encode())
                post(cid, {"invoked": res["StatusCode"]})
            elif cmd["op"] == "runtime":
                from agentvm.cloud.runtime import runtime
                rt = runtime()
                tag = rt.__dict__.setdefault("edge_test_tag", uuid.uuid4().hex)
                post(cid, {"runtime": tag, "thread": threading.current_thread().name})
            elif cmd["op"] == "fail":
                raise RuntimeError("the handler broke on purpose")
            return {"statusCode": 200}
    """,
    "disconnect.py": """
        def handler(event, context):
            return {"statusCode": 200}
    """,
    # the async-invoked function
    "chat_turn.py": """
        import json, os
        import botocore.session

        def handler(event, context):
            client = botocore.session.get_session().create_client(
                "apigatewaymanagementapi", endpoint_url=os.environ["AVM_WS_ENDPOINT"],
                region_name=os.environ["AWS_REGION"])
            for i in range(event["n"]):
                client.post_to_connection(ConnectionId=event["connectionId"],
                                          Data=json.dumps({"turn": i, "left": context.get_remaining_time_in_millis()}))
    """,
}


@pytest.fixture
def handlers(tmp_path: Path) -> Path:
    for name, code in HANDLERS.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    return tmp_path


@pytest.fixture
async def edge(handlers: Path, aws_env: None, moto_endpoint: str,
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CloudEdge]:
    async with cloud_edge(moto_endpoint=moto_endpoint, token="good",
                          routes={"$connect": handlers / "connect.py", "$default": handlers / "default.py",
                                  "$disconnect": handlers / "disconnect.py"},
                          functions={"agentvm-chat-turn": handlers / "chat_turn.py"}) as e:
        for name, value in e.handler_env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AVM_TABLE_NAME", "edge-self-test")  # the runtime is built, never used
        yield e


async def recv(ws: ClientConnection, timeout: float = 5.0) -> Any:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def only_connection(edge: CloudEdge) -> str:
    (cid,) = edge.connection_ids()
    return cid


async def test_connect_is_refused_with_the_handlers_status(edge: CloudEdge) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(edge.url.replace("token=good", "token=bad")):
            pass
    assert info.value.response.status_code == 401
    assert info.value.response.body == b"Unauthorized"
    ((fn, event),) = edge.invocations  # no $disconnect for a refused upgrade
    assert fn == "connect"
    ctx = event["requestContext"]
    assert (ctx["routeKey"], ctx["eventType"], ctx["messageDirection"], ctx["stage"]) == (
        "$connect", "CONNECT", "IN", "prod")
    assert ctx["domainName"] == f"{ctx['apiId']}.execute-api.us-east-1.amazonaws.com"
    assert len(ctx["connectionId"]) == 16 and ctx["connectionId"].endswith("=")
    assert event["queryStringParameters"] == {"token": "bad"}
    assert event["multiValueQueryStringParameters"] == {"token": ["bad"]}
    assert event["headers"]["Host"] == ctx["domainName"] and event["headers"]["Sec-WebSocket-Version"] == "13"
    assert event["multiValueHeaders"]["Host"] == [ctx["domainName"]]
    assert edge.connection_ids() == set()


async def test_frames_become_default_events_and_posts_come_back_in_order(edge: CloudEdge) -> None:
    async with connect(edge.url) as ws:
        cid = only_connection(edge)
        await ws.send(json.dumps({"op": "echo", "x": 1}))
        assert await recv(ws) == {"echo": {"op": "echo", "x": 1}, "route": "$default", "eventType": "MESSAGE"}
        await ws.send(b"\x00\x01binary")
        assert await recv(ws) == {"binary": "AAFiaW5hcnk="}
        await ws.send(json.dumps({"op": "burst", "n": 60}))
        assert [await recv(ws) for _ in range(60)] == [{"i": i} for i in range(60)]
        posted = edge.frames_posted(cid)
    assert posted[2:] == [{"i": i} for i in range(60)] and len(posted) == 62
    default = edge.calls("default")
    assert [e["isBase64Encoded"] for e in default] == [False, True, False]
    assert {e["requestContext"]["connectionId"] for e in default} == {cid}
    assert len({e["requestContext"]["messageId"] for e in default}) == 3
    (disconnect,) = edge.calls("disconnect")
    ctx = disconnect["requestContext"]
    assert (ctx["routeKey"], ctx["eventType"], ctx["connectionId"]) == ("$disconnect", "DISCONNECT", cid)
    assert ctx["disconnectStatusCode"] == 1000 and ctx["disconnectReason"]


async def test_frames_of_one_connection_are_handled_concurrently(edge: CloudEdge) -> None:
    async with connect(edge.url) as ws:
        for i in range(4):
            await ws.send(json.dumps({"op": "sleep", "s": 0.3, "id": i}))
        got = [await recv(ws) for _ in range(4)]
    assert sorted(g["slept"] for g in got) == [0, 1, 2, 3]
    # the four invocations ran side by side: each started before any of them ended
    assert max(g["from"] for g in got) < min(g["to"] for g in got)


async def test_posting_to_a_closed_or_unknown_connection_is_gone(edge: CloudEdge) -> None:
    client: Any = dummy_session().create_client("apigatewaymanagementapi", endpoint_url=edge.ws_endpoint)
    async with connect(edge.url) as ws:
        cid = only_connection(edge)
        info = await asyncio.to_thread(client.get_connection, ConnectionId=cid)
        assert info["Identity"]["SourceIp"] == "127.0.0.1" and info["Identity"]["UserAgent"].startswith("Python")
        with pytest.raises(ClientError) as too_big:
            await asyncio.to_thread(client.post_to_connection, ConnectionId=cid, Data=b"x" * (MAX_MESSAGE_BYTES + 1))
        assert too_big.value.response["Error"]["Code"] == "PayloadTooLargeException"
        await asyncio.to_thread(client.post_to_connection, ConnectionId=cid, Data=b'{"direct":1}')
        assert await recv(ws) == {"direct": 1}
    for target in (cid, "NotAConnection="):
        for call in (lambda t=target: client.post_to_connection(ConnectionId=t, Data=b"{}"),
                     lambda t=target: client.get_connection(ConnectionId=t)):
            with pytest.raises(ClientError) as gone:
                await asyncio.to_thread(call)
            assert gone.value.response["Error"]["Code"] == "GoneException"
            assert gone.value.response["ResponseMetadata"]["HTTPStatusCode"] == 410
    assert edge.frames_posted(cid) == [{"direct": 1}]


async def test_delete_connection_closes_the_socket(edge: CloudEdge) -> None:
    client: Any = dummy_session().create_client("apigatewaymanagementapi", endpoint_url=edge.ws_endpoint)
    async with connect(edge.url) as ws:
        cid = only_connection(edge)
        await asyncio.to_thread(client.delete_connection, ConnectionId=cid)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
    for _ in range(100):
        if edge.calls("disconnect"):
            break
        await asyncio.sleep(0.02)
    assert edge.calls("disconnect")[0]["requestContext"]["connectionId"] == cid


async def test_async_invoke_answers_202_and_runs_the_function(edge: CloudEdge) -> None:
    async with connect(edge.url) as ws:
        cid = only_connection(edge)
        await ws.send(json.dumps({"op": "invoke", "n": 3}))
        frames = [await recv(ws) for _ in range(4)]
    assert {"invoked": 202} in frames
    turns = [f for f in frames if "turn" in f]
    assert [f["turn"] for f in turns] == [0, 1, 2]
    assert all(800_000 < f["left"] <= 900_000 for f in turns)  # chat_turn's 900 s timeout
    assert edge.calls("chat_turn") == [{"connectionId": cid, "n": 3}]


async def test_restart_retires_the_warm_environments_but_keeps_the_connection(edge: CloudEdge) -> None:
    async with connect(edge.url) as ws:
        await ws.send(json.dumps({"op": "runtime"}))
        first = await recv(ws)
        await edge.settle()  # the environment is busy until the handler returns
        await ws.send(json.dumps({"op": "runtime"}))
        assert await recv(ws) == first  # a warm environment: same runtime, same thread
        edge.restart()
        await ws.send(json.dumps({"op": "runtime"}))
        after = await recv(ws)
        assert after["runtime"] != first["runtime"] and after["thread"] != first["thread"]


async def test_an_oversize_message_closes_the_connection_with_1009(edge: CloudEdge) -> None:
    async with connect(edge.url, max_size=None) as ws:
        cid = only_connection(edge)
        await ws.send(json.dumps({"op": "echo", "pad": "x" * MAX_MESSAGE_BYTES}))
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 5)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    for _ in range(100):
        if edge.calls("disconnect"):
            break
        await asyncio.sleep(0.02)
    assert edge.calls("disconnect")[0]["requestContext"]["disconnectStatusCode"] == 1009
    assert edge.closed_connections[cid][0] == 1009
    assert edge.calls("default") == []


async def test_a_handler_exception_reaches_the_client_and_fails_the_test(
        handlers: Path, aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HandlerFailed, match="the handler broke on purpose"):
        async with cloud_edge(moto_endpoint=moto_endpoint, routes={"$default": handlers / "default.py"}) as e:
            for name, value in e.handler_env().items():
                monkeypatch.setenv(name, value)
            async with connect(e.url) as ws:
                await ws.send(json.dumps({"op": "fail"}))
                answer = await recv(ws)
                assert answer["message"] == "Internal server error"
                assert answer["connectionId"] in e.connection_ids() and answer["requestId"]
    assert len(e.errors) == 1 and "RuntimeError" in e.errors[0].error
    # the edge's patches of moto's backend are gone once no edge runs
    backend = apigatewaymanagementapi_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    assert not {"post_to_connection", "get_connection", "delete_connection"} & set(vars(backend))


async def test_unknown_functions_are_not_found(edge: CloudEdge) -> None:
    client: Any = dummy_session().create_client("lambda", endpoint_url=edge.lambda_endpoint)
    with pytest.raises(ClientError) as info:
        await asyncio.to_thread(client.invoke, FunctionName="nope", InvocationType="Event", Payload=b"{}")
    assert info.value.response["Error"]["Code"] == "ResourceNotFoundException"
