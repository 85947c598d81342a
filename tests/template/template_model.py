"""template.yaml as the tests read it: the YAML with CloudFormation's short tags, `Globals` merged into
a function the way SAM merges them, IAM statements per function or role, and the logical ids and
constants the template tests share (test_template.py, test_tiers.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
LAYER_REQUIREMENTS = ROOT / "shared" / "requirements.txt"

#: Logical id → function folder. EventLogPrune is deliberately absent: DynamoDB TTL prunes the log.
FUNCTIONS: dict[str, str] = {
    "WsConnectFunction": "ws_connect",
    "WsDisconnectFunction": "ws_disconnect",
    "WsDefaultFunction": "ws_default",
    "ChatTurnFunction": "chat_turn",
    "HttpApiFunction": "http_api",
    "ChatStreamFunction": "chat_stream",
    "UsageExportFunction": "usage_export",
    "TurnSweepFunction": "turn_sweep",
    "HistoryArchiveFunction": "history_archive",
    "TurnFailedFunction": "turn_failed",
}
#: Functions that run turns (and wait on the LLM): up to 15 minutes.
TURN_RUNNERS = ("ChatTurnFunction", "ChatStreamFunction")
#: Scheduled work (the usage export reads a month of usage records: minutes, not seconds).
SCHEDULED = ("UsageExportFunction", "TurnSweepFunction")
#: Fed by the table's stream (batches of up to 1000 TTL removals): minutes at most.
STREAM_CONSUMERS = ("HistoryArchiveFunction",)
#: The functions that start chat_turn: ws_default for a new message, the sweep for a queue nobody runs,
#: turn_failed for the turns queued behind one whose chat_turn died.
CHAT_TURN_STARTERS = {"WsDefaultFunction", "TurnSweepFunction", "TurnFailedFunction"}
#: The functions that dispatch turns (the tiered dispatcher: a turn host when one accepts, else chat_turn).
#: chat_stream runs its turns in its own invocation (stream_app.InlineDispatcher): it dispatches none.
TURN_DISPATCHERS = CHAT_TURN_STARTERS
#: Everything of the turn-host tier; each exists only under the condition HasTurnHostTier.
TURN_HOST_RESOURCES = {
    "TurnQueue": "AWS::SQS::Queue",
    "TurnHostLogGroup": "AWS::Logs::LogGroup",
    "TurnHostExecutionRole": "AWS::IAM::Role",
    "TurnHostTaskRole": "AWS::IAM::Role",
    "TurnHostTaskDefinition": "AWS::ECS::TaskDefinition",
    "TurnHostService": "AWS::ECS::Service",
    "TurnHostScalableTarget": "AWS::ApplicationAutoScaling::ScalableTarget",
    "TurnHostScaleOut": "AWS::ApplicationAutoScaling::ScalingPolicy",
    "TurnHostScaleIn": "AWS::ApplicationAutoScaling::ScalingPolicy",
    "TurnHostDemandAlarm": "AWS::CloudWatch::Alarm",
    "TurnHostIdleAlarm": "AWS::CloudWatch::Alarm",
}
TURN_QUEUE_ARN = {"Fn::GetAtt": ["TurnQueue", "Arn"]}
#: chat_stream is a web app run by the Lambda Web Adapter: a start script, not a handler module.
WEB_ADAPTER = "ChatStreamFunction"
#: Regions cfn-lint checks resource availability in (SnapStart, arm64, GLACIER_IR, ...).
LINT_REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-1", "ap-northeast-1")
#: Packages the function tier must not carry (the SDK-free driver replaces anthropic; the rest is `avm serve`).
#: aioboto3/aiobotocore/aiohttp: ~1 s of cold start; the AWS adapters use botocore on a thread pool.
NOT_IN_LAYER = ("anthropic", "uvicorn", "websockets", "aioboto3", "aiobotocore", "aiohttp")
LAYER_MUST_HAVE = ("pydantic", "orjson", "httpx", "pyyaml", "boto3", "botocore",
                   "aws-lambda-powertools", "mangum", "fastapi", "starlette")
WS_API_ARN_PREFIX = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${WebSocketApi}/"
CONFIG_PARAMETER_ARN = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/agentvm/${AWS::StackName}"
#: The functions serving PUT/DELETE /v1/config/{key} (the config center's runtime layer in SSM).
CONFIG_WRITERS = {"HttpApiFunction", "ChatStreamFunction"}
NO_VALUE = {"Ref": "AWS::NoValue"}
STREAM_READ = {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"}


# ------------------------------------------------------------------------------------------ loading

class _CfnLoader(yaml.SafeLoader):
    """A SafeLoader that reads CloudFormation short tags (`!Ref`, `!Sub`, `!GetAtt`, `!If`, ...) as long form."""


def _construct_short_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    elif isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    else:  # pragma: no cover - YAML has no other node kinds
        raise yaml.constructor.ConstructorError(None, None, f"unexpected node for !{suffix}", node.start_mark)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        resource, _, attribute = value.partition(".")
        return {"Fn::GetAtt": [resource, attribute]}
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _construct_short_tag)


@cache
def _template() -> dict[str, Any]:
    loaded = yaml.load(TEMPLATE.read_text(encoding="utf-8"), Loader=_CfnLoader)  # _CfnLoader is a SafeLoader
    assert isinstance(loaded, dict)
    return loaded


def _resources(type_: str | None = None) -> dict[str, dict[str, Any]]:
    resources: dict[str, dict[str, Any]] = _template()["Resources"]
    return {name: r for name, r in resources.items() if type_ is None or r["Type"] == type_}


def _resource(name: str) -> dict[str, Any]:
    return _resources()[name]


def _function(name: str) -> dict[str, Any]:
    """The function's properties with `Globals.Function` applied the way SAM merges them."""
    merged: dict[str, Any] = dict(_template().get("Globals", {}).get("Function", {}))
    props: dict[str, Any] = _resource(name)["Properties"]
    for key, value in props.items():
        if key == "Environment":
            variables = {**merged.get("Environment", {}).get("Variables", {}), **value.get("Variables", {})}
            merged["Environment"] = {"Variables": variables}
        elif isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = [*merged[key], *value]  # SAM appends a function's list to the global one
        else:
            merged[key] = value
    return merged


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _branches(value: Any) -> Iterator[Any]:
    """Both outcomes of a `Fn::If` (minus `AWS::NoValue`), or the value itself."""
    if isinstance(value, dict) and set(value) == {"Fn::If"}:
        _condition, when_true, when_false = value["Fn::If"]
        for branch in (when_true, when_false):
            yield from _branches(branch)
    elif value != NO_VALUE:
        yield value


