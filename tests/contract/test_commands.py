"""All 17 commands with the behaviour of spec §2 and the fixes of architecture §5."""

from __future__ import annotations

from typing import Any

from tests.contract.conftest import Server
from tests.support.stock_client import StockClient


def data(ev: dict[str, Any]) -> dict[str, Any]:
    return dict(ev["data"])


async def test_container_commands_see_stored_containers(client: StockClient) -> None:
    assert data(await client.request("container_get_request", {"containerId": "u1"})) == {
        "requestId": client.events[-1]["data"]["requestId"], "exists": False}
    start = len(client.events)
    res = await client.request("container_create_request", {"containerId": "u1"})
    assert client.types(start) == ["container_created", "container_create_response"]
    assert data(res)["containerId"] == "u1"
    start = len(client.events)
    await client.request("container_create_request", {"containerId": "u1"})  # idempotent, no event
    assert client.types(start) == ["container_create_response"]
    got = data(await client.request("container_get_request", {"containerId": "u1"}))
    assert got["exists"] is True and got["containerId"] == "u1"
    await client.request("container_create_request", {"containerId": "u2"})
    assert data(await client.request("container_list_request"))["containerIds"] == ["u1", "u2"]


async def test_image_lifecycle_commands(client: StockClient) -> None:
    record = await client.new_image("c1", name="Probe", systemPrompt="be brief", description="d")
    assert record["online"] is False and "agentId" not in record
    assert record["name"] == "Probe" and record["systemPrompt"] == "be brief" and record["description"] == "d"
    assert client.subscribed == [record["sessionId"]]
    iid = record["imageId"]

    run = data(await client.request("image_run_request", {"imageId": iid}))
    assert run["reused"] is False and run["agentId"].startswith("agent_")
    again = data(await client.request("image_run_request", {"imageId": iid}))
    assert again == {**run, "requestId": again["requestId"], "reused": True}

    got = data(await client.request("image_get_request", {"imageId": iid}))
    assert got["record"]["online"] is True and got["record"]["agentId"] == run["agentId"]
    assert got["__subscriptions"] == [record["sessionId"]]

    upd = data(await client.request("image_update_request", {"imageId": iid, "updates": {"name": "Renamed"}}))
    assert upd["record"]["name"] == "Renamed" and upd["record"]["updatedAt"] >= record["updatedAt"]
    assert upd["record"]["systemPrompt"] == "be brief"

    listed = data(await client.request("image_list_request", {"containerId": "c1"}))
    assert [r["imageId"] for r in listed["records"]] == [iid] and listed["__subscriptions"] == [record["sessionId"]]

    agents = data(await client.request("agent_list_request", {"containerId": "c1"}))["agents"]
    assert agents == [{"agentId": run["agentId"], "containerId": "c1", "imageId": iid}]
    ag = data(await client.request("agent_get_request", {"agentId": run["agentId"]}))
    assert ag["exists"] is True and ag["containerId"] == "c1"

    start = len(client.events)
    await client.request("image_stop_request", {"imageId": iid})
    assert client.types(start) == ["session_destroyed", "agent_unregistered", "image_stop_response"]
    assert client.events[start]["data"] == {"sessionId": record["sessionId"], "agentId": run["agentId"],
                                            "containerId": "c1"}
    assert data(await client.request("image_get_request", {"imageId": iid}))["record"]["online"] is False
    assert data(await client.request("agent_get_request", {"agentId": run["agentId"]}))["exists"] is False

    start = len(client.events)
    rerun = data(await client.request("image_run_request", {"imageId": iid}))
    assert client.types(start) == ["agent_registered", "image_run_response"]
    assert rerun["reused"] is False and rerun["agentId"] != run["agentId"]
    assert client.events[start]["data"]["definitionName"] == "Renamed"

    start = len(client.events)
    destroyed = data(await client.request("agent_destroy_request", {"agentId": rerun["agentId"]}))
    assert destroyed["success"] is True
    assert client.types(start) == ["session_destroyed", "agent_unregistered", "agent_destroy_response"]
    unknown = data(await client.request("agent_destroy_request", {"agentId": "agent_nope"}))
    assert unknown["success"] is False and "error" not in unknown

    await client.request("image_run_request", {"imageId": iid})
    start = len(client.events)
    await client.request("agent_destroy_all_request", {"containerId": "c1"})
    assert client.types(start) == ["session_destroyed", "agent_unregistered", "agent_destroy_all_response"]
    assert data(await client.request("agent_list_request", {"containerId": "c1"}))["agents"] == []

    start = len(client.events)
    deleted = data(await client.request("image_delete_request", {"imageId": iid}))
    assert deleted["imageId"] == iid and "error" not in deleted
    assert data(await client.request("image_get_request", {"imageId": iid}))["record"] is None
    msgs = data(await client.request("image_messages_request", {"imageId": iid}))
    assert msgs["error"] == f"Image not found: {iid}" and msgs["messages"] == []


