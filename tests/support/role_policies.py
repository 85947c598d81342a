"""Each function's role in template.yaml, as IAM would evaluate it for a test's stack, and the check
of recorded AWS calls (tests/support/aws_calls.py) against it (issue 18, finding 2).

The role is read from the template after the SAM transform (`_sam_transformed`: SAM's generated
`<Function>Role`, policy templates expanded), or from the functions' own `Policies` when the SAM CLI
venv is absent. Intrinsics are resolved to the test's concrete names (`Stack`): `Ref`, `Fn::GetAtt`,
`Fn::Sub`, `Fn::Join`, `Fn::If` (conditions as given; all true by default). A reference the stack
does not know resolves to a name no request carries: such a statement allows nothing, so an
unresolved grant fails the check instead of passing it.

Each call becomes the authorizations AWS makes for it (`iam_policy.authorizations`: action, resource
ARN, condition keys) and each is evaluated against the role's statements (`iam_policy.allowed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.aws_calls import Call
from tests.support.iam_policy import ACCOUNT, REGION, Principal, allowed, authorizations
from tests.template.template_model import FUNCTIONS

#: Processes that are not Lambda functions, and the role they run with.
TASK_ROLES: Mapping[str, str] = {"turn_host": "TurnHostTaskRole"}
LOGICAL_IDS: Mapping[str, str] = {label: logical_id for logical_id, label in FUNCTIONS.items()}


@dataclass(frozen=True)
class Stack:
    """A deployed stack's names as a test has them (what the template's references resolve to)."""

    name: str
    table: str
    bucket: str
    chat_turn_function: str = "agentvm-chat-turn"
    turn_queue: str = "turns"
    ws_api: str = "wsapi"
    ws_stage: str = "live"
    llm_secret_arn: str = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:agentvm/llm-AbCdEf"
    worker_cluster: str = "agentvm-workers"
    worker_task_definition: str = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/agentvm-worker:1"
    bedrock_models: str = "anthropic.claude-haiku-4-5*"  # the BedrockModels parameter (HasBedrockModels)
    conditions: Mapping[str, bool] = field(default_factory=dict)  # absent: true

    @property
    def config_path(self) -> str:
        """AVM_CONFIG_PATH as the template sets it."""
        return f"/agentvm/{self.name}/"

    def refs(self) -> dict[str, str]:
        table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{self.table}"
        alias = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.chat_turn_function}:live"
        return {
            "AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
            "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": self.name, "Table": self.table, "Table.Arn": table,
            "Table.StreamArn": f"{table}/stream/2026-11-26T00:00:00.000", "Bucket": self.bucket,
            "Bucket.Arn": f"arn:aws:s3:::{self.bucket}", "WebSocketApi": self.ws_api,
            "WebSocketStageName": self.ws_stage, "ChatTurnFunction.Alias": alias, "ChatTurnFunctionAliaslive": alias,
            "TurnQueue.Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{self.turn_queue}",
            "TurnQueue": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.turn_queue}",
            "ArchiveFailures.Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{self.name}-ArchiveFailures",
            "LlmSecretArn": self.llm_secret_arn, "WorkerCluster": self.worker_cluster,
            "WorkerCluster.Arn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{self.worker_cluster}",
            "WorkerTaskDefinition": self.worker_task_definition, "BedrockModels": self.bedrock_models,
        }


_NO_VALUE = object()


def resolve(value: Any, refs: Mapping[str, str], conditions: Mapping[str, bool] | None = None) -> Any:
    """CloudFormation intrinsics of a policy document resolved with `refs` (see the module doc)."""
    conditions = conditions or {}

    def unknown(name: str) -> str:
        return f"unresolved:{name}"

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [r for r in (walk(x) for x in v) if r is not _NO_VALUE]
        if not isinstance(v, dict):
            return v
        if set(v) == {"Ref"}:
            return _NO_VALUE if v["Ref"] == "AWS::NoValue" else refs.get(v["Ref"], unknown(v["Ref"]))
        if set(v) == {"Fn::GetAtt"}:
            name = ".".join(v["Fn::GetAtt"]) if isinstance(v["Fn::GetAtt"], list) else v["Fn::GetAtt"]
            return refs.get(name, unknown(name))
        if set(v) == {"Fn::If"}:
            condition, when_true, when_false = v["Fn::If"]
            return walk(when_true if conditions.get(condition, True) else when_false)
        if set(v) == {"Fn::Join"}:
            separator, parts = v["Fn::Join"]
            return separator.join(str(p) for p in walk(parts))
        if set(v) == {"Fn::Sub"}:
            text, local = (v["Fn::Sub"], {}) if isinstance(v["Fn::Sub"], str) else v["Fn::Sub"]
            return _sub(text, {**refs, **{k: str(walk(x)) for k, x in local.items()}}, unknown)
        return {k: r for k, r in ((k, walk(x)) for k, x in v.items()) if r is not _NO_VALUE}

    return walk(value)


def _sub(text: str, names: Mapping[str, str], unknown: Any) -> str:
    out, i = [], 0
    while i < len(text):
        if text.startswith("${!", i):  # `${!x}` is the literal `${x}`
            end = text.index("}", i)
            out.append("${" + text[i + 3:end] + "}")
            i = end + 1
        elif text.startswith("${", i):
            end = text.index("}", i)
            name = text[i + 2:end]
            out.append(names.get(name, unknown(name)))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def role_name(function: str, template: Mapping[str, Any]) -> str:
    """The logical id of the role `function` (a label: `chat_stream`, `turn_host`) runs with."""
    if function in TASK_ROLES:
        return TASK_ROLES[function]
    logical_id = LOGICAL_IDS[function]
    role = template["Resources"][logical_id]["Properties"].get("Role")
    if role is None:  # untransformed: SAM will generate <Function>Role from the function's Policies
        return f"{logical_id}Role"
    return str(role["Fn::GetAtt"][0])


def role_documents(function: str, template: Mapping[str, Any],
                   conditions: Mapping[str, bool] | None = None) -> list[Any]:
    """The unresolved policy documents of the function's role: inline ones, and AWS::IAM::Policy /
    RolePolicy resources attached to it."""
    resources = template["Resources"]
    conditions = conditions or {}
    role = role_name(function, template)
    if role not in resources and function in LOGICAL_IDS:  # untransformed: the function's own statements
        documents = list(resources[LOGICAL_IDS[function]]["Properties"].get("Policies", []))
    else:
        documents = [p["PolicyDocument"] for p in resources[role]["Properties"].get("Policies", [])]
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::RolePolicy") or (
                "Condition" in resource and not conditions.get(resource["Condition"], True)):
            continue
        roles = resolve([*props.get("Roles", []), props.get("RoleName", {"Ref": "AWS::NoValue"})],
                        _Names(), conditions)
        if role in roles:
            documents.append(props["PolicyDocument"])
    return documents


class _Names(dict[str, str]):
    """`Ref` X resolves to X: which roles a policy names."""

    def get(self, key: str, default: Any = None) -> str:  # type: ignore[override]
        return key


def denied(calls: Iterable[Call], template: Mapping[str, Any], stack: Stack) -> list[str]:
    """Each authorization of `calls` the caller's role does not allow, as
    `<function>: <action> on <resource> (role <Role>)`, once each, in call order."""
    refs = stack.refs()
    policies: dict[str, list[Any]] = {}
    out: list[str] = []
    for call in calls:
        if call.function not in policies:
            documents = role_documents(call.function, template, stack.conditions)
            policies[call.function] = [resolve(d, refs, stack.conditions) for d in documents]
        role = role_name(call.function, template)
        principal = Principal(f"arn:aws:iam::{ACCOUNT}:role/{stack.name}-{role}")
        for check in authorizations(call.service, call.operation, call.params, ws_api=stack.ws_api,
                                    ws_stage=stack.ws_stage):
            if not allowed(check, principal, policies[call.function]):
                line = f"{call.function}: {check} (role {role})"
                if line not in out:
                    out.append(line)
    return out