def _statements(name: str) -> list[dict[str, Any]]:
    """Every IAM statement of a function's inline policies (each `Fn::If` branch counted)."""
    statements: list[dict[str, Any]] = []
    for policy in _as_list(_resource(name)["Properties"].get("Policies", [])):
        assert isinstance(policy, dict) and "Statement" in policy, (
            f"{name}: use inline policy statements (SAM policy templates and managed policies are broader "
            f"than least privilege): {policy!r}")
        for statement in _as_list(policy["Statement"]):
            statements.extend(_branches(statement))
    return statements


def _text(value: Any) -> str:
    """A resource reference as `Fn::Sub` text, so `!Ref X`, `!GetAtt X.Arn` and `!Sub "...${X}"` compare alike."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        key, inner = next(iter(value.items()))
        if key == "Fn::Sub" and isinstance(inner, str):
            return inner
        if key == "Ref":
            return "${" + str(inner) + "}"
        if key == "Fn::GetAtt":
            return "${" + ".".join(_as_list(inner)) + "}"
    raise AssertionError(f"unexpected reference form: {value!r}")


def _allowed(name: str, action: str) -> list[dict[str, Any]]:
    return [s for s in _statements(name) if s["Effect"] == "Allow" and action in _as_list(s["Action"])]


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair in a nested structure."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key, inner
            yield from _walk(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _walk(inner)


def _sam_cli() -> Path | None:
    explicit = os.environ.get("AVM_SAM_CLI")
    if explicit:
        return Path(explicit)
    venv = Path(os.environ.get("SAM_VENV", ".venv-sam"))
    sam = (venv if venv.is_absolute() else ROOT / venv) / "bin" / "sam"
    return sam if sam.exists() else None


def _role_statements(name: str) -> list[dict[str, Any]]:
    """Every statement of an IAM role's inline policies (each `Fn::If` branch counted)."""
    statements: list[dict[str, Any]] = []
    for policy in _resource(name)["Properties"]["Policies"]:
        for statement in _as_list(policy["PolicyDocument"]["Statement"]):
            statements.extend(_branches(statement))
    return statements


_TRANSLATE = (
    "import json, re, sys\n"
    "from samtranslator.translator.transform import transform\n"
    "from samtranslator.yaml_helper import yaml_parse\n"
    "text = re.sub(r'(CodeUri|ContentUri): \\S+', r'\\1: s3://bucket/key', open(sys.argv[1]).read())\n"
    "class Policies:  # no managed policy is looked up (IAM is not called)\n"
    "    def load(self): return {}\n"
    "print(json.dumps(transform(yaml_parse(text), {}, Policies())))\n")


@cache
def _sam_transformed() -> dict[str, Any] | None:
    """template.yaml as CloudFormation gets it (the SAM CLI venv's translator), None without that venv."""
    sam = _sam_cli()
    if sam is None:
        return None
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    result = subprocess.run([str(sam.parent / "python"), "-c", _TRANSLATE, str(TEMPLATE)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))
