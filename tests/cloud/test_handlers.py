"""Lambda handlers fed API Gateway events, against DynamoDB on moto."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentvm import __version__
from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import ApiKey, ConnectionRecord, Subscription
from tests.support.cloud_edge import load_handler
from tests.support.moto_posts import posted_frames

ROOT = Path(__file__).resolve().parents[2]
EVENTS = Path(__file__).parent / "events"


def event(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / f"{name}.json").read_text()))


def test_disconnect_removes_the_connection_and_everything_it_subscribed(cloud: cloud_runtime.CloudRuntime) -> None:
    conn = event("ws_disconnect")["requestContext"]["connectionId"]
    reg = cloud.registry
    cloud_runtime.run(reg.put_connection(ConnectionRecord(conn, "t1", "key_1", 1)))
    cloud_runtime.run(reg.put_subscription("t1", "sess_1", Subscription(conn)))
    cloud_runtime.run(reg.put_subscription("t1", "sess_1", Subscription("other")))
    cloud_runtime.run(reg.watch("t1", "user-1", conn))

    assert load_handler("ws_disconnect").handler(event("ws_disconnect"), None) == {"statusCode": 200}

    assert cloud_runtime.run(reg.get_connection(conn)) is None
    assert [s.connection_id for s in cloud_runtime.run(reg.subscribers("t1", "sess_1"))] == ["other"]
    assert cloud_runtime.run(reg.watchers("t1", "user-1")) == []
    # a second $disconnect (API Gateway may repeat it) is harmless
    assert load_handler("ws_disconnect").handler(event("ws_disconnect"), None) == {"statusCode": 200}


def test_http_api_serves_health() -> None:
    response = load_handler("http_api").handler(event("http_health"), None)
    assert response["statusCode"] == 200
    assert json.loads(response["body"]) == {"status": "ok", "version": __version__}


def test_the_runtime_refuses_to_start_without_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AVM_TABLE_NAME", raising=False)
    cloud_runtime.reset()
    with pytest.raises(Exception, match="AVM_TABLE_NAME is not set"):
        cloud_runtime.runtime()
    cloud_runtime.reset()


# ---- $connect ------------------------------------------------------------------------------------


def connect_event(token: str | None, *, header: bool = False) -> dict[str, Any]:
    e = event("ws_connect")
    e.pop("queryStringParameters")
    e.pop("multiValueQueryStringParameters")
    if token is not None and header:
        e["headers"]["Authorization"] = f"Bearer {token}"
    elif token is not None:
        e["queryStringParameters"] = {"token": token}
        e["multiValueQueryStringParameters"] = {"token": [token]}
    return e


@pytest.fixture
def api_key(cloud: cloud_runtime.CloudRuntime) -> tuple[ApiKey, str]:
    key, token = new_key("tenant-a")
    cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(key))
    return key, token


@pytest.mark.parametrize("header", [False, True], ids=["query", "header"])
def test_connect_records_the_principal_for_a_valid_key(cloud: cloud_runtime.CloudRuntime,
                                                       api_key: tuple[ApiKey, str], header: bool) -> None:
    key, token = api_key
    before = time.time()
    assert load_handler("ws_connect").handler(connect_event(token, header=header), None) == {"statusCode": 200}
    conn = event("ws_connect")["requestContext"]["connectionId"]
    record = cloud_runtime.run(cloud.registry.get_connection(conn))
    assert record is not None and (record.tenant_id, record.key_id) == ("tenant-a", key.key_id)
    item = cloud_runtime.run(cloud.store.client.get_item(
        TableName=cloud.store.table_name, Key={"PK": {"S": f"WSCONN#{conn}"}, "SK": {"S": "CONN"}}))["Item"]
    # the record outlives API Gateway's 2-hour connection cap by a little, then expires on its own
    assert before + 2 * 3600 < int(item["expires_at"]["N"]) <= time.time() + 2 * 3600 + 900


def test_connect_refuses_wrong_and_revoked_keys_and_holds_a_keyless_one_for_its_auth_frame(
        cloud: cloud_runtime.CloudRuntime, api_key: tuple[ApiKey, str]) -> None:
    key, token = api_key
    handler = load_handler("ws_connect").handler
    wrong = handler(connect_event(token[:-4] + "AAAA"), None)
    assert wrong == {"statusCode": 401, "body": "API key not valid"}
    assert handler(connect_event("not-a-key"), None) == {"statusCode": 401, "body": "API key not valid"}
    cloud_runtime.run(DynamoDBKeys(cloud.store).revoke_key("tenant-a", key.key_id, 1))
    cloud.authenticator.invalidate(key.key_id)
    revoked = handler(connect_event(token), None)
    assert revoked["statusCode"] == 401 and "revoked" in revoked["body"]
    conn = event("ws_connect")["requestContext"]["connectionId"]
    assert cloud_runtime.run(cloud.registry.get_connection(conn)) is None
    assert token not in json.dumps([wrong, revoked])
    # no credentials at all (a browser): accepted, not authenticated until its `auth` frame
    # (tests/cloud/test_auth_frame.py)
    assert handler(connect_event(None), None) == {"statusCode": 200}
    record = cloud_runtime.run(cloud.registry.get_connection(conn))
    assert record is not None and not record.authenticated and record.tenant_id == ""


def test_a_frame_from_an_unknown_connection_is_answered_with_an_error(cloud: cloud_runtime.CloudRuntime) -> None:
    e = event("ws_default")
    e["requestContext"]["connectionId"] = conn = f"gone{uuid.uuid4().hex[:8]}="
    e["body"] = json.dumps({"type": "container_list_request", "data": {"requestId": "r1"}})
    assert load_handler("ws_default").handler(e, None) == {"statusCode": 200}
    [frame] = posted_frames(conn)
    assert frame["type"] == "system_error"
    assert frame["data"]["code"] == "unauthorized"
    assert "reconnect with your API key" in frame["data"]["message"]


def test_chat_turn_drops_a_malformed_payload_without_raising(cloud: cloud_runtime.CloudRuntime) -> None:
    handler = load_handler("chat_turn").handler
    assert handler({"tenantId": "t"}, None) == {"ran": 0, "error": "invalid_payload"}
    assert handler({"tenantId": 1, "sessionId": ""}, None) == {"ran": 0, "error": "invalid_payload"}
    # a session that does not exist: nothing to run, nothing written
    assert handler({"tenantId": "t", "sessionId": "nope"}, None) == {"ran": 0}


def test_avm_keys_create_issues_a_key_that_connect_accepts(cloud: cloud_runtime.CloudRuntime,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from avm.cli import main

    assert main(["keys", "create", "--table", cloud.store.table_name, "--tenant", "acme", "--name", "ci"]) == 0
    out = capsys.readouterr().out
    token = out.split("token (shown once, keep it secret): ")[1].split()[0]
    assert load_handler("ws_connect").handler(connect_event(token), None) == {"statusCode": 200}
    conn = event("ws_connect")["requestContext"]["connectionId"]
    record = cloud_runtime.run(cloud.registry.get_connection(conn))
    assert record is not None and record.tenant_id == "acme"
    [key] = cloud_runtime.run(DynamoDBKeys(cloud.store).list_keys("acme"))
    assert key.name == "ci" and key.scopes == ("user",) and token not in repr(key)


def test_http_api_manages_a_tenants_keys_with_an_admin_key(cloud: cloud_runtime.CloudRuntime) -> None:
    keys = DynamoDBKeys(cloud.store)
    admin_key, admin = new_key("acme", ("admin",))
    user_key, user = new_key("acme")
    other_key, other = new_key("bob", ("admin",))
    for record in (admin_key, user_key, other_key):
        cloud_runtime.run(keys.put_key(record))
    api = load_handler("http_api")

    def call(method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        response = api.handler(http_event(method, path, token=token, body=body), None)
        return response["statusCode"], json.loads(response["body"]) if response.get("body") else None

    status, created = call("POST", "/v1/auth/keys", admin, {"scopes": ["user"], "name": "app"})
    assert status == 201 and created["tenantId"] == "acme" and created["token"].startswith(created["keyId"])
    status, listed = call("GET", "/v1/auth/keys", admin)
    assert sorted(k["keyId"] for k in listed["items"]) == sorted([admin_key.key_id, user_key.key_id,
                                                                  created["keyId"]])
    assert call("POST", "/v1/auth/keys", user, {})[0] == 403
    assert call("DELETE", f"/v1/auth/keys/{created['keyId']}", other)[0] == 404  # bob's admin: not acme's key
    assert call("DELETE", f"/v1/auth/keys/{created['keyId']}", admin)[0] == 204
    assert call("GET", "/v1/auth/keys", created["token"])[0] == 401


def http_event(method: str, path: str, *, token: str | None = None, body: Any = None,
               query: str = "") -> dict[str, Any]:
    ev = event("http_health")
    ev["rawPath"], ev["rawQueryString"] = path, query
    ev["requestContext"]["http"].update({"method": method, "path": path})
    headers = {**ev["headers"], "content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    ev["headers"] = headers
    if body is not None:
        ev["body"] = json.dumps(body)
    return ev


def test_http_api_serves_the_resource_center_per_tenant(cloud: cloud_runtime.CloudRuntime) -> None:
    keys = DynamoDBKeys(cloud.store)
    alice_key, alice = new_key("alice")
    bob_key, bob = new_key("bob")
    cloud_runtime.run(keys.put_key(alice_key))
    cloud_runtime.run(keys.put_key(bob_key))
    api = load_handler("http_api")

    def call(method: str, path: str, token: str | None, body: Any = None, query: str = "") -> tuple[int, Any]:
        response = api.handler(http_event(method, path, token=token, body=body, query=query), None)
        return response["statusCode"], json.loads(response["body"]) if response.get("body") else None

    status, created = call("POST", "/v1/resources", alice, {"kind": "prompt", "name": "greeting", "version": "1.0.0",
                                                             "content": {"text": "Hi"}})
    assert status == 201, created
    status, _ = call("PUT", f"/v1/resources/{created['resourceId']}", alice,
                     {"version": "1.1.0", "content": {"text": "Hello"}})
    assert status == 201
    query = urllib.parse.urlencode({"uri": "resource://prompts/greeting@^1"})
    status, resolved = call("GET", "/v1/resources/resolve", alice, query=query)
    assert (status, resolved["resolved"]) == (200, "resource://prompts/greeting@1.1.0")
    # bob sees nothing of alice's private resource: not found, exactly as an id that does not exist
    rid = created["resourceId"]
    assert call("GET", f"/v1/resources/{rid}", bob) == (404, {"error": {
        "code": "not_found", "message": f"Resource not found: {rid}", "field": "resourceId"}})
    assert call("GET", "/v1/resources/res_nope", bob)[1]["error"]["message"] == "Resource not found: res_nope"
    assert call("GET", "/v1/resources", bob) == (200, {"items": [], "nextCursor": None})
    assert call("DELETE", f"/v1/resources/{created['resourceId']}", bob)[0] == 404
    # no key, a bad key: 401 in the one error shape
    status, body = call("GET", "/v1/resources", None)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert call("GET", "/v1/resources", "avmk_nope.nope")[0] == 401
    status, body = call("GET", "/v1/resources", alice)
    assert [i["version"] for i in body["items"]] == ["1.1.0"]


def test_http_api_config_needs_an_operator_key_and_lives_in_ssm(cloud: cloud_runtime.CloudRuntime,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cloud.settings, "config_path", f"/agentvm/test-{uuid.uuid4().hex[:8]}/")
    keys = DynamoDBKeys(cloud.store)
    admin_key, admin = new_key("ops", ("operator",))
    user_key, user = new_key("alice")
    tenant_admin_key, tenant_admin = new_key("alice", ("admin",))
    for key in (admin_key, user_key, tenant_admin_key):
        cloud_runtime.run(keys.put_key(key))
    api = load_handler("http_api")

    def call(method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        response = api.handler(http_event(method, path, token=token, body=body), None)
        return response["statusCode"], json.loads(response["body"])

    for token in (user, tenant_admin):  # the deployment's configuration: no tenant's key, admin or not
        status, body = call("PUT", "/v1/config/llm.model", token, {"value": "claude-haiku-4-5"})
        assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = call("PUT", "/v1/config/llm.model", admin, {"value": "claude-haiku-4-5"})
    assert (status, body["source"], body["value"]) == (200, "runtime", "claude-haiku-4-5")
    status, body = call("PUT", "/v1/config/llm.apiKey", admin, {"value": "sk-ant-cloud-secret"})
    assert status == 200 and "sk-ant-cloud-secret" not in json.dumps(body)
    status, body = call("GET", "/v1/config", admin)
    assert status == 200 and "sk-ant-cloud-secret" not in json.dumps(body)
    assert body["values"]["llm.model"]["layers"]["runtime"] == "claude-haiku-4-5"
    # the next turn's options come from there (the chat_turn path reads the same config center)
    options = cloud_runtime.run(cloud.config.engine_options(cloud.options(None))) if cloud.config else None
    assert options is not None and options.default_model == "claude-haiku-4-5"
    assert call("PUT", "/v1/config/llm.maxTokens", admin, {"value": -1})[0] == 400
