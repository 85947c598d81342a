"""Point 10 of issue 15: a container task holds only its tenant's rights.

The worker task (`python -m agentvm.worker`) runs untrusted tool code. It must sign every request
with the tenant role's credentials (assumed with the tenant's session tag and a session policy),
never with the task role's, and those credentials must reach nothing of another tenant.

What is proven how:

* On moto (server mode, every request seen as it arrives): the worker of tenant A runs a real tool
  turn; every request it signs carries the access key AssumeRole returned, except the AssumeRole
  itself (the task role's key), which carries the tenant tag and the session policy.
* moto does not evaluate IAM conditions, so the same run records every API call the worker made
  (operation and parameters, client side) and `tests/support/iam_policy.py` evaluates each against
  the template's TenantWorkerRole policy plus the session policy the worker actually sent: all are
  allowed for tenant A; the same calls rewritten to tenant B's keys and prefixes are all denied.
* Hand-written attacks a tool holding the tenant credentials could try (Scan, another tenant's GSI
  partition, connection records, listing the bucket, assuming the role for another tenant).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs

import pytest

from agentvm.adapters.aws import tenant_scope as ts
from agentvm.adapters.aws.ecs_tasks import EcsContainerTier
from agentvm.config import Settings
from agentvm.sandbox.runtime import tool_env
from agentvm.worker.__main__ import serve
from tests.aws_fixtures import _OneAtATime, signed_by
from tests.cloud.test_container_tier import TENANT, TENANT_ROLE_ARN, Cloud, cloud, data, run_worker
from tests.support.iam_policy import ACCOUNT, REGION, Principal, allowed, authorizations, trusts
from tests.support.stock_client import StockClient
from tests.template.test_template import _resource

__all__ = ["cloud", "data"]  # fixtures of the container-tier test, reused

OTHER = "tenant-b"
STACK = "avm-test"
TASK_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/{STACK}-WorkerTaskRole"
TASK_ROLE_SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/{STACK}-WorkerTaskRole/task-1"
SECRET_ARN = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:agentvm/llm-AbCdEf"


# ------------------------------------------------------------------------------ template policies

def _resolve(value: Any, refs: Mapping[str, str]) -> Any:
    """CloudFormation intrinsics of the policies in template.yaml, with `refs` for Ref/GetAtt/Sub names
    (every condition true). `${!x}` in Fn::Sub is the literal `${x}`, as CloudFormation renders it."""
    if isinstance(value, list):
        return [r for r in (_resolve(v, refs) for v in value) if r is not _NO_VALUE]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        return _NO_VALUE if value["Ref"] == "AWS::NoValue" else refs[value["Ref"]]
    if set(value) == {"Fn::GetAtt"}:
        return refs[".".join(value["Fn::GetAtt"])]
    if set(value) == {"Fn::If"}:
        return _resolve(value["Fn::If"][1], refs)
    if set(value) == {"Fn::Sub"}:
        text: str = value["Fn::Sub"]
        out, i = [], 0
        while i < len(text):
            if text.startswith("${!", i):
                end = text.index("}", i)
                out.append("${" + text[i + 3:end] + "}")
                i = end + 1
            elif text.startswith("${", i):
                end = text.index("}", i)
                out.append(refs[text[i + 2:end]])
                i = end + 1
            else:
                out.append(text[i])
                i += 1
        return "".join(out)
    return {k: _resolve(v, refs) for k, v in value.items()}


_NO_VALUE = object()


def _refs(table: str, bucket: str) -> dict[str, str]:
    return {"Table.Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}", "Bucket.Arn": f"arn:aws:s3:::{bucket}",
            "AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::StackName": STACK,
            "WebSocketApi": "wsapi", "WebSocketStageName": "live", "WorkerTaskRole.Arn": TASK_ROLE_SESSION,
            "TenantWorkerRole.Arn": TENANT_ROLE_ARN, "LlmSecretArn": SECRET_ARN, "BedrockModels": "amazon.nova-*"}


def tenant_role_policies(table: str, bucket: str) -> list[dict[str, Any]]:
    props = _resource("TenantWorkerRole")["Properties"]
    return [_resolve(p["PolicyDocument"], _refs(table, bucket)) for p in props["Policies"]]


def task_role_policies(table: str, bucket: str) -> list[dict[str, Any]]:
    assert "Policies" not in _resource("WorkerTaskRole")["Properties"], "the task role's only grant is WorkerTaskPolicy"
    return [_resolve(_resource("WorkerTaskPolicy")["Properties"]["PolicyDocument"], _refs(table, bucket))]


def tenant_role_trust() -> dict[str, Any]:
    # the trust policy names the task role; IAM matches the task's assumed-role session against it
    trust: dict[str, Any] = _resolve(_resource("TenantWorkerRole")["Properties"]["AssumeRolePolicyDocument"],
                                     _refs("t", "b"))
    return trust


# ------------------------------------------------------------------------------ recording

class Recorder:
    """Every API call the worker's clients make (client side, with parameters), and every request that
    reaches moto (server side, with the access key that signed it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.signed: list[tuple[str, str]] = []
        self.assume_role: list[dict[str, list[str]]] = []

    def on_params(self, params: dict[str, Any], event_name: str, **_: Any) -> None:
        _event, service, operation = event_name.split(".")
        self.calls.append((service, operation, {k: v for k, v in params.items() if k != "Body"}))

    def handler(self, **kwargs: Any) -> None:
        self.on_params(**kwargs)

    def on_request(self, environ: dict[str, Any]) -> None:
        who = signed_by(environ)
        if who is None:
            return
        self.signed.append(who)
        if who[1] == "sts":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(size)
            environ["wsgi.input"] = io.BytesIO(body)
            self.assume_role.append(parse_qs(body.decode()))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    rec = Recorder()
    make = ts.credentials_session

    def recording(*args: Any, **kwargs: Any) -> Any:
        session = make(*args, **kwargs)
        session.register("before-parameter-build", rec.handler)
        return session

    monkeypatch.setattr(ts, "credentials_session", recording)
    _OneAtATime.listeners.append(rec.on_request)
    try:
        yield rec
    finally:
        _OneAtATime.listeners.remove(rec.on_request)


def _swap(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {_swap(k, old, new): _swap(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, old, new) for v in value]
    return value


# ------------------------------------------------------------------------------ the worker, on moto

async def test_a_tenant_worker_signs_only_with_its_tenant_role_and_reaches_nothing_of_another_tenant(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch, recorder: Recorder) -> None:
    monkeypatch.setenv("AVM_CONFIG_PATH", f"/agentvm/{STACK}/")  # the worker reads the config too
    async with StockClient(cloud.edge.url, ack=False) as client:
        image = await client.new_image("c-tools", tools=["bash", "read_file", "write_file"])
        start = len(client.events)
        await client.request("message_send_request", {"imageId": image["imageId"], "content": "use the tools"})
        await client.wait_for(lambda e: e.get("type") == "tool_call_message", 10, start)
        await cloud.edge.settle(include_invokes=True)
        recorder.signed.clear()  # from here on: the worker only

        assert await run_worker(monkeypatch, "c-tools") == 1
        signed = list(recorder.signed)  # before the client's $disconnect (ws_disconnect signs its own)
        await client.wait_for(lambda e: e.get("type") == "turn_response", 10, start)
        assert client.events[-1]["data"]["status"] == "completed"

    # the credential variables are gone from the worker's environment (what its children inherit)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(os.environ)

    # one AssumeRole, signed by the task role ("testing" in the fixture), for this tenant only
    [assume] = recorder.assume_role
    assert assume["RoleArn"] == [TENANT_ROLE_ARN]
    assert (assume["Tags.member.1.Key"], assume["Tags.member.1.Value"]) == ([ts.TENANT_TAG], [TENANT])
    assert "Tags.member.2.Key" not in assume
    session_policy = json.loads(assume["Policy"][0])
    assert [s for s in signed if s[0] == "testing"] == [("testing", "sts")]

    # every other request that reached AWS (moto) carries the assumed key
    [assumed_key] = {key for key, service in signed if service != "sts"}
    assert assumed_key.startswith("ASIA")
    services = {service for _, service in signed}
    assert {"dynamodb", "s3"} <= services, services

    # every call the worker made is allowed by the tenant role and the session policy it sent...
    identity = tenant_role_policies(cloud.store.table_name, cloud.bucket)
    me = Principal(f"arn:aws:sts::{ACCOUNT}:assumed-role/TenantWorkerRole/avm-worker", {ts.TENANT_TAG: TENANT})
    calls = [c for c in recorder.calls if c[0] != "sts"]
    kinds = {(service, op) for service, op, _ in calls}
    assert {("dynamodb", "UpdateItem"), ("dynamodb", "Query"), ("dynamodb", "BatchWriteItem"),
            ("s3", "ListObjectsV2"), ("s3", "PutObject"), ("ssm", "GetParametersByPath"),
            ("apigatewaymanagementapi", "PostToConnection")} <= kinds, kinds
    checks = [c for service, op, params in calls for c in authorizations(service, op, params)]
    refused = [str(c) for c in checks if not allowed(c, me, identity, session_policy)]
    assert refused == []

    # ...and the same calls aimed at tenant B's keys and prefixes are all denied, with A's credentials
    theirs = [c for service, op, params in calls
              for c in authorizations(service, op, _swap(params, TENANT, OTHER))]
    scoped = [c for c in theirs if c.context.get("dynamodb:LeadingKeys") or c.resource.startswith("arn:aws:s3")]
    assert len(scoped) > 20
    assert [str(c) for c in scoped if allowed(c, me, identity, session_policy)] == []
    # (even without the session policy: the role's own conditions keep tenant B out)
    assert [str(c) for c in scoped if allowed(c, me, identity)] == []


# ------------------------------------------------------------------------------ attacks, by policy

def _me(tenant: str = "tenant-a") -> Principal:
    return Principal(f"arn:aws:sts::{ACCOUNT}:assumed-role/TenantWorkerRole/avm-worker", {ts.TENANT_TAG: tenant})


TABLE, BUCKET = "agentvm-table", "agentvm-bucket"


def _allowed(service: str, op: str, params: dict[str, Any], tenant: str = "tenant-a", *,
             session: bool = True) -> bool:
    policy = json.loads(ts.session_policy(tenant, "c1", bucket=BUCKET)) if session else None
    checks = authorizations(service, op, params)
    return all(allowed(c, _me(tenant), tenant_role_policies(TABLE, BUCKET), policy) for c in checks)


def _get(pk: str) -> dict[str, Any]:
    return {"TableName": TABLE, "Key": {"PK": {"S": pk}, "SK": {"S": "x"}}}


@pytest.mark.parametrize("session", [True, False], ids=["with-session-policy", "role-policy-alone"])
def test_tenant_credentials_reach_their_own_keys_and_nothing_else(session: bool) -> None:
    def ok(service: str, op: str, params: dict[str, Any]) -> bool:
        return _allowed(service, op, params, session=session)

    # its own items, indexes and workspace
    assert ok("dynamodb", "GetItem", _get("SESS#tenant-a#s1"))
    assert ok("dynamodb", "UpdateItem", _get("CTASK#tenant-a#c1"))
    assert ok("dynamodb", "Query", {"TableName": TABLE, "IndexName": "GSI1", "KeyConditionExpression": "G1PK = :pk",
                                    "ExpressionAttributeValues": {":pk": {"S": "TENANT#tenant-a#IMG"}}})
    assert ok("s3", "GetObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-a/c1/notes.txt"})
    assert ok("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "workspaces/tenant-a/c1/"})

    # another tenant's items, directly, by index, in a batch with its own, or by a look-alike id
    assert not ok("dynamodb", "GetItem", _get("SESS#tenant-b#s1"))
    assert not ok("dynamodb", "GetItem", _get("SESS#tenant-a.b#s1"))
    assert not ok("dynamodb", "PutItem", {"TableName": TABLE, "Item": {"PK": {"S": "IMG#tenant-b#i1"}}})
    assert not ok("dynamodb", "BatchGetItem", {"RequestItems": {TABLE: {"Keys": [
        {"PK": {"S": "SESS#tenant-a#s1"}}, {"PK": {"S": "SESS#tenant-b#s1"}}]}}})
    assert not ok("dynamodb", "Query", {"TableName": TABLE, "IndexName": "GSI1", "KeyConditionExpression": "G1PK = :pk",
                                        "ExpressionAttributeValues": {":pk": {"S": "TENANT#tenant-b#IMG"}}})
    # the global partitions: maintenance index, connection records, API keys, published names
    assert not ok("dynamodb", "Query", {"TableName": TABLE, "IndexName": "GSI4", "KeyConditionExpression": "SPK = :p",
                                        "ExpressionAttributeValues": {":p": {"S": "TURN#queued#3"}}})
    assert not ok("dynamodb", "PutItem", {"TableName": TABLE, "Item": {"PK": {"S": "WSCONN#abc"}}})
    assert not ok("dynamodb", "GetItem", _get("APIKEY#k1"))
    assert not ok("dynamodb", "GetItem", _get("PUBNAME#skill#x"))
    assert not ok("dynamodb", "Scan", {"TableName": TABLE})  # no LeadingKeys at all
    assert not ok("dynamodb", "Scan", {"TableName": TABLE, "IndexName": "GSI1"})

    # other tenants' workspaces, the whole bucket, and what only the platform reads
    assert not ok("s3", "GetObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-b/c1/notes.txt"})
    assert not ok("s3", "PutObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-a.b/c1/x"})
    assert not ok("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "workspaces/tenant-b/"})
    assert not ok("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "workspaces/"})
    assert not ok("s3", "ListObjectsV2", {"Bucket": BUCKET})
    assert not ok("s3", "GetObject", {"Bucket": BUCKET, "Key": "usage/2026/01/usage.csv"})
    assert not ok("secretsmanager", "GetSecretValue", {"SecretId": SECRET_ARN})
    assert not ok("sts", "AssumeRole", {"RoleArn": TENANT_ROLE_ARN, "RoleSessionName": "x",
                                        "Tags": [{"Key": ts.TENANT_TAG, "Value": "tenant-b"}]})


def test_the_session_policy_narrows_the_workspace_to_the_tasks_container() -> None:
    assert _allowed("s3", "GetObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-a/c2/x"}, session=False)
    assert not _allowed("s3", "GetObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-a/c2/x"})
    assert not _allowed("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "workspaces/tenant-a/"})


def test_the_task_role_can_only_assume_the_tenant_role_with_exactly_one_tenant_tag() -> None:
    task = Principal(TASK_ROLE_SESSION)
    identity, trust = task_role_policies(TABLE, BUCKET), tenant_role_trust()

    def assume(tags: list[dict[str, str]]) -> bool:
        checks = authorizations("sts", "AssumeRole", {"RoleArn": TENANT_ROLE_ARN, "RoleSessionName": "w", "Tags": tags})
        return all(allowed(c, task, identity) and trusts(trust, c, task) for c in checks)

    assert assume([{"Key": ts.TENANT_TAG, "Value": "tenant-a"}])
    assert not assume([])  # untagged: the tenant role's policy would match no key at all, still refused
    assert not assume([{"Key": ts.TENANT_TAG, "Value": ""}])
    assert not assume([{"Key": ts.TENANT_TAG, "Value": "tenant-a"}, {"Key": "other", "Value": "x"}])
    # the task role itself holds nothing on the table or the bucket
    for service, op, params in [("dynamodb", "GetItem", _get("SESS#tenant-a#s1")),
                                ("s3", "GetObject", {"Bucket": BUCKET, "Key": "workspaces/tenant-a/c1/x"})]:
        assert not any(allowed(c, task, identity) for c in authorizations(service, op, params))
    # and another principal cannot assume the tenant role at all
    stranger = Principal(f"arn:aws:sts::{ACCOUNT}:assumed-role/ChatTurnRole/x")
    [check, _] = authorizations("sts", "AssumeRole", {"RoleArn": TENANT_ROLE_ARN, "RoleSessionName": "w",
                                                      "Tags": [{"Key": ts.TENANT_TAG, "Value": "tenant-a"}]})
    assert not trusts(trust, check, stranger)


def test_the_template_lists_exactly_the_key_prefixes_the_worker_module_names() -> None:
    [items] = [s for s in tenant_role_policies(TABLE, BUCKET)[0]["Statement"] if s.get("Sid") == "TenantItems"]
    keys = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    tag = "${aws:PrincipalTag/agentvm-tenant}"
    wanted = [f"{p}#{tag}#*" for p in ts.TABLE_PREFIXES] + [f"{p}#{tag}" for p in ts.EXACT_PREFIXES]
    assert sorted(keys) == sorted(wanted)
    statements = tenant_role_policies(TABLE, BUCKET)[0]["Statement"]
    indexes = {s["Resource"].rsplit("/", 1)[-1]: s["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
               for s in statements if s.get("Sid", "").startswith("TenantIndex")}
    assert indexes == {name: [f"{p}#{tag}#*" for p in prefixes] for name, prefixes in ts.INDEX_PREFIXES.items()}


# ------------------------------------------------------------------------------ fail closed

@pytest.mark.parametrize("tenant", ["a*", "a?", "a#b", "a/b", "a b", "a$b", "", "x" * 129])
def test_tenant_ids_that_cannot_be_scoped_are_refused(tenant: str) -> None:
    with pytest.raises(ts.TenantNotScopable, match="cannot have a tenant-scoped sandbox"):
        ts.check_scopable(tenant)


async def test_no_task_is_started_for_a_tenant_that_cannot_be_scoped() -> None:
    tier = EcsContainerTier(store=None, ecs=None, cluster="c", task_definition="td", subnets=["s"],  # type: ignore[arg-type]
                            security_groups=[], container_name="worker")
    with pytest.raises(ts.TenantNotScopable, match=r"Tenant id 'a\*b' cannot have a tenant-scoped sandbox"):
        await tier.start("a*b", "c1", "s1")


async def test_the_worker_refuses_to_start_without_its_tenant_role(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AVM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AVM_WORKER_TENANT_ID", "tenant-a")
    monkeypatch.setenv("AVM_WORKER_CONTAINER_ID", "c1")
    monkeypatch.setenv("AVM_TABLE_NAME", TABLE)
    monkeypatch.setenv("AVM_BUCKET", BUCKET)
    with pytest.raises(SystemExit, match="AVM_WORKER_TENANT_ROLE_ARN must be set"):
        await serve(Settings())
    monkeypatch.setenv("AVM_WORKER_TENANT_ROLE_ARN", TENANT_ROLE_ARN)
    monkeypatch.setenv("AVM_WORKER_TENANT_ID", "a*")
    with pytest.raises(SystemExit, match="cannot have a tenant-scoped sandbox"):
        await serve(Settings())  # refused before any request


def test_task_credentials_survive_dropping_the_environment_and_tools_never_get_them() -> None:
    env = {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/abc", "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "AKIA", "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/x"}
    assert sorted(ts.drop_task_credentials(env)) == ["AWS_ACCESS_KEY_ID", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                                     "ECS_CONTAINER_METADATA_URI_V4"]
    assert env == {"AWS_REGION": "us-east-1"}
    assert not [k for k in tool_env("/w") if k.startswith(("AWS_", "ECS_"))]


def test_the_session_policy_fits_awss_limit_for_the_longest_ids() -> None:
    policy = ts.session_policy("t" * 128, "c" * 128, bucket="b" * 63)
    assert len(policy) <= 2048
    with pytest.raises(ts.TenantNotScopable, match="above AWS's 2,048"):
        ts.session_policy("t", "c" * 2000, bucket="b")