async def test_not_found_is_consistent_and_sends_system_error_first(client: StockClient) -> None:
    for type_, payload, message in [
        ("image_run_request", {"imageId": "img_nope"}, "Image not found: img_nope"),
        ("image_stop_request", {"imageId": "img_nope"}, "Image not found: img_nope"),
        ("image_update_request", {"imageId": "img_nope", "updates": {}}, "Image not found: img_nope"),
        ("image_delete_request", {"imageId": "img_nope"}, "Image not found: img_nope"),  # fix (g)
        ("image_messages_request", {"imageId": "img_nope"}, "Image not found: img_nope"),
        ("message_send_request", {"imageId": "img_nope", "content": "x"}, "Image not found: img_nope"),
        ("message_send_request", {"agentId": "agent_nope", "content": "x"}, "Agent not found: agent_nope"),
        ("message_send_request", {"content": "x"}, "Either imageId or agentId must be provided"),
        ("agent_interrupt_request", {}, "Either imageId or agentId must be provided"),
    ]:
        start = len(client.events)
        res = await client.request(type_, payload)
        assert client.types(start) == ["system_error", type_.replace("_request", "_response")], type_
        err = client.events[start]
        assert err["data"]["message"] == message and err["data"]["requestId"] == res["data"]["requestId"]
        assert "details" not in err["data"] and "sessionId" not in (err.get("context") or {})
        assert res["data"]["error"] == message
    missing = data(await client.request("image_get_request", {"imageId": "img_nope"}))
    assert missing["record"] is None and "error" not in missing and "__subscriptions" not in missing
    send_fail = data(await client.request("message_send_request", {"imageId": "img_nope", "content": "x"}))
    assert send_fail["agentId"] == "" and send_fail["imageId"] == "img_nope"


async def test_history_holds_every_message_once_with_no_ack(server: Server) -> None:
    # fix Q3: messages are stored when produced, even when no client ACKs anything
    async with StockClient(server.url, ack=False) as c:
        image = await c.new_image("c1")
        await c.turn(image["imageId"], "tool turn")
        history = data(await c.request("image_messages_request", {"imageId": image["imageId"]}))["messages"]
    assert [m["subtype"] for m in history] == ["user", "tool-call", "assistant", "tool-result", "assistant"]
    assert history[0]["content"] == "tool turn"
    assert [m["id"] for m in history[1:3]] == [history[1]["id"], "msg_01A"]
    assert history[4]["content"] == [{"type": "text", "text": "Two files."}]


async def test_interrupt_when_idle_is_a_no_op(client: StockClient) -> None:
    image = await client.new_image("c1")
    await client.request("image_run_request", {"imageId": image["imageId"]})
    start = len(client.events)
    res = await client.request("agent_interrupt_request", {"imageId": image["imageId"]})
    assert client.types(start) == ["agent_interrupt_response"]  # fix (f): no `interrupted` when idle
    assert res["data"]["agentId"].startswith("agent_")
