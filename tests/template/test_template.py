"""template.yaml: the linters, the DynamoDB schema, and the cost and security rules of the cloud tier.

cfn-lint comes from the project venv (the `dev` extra); `sam validate` from the separate SAM CLI venv
that `make test` builds (`$(SAM_VENV)`, default `.venv-sam`; its boto3 pin conflicts with the project's).
A missing tool skips its test with the reason; the structural checks need neither.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
}
#: Functions that run turns (and wait on the LLM): up to 15 minutes.
TURN_RUNNERS = ("ChatTurnFunction", "ChatStreamFunction")
#: Scheduled work (the usage export reads a month of usage records: minutes, not seconds).
SCHEDULED = ("UsageExportFunction", "TurnSweepFunction")
#: Fed by the table's stream (batches of up to 1000 TTL removals): minutes at most.
STREAM_CONSUMERS = ("HistoryArchiveFunction",)
#: The functions that start chat_turn: ws_default for a new message, the sweep for a queue nobody runs.
CHAT_TURN_STARTERS = {"WsDefaultFunction", "TurnSweepFunction"}
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
LAYER_MUST_HAVE = ("pydantic", "pydantic-settings", "orjson", "httpx", "pyyaml", "boto3", "botocore",
                   "aws-lambda-powertools", "mangum", "fastapi", "starlette")
WS_API_ARN_PREFIX = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${WebSocketApi}/"
CONFIG_PARAMETER_ARN = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/agentvm/${AWS::StackName}"
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


# ------------------------------------------------------------------------------------------ linters

def test_cfn_lint_passes_including_informational_rules() -> None:
    if importlib.util.find_spec("cfnlint") is None:
        pytest.skip("cfn-lint is not installed in this environment (it belongs to the `dev` extra)")
    command = [sys.executable, "-c", "from cfnlint.runner import main; main()",
               "--include-checks", "I", "--regions", *LINT_REGIONS, "--", str(TEMPLATE)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"cfn-lint found problems:\n{result.stdout}{result.stderr}"


def _sam_cli() -> Path | None:
    explicit = os.environ.get("AVM_SAM_CLI")
    if explicit:
        return Path(explicit)
    venv = Path(os.environ.get("SAM_VENV", ".venv-sam"))
    sam = (venv if venv.is_absolute() else ROOT / venv) / "bin" / "sam"
    return sam if sam.exists() else None


def test_sam_validate_lint_passes() -> None:
    sam = _sam_cli()
    if sam is None:
        pytest.skip("SAM CLI venv not found (.venv-sam/bin/sam; `make sam-cli` builds it, AVM_SAM_CLI overrides)")
    # No credentials are needed for --lint; telemetry off, and no instance-metadata probing.
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_EC2_METADATA_DISABLED": "true"}
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    result = subprocess.run([str(sam), "validate", "--lint", "--template", str(TEMPLATE)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"sam validate --lint failed:\n{result.stdout}{result.stderr}"
    assert "is a valid SAM Template" in result.stdout


def test_sam_build_ships_the_layer_for_arm64_precompiled(tmp_path: Path) -> None:
    sam = _sam_cli()
    if sam is None:
        pytest.skip("SAM CLI venv not found (.venv-sam/bin/sam; `make sam-cli` builds it, AVM_SAM_CLI overrides)")
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_EC2_METADATA_DISABLED": "true"}
    build = tmp_path / "build"
    result = subprocess.run([str(sam), "build", "--template", str(TEMPLATE), "--build-dir", str(build)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"sam build failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    layer = build / "AgentVMLayer" / "python"
    modules = sorted(p.relative_to(layer) for p in (layer / "agentvm").rglob("*.py"))
    assert len(modules) > 50
    for module in modules:  # every module precompiled for the Lambda runtime's Python
        pyc = layer / module.parent / "__pycache__" / f"{module.stem}.cpython-312.pyc"
        assert pyc.is_file(), f"{module} ships without bytecode"
    assert list((layer / "pydantic_core").glob("*.cpython-312-aarch64-linux-gnu.so")), "not built for arm64"
    assert not (layer / "anthropic").exists() and not (layer / "aioboto3").exists()
    assert not (layer / "agentvm_client").exists()
    assert not _client_modules(layer), "the layer ships the Python client"
    for resource in FUNCTIONS:
        if resource == WEB_ADAPTER:
            assert os.access(build / resource / "run.sh", os.X_OK)
            assert (build / resource / "uvicorn" / "__init__.py").is_file()
        else:
            assert (build / resource / "handler.py").is_file()


# ------------------------------------------------------------------------------------------ state

def test_table_matches_table_definition() -> None:
    from agentvm.adapters.aws.dynamodb_table import TABLE_DEFINITION

    assert set(TABLE_DEFINITION) == {"AttributeDefinitions", "KeySchema", "GlobalSecondaryIndexes", "TimeToLive"}, (
        "TABLE_DEFINITION grew a key: teach template.yaml and this test about it")
    table = _resource("Table")["Properties"]

    def by(key: str, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {item[key]: item for item in items}

    assert by("AttributeName", table["AttributeDefinitions"]) == by(
        "AttributeName", TABLE_DEFINITION["AttributeDefinitions"])
    assert len(table["AttributeDefinitions"]) == len(TABLE_DEFINITION["AttributeDefinitions"])
    assert table["KeySchema"] == TABLE_DEFINITION["KeySchema"]
    assert by("IndexName", table["GlobalSecondaryIndexes"]) == by(
        "IndexName", TABLE_DEFINITION["GlobalSecondaryIndexes"])
    assert len(table["GlobalSecondaryIndexes"]) == len(TABLE_DEFINITION["GlobalSecondaryIndexes"])
    assert table["TimeToLiveSpecification"] == TABLE_DEFINITION["TimeToLive"]
    assert "LocalSecondaryIndexes" not in table


def test_table_is_on_demand_recoverable_encrypted_and_retained() -> None:
    resource = _resource("Table")
    table = resource["Properties"]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert not [key for key, _ in _walk(table) if key in ("ProvisionedThroughput", "OnDemandThroughput")]
    assert table["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": {"Fn::If": ["PointInTimeRecoveryEnabled", True, False]}}
    assert table["SSESpecification"]["SSEEnabled"] is True
    assert "TableName" not in table, "a fixed name blocks replacement and a second stack in the account"
    assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"] == "Retain"
    assert len(_resources("AWS::DynamoDB::Table")) == 1, "single-table design"


def test_bucket_is_private_encrypted_and_retained() -> None:
    resource = _resource("Bucket")
    bucket = resource["Properties"]
    assert resource["DeletionPolicy"] == resource["UpdateReplacePolicy"] == "Retain"
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    encryption = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert [rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] for rule in encryption] == ["AES256"]
    assert bucket["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert "WebsiteConfiguration" not in bucket and "AccessControl" not in bucket

    rules = bucket["LifecycleConfiguration"]["Rules"]
    assert all(rule["Status"] == "Enabled" for rule in rules)
    assert any(rule.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 1} and "Prefix" not in rule
               for rule in rules), "incomplete multipart uploads must be aborted bucket-wide after 1 day"
    by_prefix = {rule["Prefix"]: rule for rule in rules if "Prefix" in rule}
    for prefix in ("exports/", "archives/"):
        assert by_prefix[prefix]["Transitions"] and by_prefix[prefix]["ExpirationInDays"], prefix
    # the history archive is kept (session exports read it back), in Glacier Instant Retrieval after 90 days
    assert by_prefix["archive/"] == {"Id": "history-archive-tier", "Status": "Enabled", "Prefix": "archive/",
                                     "Transitions": [{"StorageClass": "GLACIER_IR", "TransitionInDays": 90}]}

    policies = [p["Properties"] for p in _resources("AWS::S3::BucketPolicy").values()
                if p["Properties"]["Bucket"] == {"Ref": "Bucket"}]
    assert len(policies) == 1
    (statement,) = policies[0]["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


# ------------------------------------------------------------------------------------------ functions

def test_exactly_the_expected_functions() -> None:
    assert set(_resources("AWS::Serverless::Function")) == set(FUNCTIONS)
    assert not _resources("AWS::Lambda::Function"), "declare functions as AWS::Serverless::Function"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_is_small_arm64_python312(name: str) -> None:
    function = _function(name)
    parameters = _template()["Parameters"]
    assert function["Runtime"] == "python3.12"
    assert function["Architectures"] == ["arm64"]
    assert function["CodeUri"].rstrip("/") == f"functions/{FUNCTIONS[name]}"
    if name == WEB_ADAPTER:
        assert function["Handler"] == "run.sh"
        assert function["Layers"][0] == {"Ref": "AgentVMLayer"} and len(function["Layers"]) == 2
        assert _text(function["Layers"][1]).endswith(
            ":753240598075:layer:LambdaAdapterLayerArm64:${WebAdapterLayerVersion}")
        variables = function["Environment"]["Variables"]
        assert (variables["AWS_LAMBDA_EXEC_WRAPPER"], variables["AWS_LWA_INVOKE_MODE"]) == (
            "/opt/bootstrap", "response_stream")
        assert function["FunctionUrlConfig"] == {"AuthType": "NONE", "InvokeMode": "RESPONSE_STREAM"}
    else:
        assert function["Handler"] == "handler.handler"
        assert function["Layers"] == [{"Ref": "AgentVMLayer"}]
    memory = function["MemorySize"]
    if isinstance(memory, dict):
        parameter = parameters[memory["Ref"]]
        assert 256 <= parameter["Default"] <= 512 and parameter["MaxValue"] <= 1024
    else:
        assert 256 <= memory <= 512
    limit = 900 if name in TURN_RUNNERS else 300 if name in SCHEDULED + STREAM_CONSUMERS else 29
    assert 1 <= function["Timeout"] <= limit
    for key in ("VpcConfig", "ProvisionedConcurrencyConfig", "FileSystemConfigs", "Tracing", "DeploymentPreference"):
        assert key not in function, f"{name}: {key} costs money while idle or per request"
    assert function.get("EphemeralStorage", {"Size": 512})["Size"] == 512


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_code_folder_exists(name: str) -> None:
    if name == WEB_ADAPTER:
        folder = ROOT / "functions" / FUNCTIONS[name]
        script = folder / "run.sh"
        assert script.is_file() and os.access(script, os.X_OK), f"{script.relative_to(ROOT)} is not executable"
        assert "agentvm.cloud.stream_app:create_stream_app" in script.read_text(encoding="utf-8")
        assert f"build-{name}:" in (folder / "Makefile").read_text(encoding="utf-8")
        return
    handler = ROOT / "functions" / FUNCTIONS[name] / "handler.py"
    assert handler.is_file(), f"template.yaml points {name} at {handler.relative_to(ROOT)}, which does not exist"
    assert re.search(r"^(async )?def handler\(|^handler\s*=", handler.read_text(encoding="utf-8"), re.M), (
        f"{handler.relative_to(ROOT)} defines no module-level `handler`")


def test_every_function_has_a_log_group_with_retention() -> None:
    groups = {_text(g["Properties"]["LogGroupName"]): g for g in _resources("AWS::Logs::LogGroup").values()}
    for name in FUNCTIONS:
        group = groups.get("/aws/lambda/${" + name + "}")
        assert group is not None, f"{name} has no explicit log group /aws/lambda/${{{name}}}"
        retention = group["Properties"]["RetentionInDays"]
        if isinstance(retention, dict):
            retention = _template()["Parameters"][retention["Ref"]]["Default"]
        assert 1 <= retention <= 90, f"{name}: log retention {retention} days"
    for group in groups.values():
        assert "RetentionInDays" in group["Properties"], "every log group expires its events"


def test_no_vpc_nat_or_always_on_capacity() -> None:
    types = {r["Type"] for r in _resources().values()}
    # The container tier's network only (free parts): public subnets, an internet gateway, gateway
    # endpoints; no NAT gateway, no elastic IP, no interface endpoint (each billed by the hour).
    free_network = {"AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::InternetGateway", "AWS::EC2::VPCGatewayAttachment",
                    "AWS::EC2::RouteTable", "AWS::EC2::Route", "AWS::EC2::SubnetRouteTableAssociation",
                    "AWS::EC2::SecurityGroup", "AWS::EC2::VPCEndpoint"}
    for name, resource in _resources().items():
        if resource["Type"].startswith("AWS::EC2::"):
            assert resource["Type"] in free_network, name
            assert resource.get("Condition") == "HasWorkerImage", name
            if resource["Type"] == "AWS::EC2::VPCEndpoint":
                assert resource["Properties"]["VpcEndpointType"] == "Gateway", name
    assert "AWS::EC2::NatGateway" not in types
    # ECS: tasks are started on demand (no instances); the one service is the turn hosts', at 0 tasks
    # unless Application Auto Scaling (minimum 0) adds some
    assert not types & {"AWS::AutoScaling::AutoScalingGroup", "AWS::EC2::Instance", "AWS::ECS::CapacityProvider"}
    services = _resources("AWS::ECS::Service")
    assert list(services) == ["TurnHostService"]
    assert services["TurnHostService"]["Properties"]["DesiredCount"] == 0
    targets = _resources("AWS::ApplicationAutoScaling::ScalableTarget")
    assert [t["Properties"]["MinCapacity"] for t in targets.values()] == [0]
    forbidden = {"ProvisionedConcurrencyConfig", "ProvisionedConcurrentExecutions", "ProvisionedThroughput",
                 "ReservedConcurrentExecutions", "VpcConfig"}
    assert not [key for key, _ in _walk(_template()) if key in forbidden]
    expensive = {"AWS::ElasticLoadBalancingV2::LoadBalancer", "AWS::RDS::DBInstance", "AWS::RDS::DBCluster",
                 "AWS::ElastiCache::CacheCluster", "AWS::KMS::Key", "AWS::ApiGateway::RestApi"}
    assert not types & expensive
    stage = _resource("WebSocketStage")["Properties"]
    assert stage["DefaultRouteSettings"]["DetailedMetricsEnabled"] is False
    assert stage["DefaultRouteSettings"]["DataTraceEnabled"] is False
    access_logs = stage.get("AccessLogSettings")
    if access_logs is not None:  # optional, and off unless asked for
        condition, _when_on, when_off = access_logs["Fn::If"]
        assert when_off == NO_VALUE
        assert _template()["Conditions"][condition] == {"Fn::Equals": [{"Ref": "WebSocketAccessLogs"}, "true"]}
        assert _template()["Parameters"]["WebSocketAccessLogs"]["Default"] == "false"


def test_chat_turn_is_published_with_snapstart_and_not_retried() -> None:
    chat = _function("ChatTurnFunction")
    assert chat["AutoPublishAlias"] == "live"
    apply_on = chat["SnapStart"]["ApplyOn"]
    if isinstance(apply_on, dict):
        apply_on = _template()["Parameters"][apply_on["Ref"]]["Default"]
    assert apply_on == "PublishedVersions"
    assert chat["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    # SnapStart bills the cache of every kept version: a replaced one is deleted at the next deploy
    assert chat["VersionDeletionPolicy"] == "Delete"
    assert "Events" not in chat, "chat_turn is only invoked asynchronously (by ws_default and turn_sweep)"


def test_environment_of_every_function() -> None:
    expected = {"AVM_TABLE_NAME": {"Ref": "Table"}, "AVM_BUCKET": {"Ref": "Bucket"},
                "AVM_RELIABLE_WRAPPER": "false", "POWERTOOLS_LOGGER_LOG_EVENT": "false"}
    required = {"AVM_WS_ENDPOINT", "AVM_CONFIG_PATH", "AVM_STREAM_FLUSH_MS", "AVM_LLM_SECRET_ARN",
                "POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL"}
    for name in FUNCTIONS:
        variables = _function(name)["Environment"]["Variables"]
        assert expected.items() <= variables.items(), name
        assert required <= set(variables), name
        assert _text(variables["AVM_WS_ENDPOINT"]) == (
            "https://${WebSocketApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}/${WebSocketStageName}")
        assert _text(variables["AVM_CONFIG_PATH"]) == "/agentvm/${AWS::StackName}/"
        assert ("AVM_CHAT_TURN_FUNCTION" in variables) == (name in CHAT_TURN_STARTERS)
        assert variables["AVM_STREAM_MAX_FLUSH_MS"] == "2000", name
        assert variables["AVM_HISTORY_HOT_DAYS"] == {"Ref": "HistoryHotDays"}, name
        if name in TURN_DISPATCHERS:
            assert variables["AVM_TURN_QUEUE_URL"] == {"Fn::If": ["HasTurnHostTier", {"Ref": "TurnQueue"}, NO_VALUE]}
        else:
            assert "AVM_TURN_QUEUE_URL" not in variables, name
    for name in CHAT_TURN_STARTERS:
        assert _function(name)["Environment"]["Variables"]["AVM_CHAT_TURN_FUNCTION"] == {
            "Ref": "ChatTurnFunction.Alias"}
    assert _template()["Parameters"]["StreamFlushMs"]["Default"] == 250


def test_layer_is_built_from_shared_for_arm64() -> None:
    layer = _resource("AgentVMLayer")
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    # shared/Makefile: SAM's python builder plus precompiled bytecode
    assert layer["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": "arm64"}
    assert "build-AgentVMLayer:" in (ROOT / "shared" / "Makefile").read_text(encoding="utf-8")
    props = layer["Properties"]
    assert props["ContentUri"].rstrip("/") == "shared"
    assert props["CompatibleRuntimes"] == ["python3.12"]
    assert props["CompatibleArchitectures"] == ["arm64"]


def _client_modules(root: Path) -> list[Path]:
    """Modules under `root` that define the Python client (it lives in client/agentvm_client)."""
    client = re.compile(r"^class (AgentVMClient|ManagementClient)\b", re.MULTILINE)
    return [p for p in root.rglob("*.py") if client.search(p.read_text(encoding="utf-8"))]


def test_the_layer_source_holds_no_client() -> None:
    # The layer is shared/agentvm plus shared/requirements.txt (shared/Makefile): the client is elsewhere.
    shared = ROOT / "shared"
    assert "cp -R agentvm " in (shared / "Makefile").read_text(encoding="utf-8")
    assert not (shared / "agentvm_client").exists()
    assert not _client_modules(shared)
    assert _client_modules(ROOT / "client" / "agentvm_client")  # the check finds it where it is
    assert "websockets" not in _layer_requirements()


def _layer_requirements() -> dict[str, Requirement]:
    requirements: dict[str, Requirement] = {}
    for line in LAYER_REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            requirements[canonicalize_name(requirement.name)] = requirement
    return requirements


def test_layer_requirements_are_exact_pins_without_the_sdk() -> None:
    requirements = _layer_requirements()
    for name in NOT_IN_LAYER:
        assert name not in requirements, f"{name} must stay out of the Lambda layer"
    for name in LAYER_MUST_HAVE:
        assert canonicalize_name(name) in requirements, f"{name} is missing from shared/requirements.txt"
    for name, requirement in requirements.items():
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"{name} is not pinned exactly"
        assert not requirement.extras and requirement.marker is None, f"{name}: keep the lock plain"


def test_layer_pins_satisfy_pyproject() -> None:
    """The layer may only run versions that the project's own dependency ranges allow."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [*project["dependencies"], *project.get("optional-dependencies", {}).get("aws", [])]
    requirements = _layer_requirements()
    for line in declared:
        wanted = Requirement(line)
        pinned = requirements.get(canonicalize_name(wanted.name))
        if pinned is None:
            continue  # a dependency only `avm serve` needs
        (version,) = (s.version for s in pinned.specifier)
        assert wanted.specifier.contains(version, prereleases=True), f"layer pins {pinned}, pyproject wants {wanted}"


# ------------------------------------------------------------------------------------------ IAM

@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_policies_are_least_privilege(name: str) -> None:
    statements = _statements(name)
    assert statements, f"{name} has no inline policy"
    for statement in statements:
        assert statement["Effect"] == "Allow"
        actions = _as_list(statement["Action"])
        resources = _as_list(statement["Resource"])
        assert "NotAction" not in statement and "NotResource" not in statement
        service = actions[0].split(":", 1)[0]
        assert all(a.split(":", 1)[0] == service for a in actions), f"{name}: one service per statement"
        for action in actions:
            assert action != "*" and not action.endswith(":*"), f"{name}: wildcard action {action}"
            assert action not in ("dynamodb:Scan", "dynamodb:DeleteTable", "dynamodb:UpdateTable"), (
                f"{name}: {action}")
        for resource in resources:
            assert resource != "*", f"{name}: {actions} on every resource"
            text = _text(resource)
            if service == "dynamodb":
                assert text in ("${Table.Arn}", "${Table.Arn}/index/*", "${Table.Arn}/stream/*"), f"{name}: {text}"
                if text.endswith("/index/*"):
                    assert set(actions) <= {"dynamodb:Query"}, f"{name}: indexes are only queried"
                if text.endswith("/stream/*"):
                    assert name in STREAM_CONSUMERS, f"{name} reads the table's stream"
                    assert set(actions) == STREAM_READ, f"{name}: {actions} on the stream"
                else:
                    assert not set(actions) & STREAM_READ, f"{name}: stream actions on {text}"
            elif service == "s3":
                assert text.startswith("${Bucket.Arn}"), f"{name}: {text}"
                if text == "${Bucket.Arn}":  # listing only: object access stays per prefix
                    assert actions == ["s3:ListBucket"], f"{name}: {actions} on the bucket itself"
                else:
                    assert re.fullmatch(r"\$\{Bucket\.Arn\}/[a-z]+/\*", text), f"{name}: whole bucket {text}"
            elif service == "ssm":
                reads = {"ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath"}
                # only the management API writes the config center's runtime layer, and only under its path
                writes = {"ssm:PutParameter", "ssm:DeleteParameter"} if name == "HttpApiFunction" else set()
                assert set(actions) <= reads | writes, f"{name}: {actions}"
                if set(actions) & writes:
                    assert text == CONFIG_PARAMETER_ARN + "/*", f"{name}: writes {text}"
                assert text in (CONFIG_PARAMETER_ARN, CONFIG_PARAMETER_ARN + "/*"), f"{name}: {text}"
            elif service == "secretsmanager":
                assert actions == ["secretsmanager:GetSecretValue"] and resource == {"Ref": "LlmSecretArn"}
            elif service == "execute-api":
                assert actions == ["execute-api:ManageConnections"]
            elif service == "lambda":
                assert actions == ["lambda:InvokeFunction"]
            elif service == "sqs":  # only to send: turns to the hosts, failed archive batches to their queue
                assert actions == ["sqs:SendMessage"], f"{name}: {actions}"
                expected = TURN_QUEUE_ARN if name in TURN_DISPATCHERS else {"Fn::GetAtt": ["ArchiveFailures", "Arn"]}
                assert resource == expected and name in TURN_DISPATCHERS | set(STREAM_CONSUMERS), f"{name}: {text}"
            else:
                raise AssertionError(f"{name}: unexpected service {service}")


def test_manage_connections_is_scoped_to_this_websocket_api() -> None:
    callers = {name for name in FUNCTIONS if _allowed(name, "execute-api:ManageConnections")}
    # ws_connect cannot post (API Gateway refuses before $connect returns); the HTTP API never pushes.
    assert callers == {"WsDefaultFunction", "ChatTurnFunction", "ChatStreamFunction"}
    pattern = re.escape(WS_API_ARN_PREFIX) + r"(\$\{WebSocketStageName\}|\*)/(POST|GET|DELETE)/@connections/\*"
    for name in callers:
        for statement in _allowed(name, "execute-api:ManageConnections"):
            for resource in _as_list(statement["Resource"]):
                assert re.fullmatch(pattern, _text(resource)), f"{name}: {_text(resource)}"


def test_only_ws_default_and_the_sweep_may_invoke_chat_turn() -> None:
    invokers = {name for name in FUNCTIONS if _allowed(name, "lambda:InvokeFunction")}
    assert invokers == CHAT_TURN_STARTERS
    for name in invokers:
        for statement in _allowed(name, "lambda:InvokeFunction"):
            assert _as_list(statement["Resource"]) == [{"Ref": "ChatTurnFunction.Alias"}]
    for name, permission in _resources("AWS::Lambda::Permission").items():
        target = _text(permission["Properties"]["FunctionName"])
        assert "ChatTurnFunction" not in target, f"{name} lets {permission['Properties']['Principal']} invoke chat_turn"


def test_llm_secret_and_config_are_readable_only_where_needed() -> None:
    readers = {name for name in FUNCTIONS if _allowed(name, "secretsmanager:GetSecretValue")}
    assert readers <= {"ChatTurnFunction", "HttpApiFunction", "ChatStreamFunction"}
    assert "ChatTurnFunction" in readers
    for name in readers:
        for statement in _resource(name)["Properties"]["Policies"][0]["Statement"]:
            if "Fn::If" in statement:
                assert statement["Fn::If"][0] == "HasLlmSecret" and statement["Fn::If"][2] == NO_VALUE
    parameter = _template()["Parameters"]["LlmSecretArn"]
    assert parameter.get("NoEcho") is not True and "Default" in parameter, "an ARN, never the key itself"
    assert _text(_resource("ConfigRoot")["Properties"]["Name"]).startswith("/agentvm/${AWS::StackName}/")


# ------------------------------------------------------------------------------------------ APIs

def test_websocket_api_routes_everything_to_default() -> None:
    api = _resource("WebSocketApi")["Properties"]
    assert api["ProtocolType"] == "WEBSOCKET"
    routes = {r["Properties"]["RouteKey"]: r["Properties"] for r in _resources("AWS::ApiGatewayV2::Route").values()}
    assert set(routes) == {"$connect", "$disconnect", "$default"}, "ACK frames have no `type`: no named routes"
    integrations = _resources("AWS::ApiGatewayV2::Integration")
    expected = {"$connect": "WsConnectFunction", "$disconnect": "WsDisconnectFunction",
                "$default": "WsDefaultFunction"}
    permissions = [p["Properties"] for p in _resources("AWS::Lambda::Permission").values()]
    for key, function in expected.items():
        route = routes[key]
        assert route["ApiId"] == {"Ref": "WebSocketApi"}
        assert route["AuthorizationType"] == "NONE"  # the function authenticates (see template notes)
        match = re.fullmatch(r"integrations/\$\{(\w+)\}", _text(route["Target"]))
        assert match, route["Target"]
        integration = integrations[match.group(1)]["Properties"]
        assert integration["IntegrationType"] == "AWS_PROXY"
        assert "${" + function + ".Arn}" in _text(integration["IntegrationUri"])
        assert [p for p in permissions if p["FunctionName"] == {"Ref": function}
                and p["Principal"] == "apigateway.amazonaws.com"
                and _text(p["SourceArn"]) == WS_API_ARN_PREFIX + "*/" + key], f"no invoke permission for {key}"
    stage = _resource("WebSocketStage")
    assert stage["Properties"]["ApiId"] == {"Ref": "WebSocketApi"}
    assert stage["Properties"].get("AutoDeploy") is True or _resources("AWS::ApiGatewayV2::Deployment")
    assert set(_as_list(stage.get("DependsOn", []))) >= {"ConnectRoute", "DisconnectRoute", "DefaultRoute"}
    settings = stage["Properties"]["DefaultRouteSettings"]
    assert "ThrottlingRateLimit" in settings and "ThrottlingBurstLimit" in settings


def test_http_api_serves_the_management_app() -> None:
    api = _resource("HttpApi")
    assert api["Type"] == "AWS::Serverless::HttpApi"
    assert "ThrottlingRateLimit" in api["Properties"]["DefaultRouteSettings"]
    events = _function("HttpApiFunction")["Events"]
    assert [e["Properties"]["ApiId"] for e in events.values() if e["Type"] == "HttpApi"] == [{"Ref": "HttpApi"}]
    for name in set(FUNCTIONS) - {"HttpApiFunction", *SCHEDULED}:
        assert "Events" not in _function(name), f"{name} is wired explicitly, not through SAM events"


def test_the_usage_export_runs_daily_on_a_schedule_with_no_idle_cost() -> None:
    events = _function("UsageExportFunction")["Events"]
    assert list(events.values()) == [{"Type": "ScheduleV2", "Properties": {
        "ScheduleExpression": "cron(15 0 * * ? *)", "ScheduleExpressionTimezone": "UTC",
        "RetryPolicy": {"MaximumRetryAttempts": 2}}}]
    s3 = [st for st in _statements("UsageExportFunction") if _as_list(st["Action"])[0].startswith("s3:")]
    assert [(_as_list(st["Action"]), _text(st["Resource"])) for st in s3] == [
        (["s3:PutObject"], "${Bucket.Arn}/exports/*")]


def test_the_turn_sweep_runs_on_a_schedule_and_only_reads_and_starts_chat_turn() -> None:
    events = _function("TurnSweepFunction")["Events"]
    assert list(events.values()) == [{"Type": "ScheduleV2", "Properties": {
        "ScheduleExpression": {"Ref": "TurnSweepSchedule"}, "RetryPolicy": {"MaximumRetryAttempts": 0}}}]
    parameter = _template()["Parameters"]["TurnSweepSchedule"]
    assert parameter["Default"] == "rate(2 minutes)"
    assert re.fullmatch(parameter["AllowedPattern"], "rate(1 minute)")
    assert not re.fullmatch(parameter["AllowedPattern"], "every minute")
    actions = {a for st in _statements("TurnSweepFunction") for a in _as_list(st["Action"])}
    # (with the turn-host tier: a Query of the host directory and sending turns to the hosts' queue)
    assert actions == {"dynamodb:Query", "dynamodb:BatchGetItem", "dynamodb:GetItem", "lambda:InvokeFunction",
                       "sqs:SendMessage"}


def test_outputs() -> None:
    outputs = _template()["Outputs"]
    assert _text(outputs["WebSocketUrl"]["Value"]).startswith("wss://${WebSocketApi}.execute-api.")
    assert _text(outputs["WebSocketUrl"]["Value"]).endswith("/${WebSocketStageName}")
    assert _text(outputs["HttpApiUrl"]["Value"]).startswith("https://${HttpApi}.execute-api.")
    assert outputs["TableName"]["Value"] == {"Ref": "Table"}
    assert outputs["BucketName"]["Value"] == {"Ref": "Bucket"}


def test_chat_turn_may_only_start_the_worker_task() -> None:
    policy = _resource("ChatTurnContainerTierPolicy")
    assert policy["Condition"] == "HasWorkerImage"
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert {s["Sid"]: s["Action"] for s in statements} == {
        "StartWorkerTasks": "ecs:RunTask", "TagWorkerTasks": "ecs:TagResource", "PassWorkerRoles": "iam:PassRole"}
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["StartWorkerTasks"]["Resource"] == {"Ref": "WorkerTaskDefinition"}
    assert by_sid["PassWorkerRoles"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}}
    task = _resource("WorkerTaskDefinition")["Properties"]
    assert task["RuntimePlatform"]["CpuArchitecture"] == "ARM64"
    assert task["RequiresCompatibilities"] == ["FARGATE"]


# ------------------------------------------------------------------------------------------ cost hygiene

def test_every_function_logs_json_without_platform_lines() -> None:
    levels = _template()["Mappings"]["LambdaLogLevel"]
    # every LogLevel has an entry, and none filters above INFO: EMF metric blobs carry no "level" key and
    # Lambda files such lines as INFO, so a WARN or ERROR filter would drop every metric
    assert set(levels) == set(_template()["Parameters"]["LogLevel"]["AllowedValues"])
    assert {level: entry["Application"] for level, entry in levels.items()} == {
        "DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "INFO", "ERROR": "INFO"}
    for name in FUNCTIONS:
        # START, END and REPORT are INFO system lines: none is written (three billed lines per invocation)
        assert _function(name)["LoggingConfig"] == {
            "LogFormat": "JSON", "SystemLogLevel": "WARN",
            "ApplicationLogLevel": {"Fn::FindInMap": ["LambdaLogLevel", {"Ref": "LogLevel"}, "Application"]}}, name


def test_point_in_time_recovery_is_a_parameter() -> None:
    parameter = _template()["Parameters"]["PointInTimeRecovery"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("Enabled", ["Enabled", "Disabled"])
    assert _template()["Conditions"]["PointInTimeRecoveryEnabled"] == {
        "Fn::Equals": [{"Ref": "PointInTimeRecovery"}, "Enabled"]}


# ------------------------------------------------------------------------------------------ history archive

def test_the_table_streams_old_images_for_the_archive() -> None:
    assert _resource("Table")["Properties"]["StreamSpecification"] == {"StreamViewType": "OLD_IMAGE"}
    parameter = _template()["Parameters"]["HistoryHotDays"]
    assert (parameter["Type"], parameter["Default"], parameter["MinValue"]) == ("Number", 30, 0)


def test_the_history_archive_takes_only_ttl_removals_and_reports_failed_batches() -> None:
    function = _function("HistoryArchiveFunction")
    assert (function["MemorySize"], function["Timeout"]) == (256, 120)
    assert {"AVM_TABLE_NAME", "AVM_BUCKET", "AVM_HISTORY_HOT_DAYS"} <= set(function["Environment"]["Variables"])
    (mapping_name,) = _resources("AWS::Lambda::EventSourceMapping")
    mapping = _resource(mapping_name)["Properties"]
    (pattern,) = [f["Pattern"] for f in mapping.pop("FilterCriteria")["Filters"]]
    # removals by the TTL (not by a user or the app) of history items only: event blocks and connections
    # expire far more often and would invoke the function for nothing
    assert json.loads(pattern) == {
        "eventName": ["REMOVE"], "userIdentity": {"type": ["Service"], "principalId": ["dynamodb.amazonaws.com"]},
        "dynamodb": {"Keys": {"SK": {"S": [{"prefix": "MSG#"}, {"prefix": "TURN#"}]}}}}
    assert mapping == {
        "FunctionName": {"Ref": "HistoryArchiveFunction"}, "EventSourceArn": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "StartingPosition": "TRIM_HORIZON", "BatchSize": 1000, "MaximumBatchingWindowInSeconds": 300,
        "BisectBatchOnFunctionError": True, "MaximumRetryAttempts": 10,
        "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": ["ArchiveFailures", "Arn"]}}}}
    failures = _resource("ArchiveFailures")
    assert failures["Type"] == "AWS::SQS::Queue" and "Condition" not in failures
    assert failures["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert failures["Properties"]["SqsManagedSseEnabled"] is True
    grants = {(tuple(sorted(_as_list(st["Action"]))), _text(st["Resource"]))
              for st in _statements("HistoryArchiveFunction")}
    assert grants == {(tuple(sorted(STREAM_READ)), "${Table.Arn}/stream/*"),
                      (("s3:PutObject",), "${Bucket.Arn}/archive/*"),
                      (("dynamodb:UpdateItem",), "${Table.Arn}"),  # the session's archived_at mark
                      (("sqs:SendMessage",), "${ArchiveFailures.Arn}")}


# ------------------------------------------------------------------------------------------ turn-host tier

def _role_statements(name: str) -> list[dict[str, Any]]:
    """Every statement of an IAM role's inline policies (each `Fn::If` branch counted)."""
    statements: list[dict[str, Any]] = []
    for policy in _resource(name)["Properties"]["Policies"]:
        for statement in _as_list(policy["PolicyDocument"]["Statement"]):
            statements.extend(_branches(statement))
    return statements


def test_the_turn_host_tier_exists_only_with_a_worker_image_and_when_chosen() -> None:
    parameters = _template()["Parameters"]
    assert (parameters["TurnHostTier"]["Default"], parameters["TurnHostTier"]["AllowedValues"]) == (
        "Enabled", ["Enabled", "Disabled"])
    conditions = _template()["Conditions"]
    assert conditions["TurnHostTierEnabled"] == {"Fn::Equals": [{"Ref": "TurnHostTier"}, "Enabled"]}
    assert conditions["HasTurnHostTier"] == {"Fn::And": [{"Condition": "HasWorkerImage"},
                                                         {"Condition": "TurnHostTierEnabled"}]}
    tier = {name: r["Type"] for name, r in _resources().items() if r.get("Condition") == "HasTurnHostTier"}
    assert tier == TURN_HOST_RESOURCES
    outputs = {name: o for name, o in _template()["Outputs"].items() if o.get("Condition") == "HasTurnHostTier"}
    assert set(outputs) == {"TurnQueueUrl", "TurnHostService"}
    # what refers to the tier from outside it does so only in the true branch of an `Fn::If` on the condition
    for name, resource in _resources().items():
        if name not in TURN_HOST_RESOURCES:
            for reference in _tier_references(resource):
                raise AssertionError(f"{name} refers to {reference} outside the condition HasTurnHostTier")
    for name, output in _template()["Outputs"].items():
        if name not in outputs:
            assert not list(_tier_references(output)), name


def _tier_references(value: Any) -> Iterator[str]:
    """Turn-host resources that `value` refers to (Ref, GetAtt, Sub), except under `Fn::If: [HasTurnHostTier, ...]`."""
    if isinstance(value, dict):
        if set(value) == {"Fn::If"} and value["Fn::If"][0] == "HasTurnHostTier":
            yield from _tier_references(value["Fn::If"][2])  # the branch taken without the tier
            return
        for key, inner in value.items():
            if key == "Ref" and inner in TURN_HOST_RESOURCES:
                yield inner
            elif key == "Fn::GetAtt" and _as_list(inner)[0].split(".")[0] in TURN_HOST_RESOURCES:
                yield _as_list(inner)[0]
            elif key == "Fn::Sub":
                text = inner if isinstance(inner, str) else inner[0]
                yield from (m for m in re.findall(r"\$\{(\w+)", text) if m in TURN_HOST_RESOURCES)
            yield from _tier_references(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _tier_references(inner)


def test_the_turn_queue() -> None:
    queue = _resource("TurnQueue")
    assert queue["Properties"] == {
        "SqsManagedSseEnabled": True, "MessageRetentionPeriod": 300, "VisibilityTimeout": 60,
        "ReceiveMessageWaitTimeSeconds": 20, "Tags": [{"Key": "project", "Value": "agentvm"}]}
    assert queue["DeletionPolicy"] == queue["UpdateReplacePolicy"] == "Delete"
    senders = {name for name in FUNCTIONS
               for st in _allowed(name, "sqs:SendMessage") if st["Resource"] == TURN_QUEUE_ARN}
    assert senders == TURN_DISPATCHERS
    for name in TURN_DISPATCHERS:  # the grant exists only with the tier
        (statement,) = [st for st in _resource(name)["Properties"]["Policies"][0]["Statement"]
                        if "Fn::If" in st and st["Fn::If"][1].get("Sid") == "SendTurnsToHosts"]
        assert statement["Fn::If"][0] == "HasTurnHostTier" and statement["Fn::If"][2] == NO_VALUE
    # the sweep reads the host directory (PK TURNHOST) and nothing else of the base table by Query
    (listing,) = [st for st in _statements("TurnSweepFunction") if st.get("Sid") == "ListTurnHosts"]
    assert listing["Action"] == "dynamodb:Query" and listing["Resource"] == {"Fn::GetAtt": ["Table", "Arn"]}
    assert listing["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["TURNHOST"]}}


def test_the_turn_host_service_runs_no_task_until_scaled() -> None:
    service = _resource("TurnHostService")["Properties"]
    assert service["DesiredCount"] == 0
    assert service["LaunchType"] == "FARGATE" and service["Cluster"] == {"Ref": "WorkerCluster"}
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network == {"AssignPublicIp": "ENABLED", "Subnets": [{"Ref": "WorkerSubnetA"}, {"Ref": "WorkerSubnetB"}],
                       "SecurityGroups": [{"Fn::GetAtt": ["WorkerSecurityGroup", "GroupId"]}]}
    parameters = _template()["Parameters"]
    assert (parameters["TurnHostCpu"]["Default"], parameters["TurnHostMemory"]["Default"]) == ("512", 1024)
    assert parameters["TurnHostCapacity"]["Default"] == 200 and parameters["TurnHostMaxTasks"]["Default"] == 10
    task = _resource("TurnHostTaskDefinition")["Properties"]
    assert task["RuntimePlatform"] == {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}
    assert task["RequiresCompatibilities"] == ["FARGATE"] and task["NetworkMode"] == "awsvpc"
    assert (task["Cpu"], task["Memory"]) == ({"Ref": "TurnHostCpu"}, {"Ref": "TurnHostMemory"})
    assert task["TaskRoleArn"] == {"Fn::GetAtt": ["TurnHostTaskRole", "Arn"]}
    (container,) = task["ContainerDefinitions"]
    assert container["Image"] == {"Ref": "WorkerImageUri"}
    assert container["EntryPoint"] == ["python", "-m", "agentvm.turnhost"]
    assert container["StopTimeout"] == 120
    log = container["LogConfiguration"]
    assert log["LogDriver"] == "awslogs" and log["Options"]["awslogs-group"] == {"Ref": "TurnHostLogGroup"}
    assert _resource("TurnHostLogGroup")["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    environment = {e["Name"]: e["Value"] for entry in container["Environment"] for e in _branches(entry)}
    assert {k: environment[k] for k in ("AVM_TURN_QUEUE_URL", "AVM_TURN_HOST_CAPACITY", "AVM_TURN_HOST_MAX_CPU",
                                        "AVM_CHAT_TURN_FUNCTION", "AVM_STREAM_MAX_FLUSH_MS", "AVM_HISTORY_HOT_DAYS",
                                        "AVM_TABLE_NAME", "AVM_BUCKET", "AVM_LLM_SECRET_ARN")} == {
        "AVM_TURN_QUEUE_URL": {"Ref": "TurnQueue"}, "AVM_TURN_HOST_CAPACITY": {"Ref": "TurnHostCapacity"},
        "AVM_TURN_HOST_MAX_CPU": "0.7", "AVM_CHAT_TURN_FUNCTION": {"Ref": "ChatTurnFunction.Alias"},
        "AVM_STREAM_MAX_FLUSH_MS": "2000", "AVM_HISTORY_HOT_DAYS": {"Ref": "HistoryHotDays"},
        "AVM_TABLE_NAME": {"Ref": "Table"}, "AVM_BUCKET": {"Ref": "Bucket"},
        "AVM_LLM_SECRET_ARN": {"Ref": "LlmSecretArn"}}
    # its CPU limit is the task's (the container's cgroup shows the machine's CPUs): one entry per size
    assert environment["AVM_TURN_HOST_VCPU"] == {"Fn::FindInMap": ["TurnHostVcpus", {"Ref": "TurnHostCpu"}, "Vcpus"]}
    vcpus = _template()["Mappings"]["TurnHostVcpus"]
    assert set(vcpus) == set(_template()["Parameters"]["TurnHostCpu"]["AllowedValues"])
    assert all(float(entry["Vcpus"]) == int(cpu) / 1024 for cpu, entry in vcpus.items())
    # the rest of chat_turn's environment, the container tier's included (a turn may escalate)
    chat_turn = _function("ChatTurnFunction")["Environment"]["Variables"]
    for key in ("AVM_WS_ENDPOINT", "AVM_CONFIG_PATH", "AVM_STREAM_FLUSH_MS", "AVM_RELIABLE_WRAPPER", "AVM_LOG_LEVEL",
                "AVM_ECS_CLUSTER", "AVM_ECS_TASK_DEFINITION", "AVM_ECS_SUBNETS", "AVM_ECS_SECURITY_GROUPS",
                "AVM_ECS_CONTAINER_NAME"):
        assert environment[key] in list(_branches(chat_turn[key])), key


def test_the_turn_host_task_role_is_exactly_what_a_turn_needs() -> None:
    grants = {(st["Sid"], tuple(sorted(_as_list(st["Action"])))): sorted(_text(r) for r in _as_list(st["Resource"]))
              for st in _role_statements("TurnHostTaskRole")}
    config = [CONFIG_PARAMETER_ARN, CONFIG_PARAMETER_ARN + "/*"]
    assert grants == {
        ("TableReadWrite", ("dynamodb:BatchGetItem", "dynamodb:BatchWriteItem", "dynamodb:ConditionCheckItem",
                            "dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query",
                            "dynamodb:UpdateItem")): ["${Table.Arn}"],
        ("TableIndexes", ("dynamodb:Query",)): ["${Table.Arn}/index/*"],
        ("PostToConnections", ("execute-api:ManageConnections",)): [
            WS_API_ARN_PREFIX + "${WebSocketStageName}/POST/@connections/*"],
        ("LargePayloads", ("s3:GetObject", "s3:PutObject")): ["${Bucket.Arn}/blobs/*", "${Bucket.Arn}/tmp/*"],
        ("ReadHistoryArchive", ("s3:GetObject",)): ["${Bucket.Arn}/archive/*"],
        ("MissingKeysAre404", ("s3:ListBucket",)): ["${Bucket.Arn}"],
        ("TakeTurns", ("sqs:DeleteMessage", "sqs:DeleteMessageBatch", "sqs:ReceiveMessage")): ["${TurnQueue.Arn}"],
        ("FallBackToChatTurn", ("lambda:InvokeFunction",)): ["${ChatTurnFunction.Alias}"],
        ("ReadConfig", ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath")): config,
        ("ReadLlmKey", ("secretsmanager:GetSecretValue",)): ["${LlmSecretArn}"],
    }
    (secret,) = [st for st in _resource("TurnHostTaskRole")["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
                 if "Fn::If" in st]
    assert secret["Fn::If"][0] == "HasLlmSecret" and secret["Fn::If"][2] == NO_VALUE
    # escalation to the sandbox: the same grant as chat_turn's, attached only with the tier
    roles = _resource("ChatTurnContainerTierPolicy")["Properties"]["Roles"]
    assert {"Fn::If": ["HasTurnHostTier", {"Ref": "TurnHostTaskRole"}, NO_VALUE]} in roles
    trust = _resource("TurnHostTaskRole")["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [st["Principal"] for st in trust] == [{"Service": "ecs-tasks.amazonaws.com"}]
    execution = {st["Sid"]: st for st in _role_statements("TurnHostExecutionRole")}
    assert set(execution) == {"EcrLogin", "EcrPull", "Logs"}
    assert execution["Logs"]["Resource"] == {"Fn::GetAtt": ["TurnHostLogGroup", "Arn"]}


def test_the_turn_hosts_scale_out_on_spilled_turns_and_in_to_zero_when_idle() -> None:
    target = _resource("TurnHostScalableTarget")["Properties"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, {"Ref": "TurnHostMaxTasks"})
    assert target["ServiceNamespace"] == "ecs" and target["ScalableDimension"] == "ecs:service:DesiredCount"
    assert _text(target["ResourceId"]) == "service/${WorkerCluster}/${TurnHostService.Name}"
    out = _resource("TurnHostScaleOut")["Properties"]
    scale_in = _resource("TurnHostScaleIn")["Properties"]
    for policy in (out, scale_in):
        assert policy["PolicyType"] == "StepScaling" and policy["ScalingTargetId"] == {"Ref": "TurnHostScalableTarget"}
    assert out["StepScalingPolicyConfiguration"] == {
        "AdjustmentType": "ChangeInCapacity", "Cooldown": 60, "MetricAggregationType": "Maximum",
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}
    assert scale_in["StepScalingPolicyConfiguration"]["StepAdjustments"] == [
        {"MetricIntervalUpperBound": 0, "ScalingAdjustment": -1}]
    demand = _resource("TurnHostDemandAlarm")["Properties"]
    assert {k: demand[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Period", "EvaluationPeriods",
                                   "DatapointsToAlarm", "Threshold", "ComparisonOperator", "AlarmActions")} == {
        "Namespace": "AWS/Lambda", "MetricName": "ConcurrentExecutions",
        "Dimensions": [{"Name": "FunctionName", "Value": {"Ref": "ChatTurnFunction"}}], "Statistic": "Maximum",
        "Period": 60, "EvaluationPeriods": 3, "DatapointsToAlarm": 2,
        "Threshold": {"Ref": "TurnHostScaleOutConcurrency"}, "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "AlarmActions": [{"Ref": "TurnHostScaleOut"}]}
    assert _template()["Parameters"]["TurnHostScaleOutConcurrency"]["Default"] == 2
    idle = _resource("TurnHostIdleAlarm")["Properties"]
    assert {k: idle[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Period", "EvaluationPeriods",
                                 "DatapointsToAlarm", "Threshold", "ComparisonOperator", "AlarmActions")} == {
        "Namespace": "AWS/ECS", "MetricName": "CPUUtilization",
        "Dimensions": [{"Name": "ClusterName", "Value": {"Ref": "WorkerCluster"}},
                       {"Name": "ServiceName", "Value": {"Fn::GetAtt": ["TurnHostService", "Name"]}}],
        "Statistic": "Average", "Period": 60, "EvaluationPeriods": 15, "DatapointsToAlarm": 15,
        "Threshold": {"Ref": "TurnHostScaleInCpuPercent"}, "ComparisonOperator": "LessThanThreshold",
        "AlarmActions": [{"Ref": "TurnHostScaleIn"}]}
    assert _template()["Parameters"]["TurnHostScaleInCpuPercent"]["Default"] == 15
    # the only alarms of the stack (0.10 USD a month each, the tier's whole idle cost)
    assert set(_resources("AWS::CloudWatch::Alarm")) == {"TurnHostDemandAlarm", "TurnHostIdleAlarm"}


# ------------------------------------------------------------------------------------------ translated by SAM

def test_sam_keeps_one_published_chat_turn_version_and_logs_json_everywhere() -> None:
    """The SAM translation itself (the SAM CLI venv's translator): chat_turn's generated
    AWS::Lambda::Version is deleted when a deploy replaces it, so one SnapStart snapshot stays cached."""
    sam = _sam_cli()
    if sam is None:
        pytest.skip("SAM CLI venv not found (.venv-sam/bin/sam; `make sam-cli` builds it, AVM_SAM_CLI overrides)")
    python = sam.parent / "python"
    script = (
        "import json, re, sys\n"
        "from samtranslator.translator.transform import transform\n"
        "from samtranslator.yaml_helper import yaml_parse\n"
        "text = re.sub(r'(CodeUri|ContentUri): \\S+', r'\\1: s3://bucket/key', open(sys.argv[1]).read())\n"
        "class Policies:  # no managed policy is looked up (IAM is not called)\n"
        "    def load(self): return {}\n"
        "print(json.dumps(transform(yaml_parse(text), {}, Policies())))\n")
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    result = subprocess.run([str(python), "-c", script, str(TEMPLATE)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    resources = json.loads(result.stdout)["Resources"]
    versions = {name: r for name, r in resources.items() if r["Type"] == "AWS::Lambda::Version"}
    assert len(versions) == 1 and next(iter(versions)).startswith("ChatTurnFunctionVersion")
    assert next(iter(versions.values()))["DeletionPolicy"] == "Delete"
    functions = {name: r for name, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    assert set(functions) == set(FUNCTIONS)
    for name, function in functions.items():
        assert function["Properties"]["LoggingConfig"]["SystemLogLevel"] == "WARN", name
    # the stream consumer's role carries only the inline grants (no managed stream policy on "*")
    assert resources["HistoryArchiveFunctionRole"]["Properties"]["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]


def test_the_archive_is_written_by_the_archiver_read_by_history_readers_and_deleted_with_sessions() -> None:
    archive = "${Bucket.Arn}/archive/*"

    def holders(action: str) -> set[str]:
        return {name for name in FUNCTIONS for st in _allowed(name, action)
                if archive in (_text(r) for r in _as_list(st["Resource"]))}

    assert holders("s3:PutObject") == {"HistoryArchiveFunction"}
    # every function that reads a session's messages or turns (the turn host too, below)
    assert holders("s3:GetObject") == {"WsDefaultFunction", "ChatTurnFunction", "ChatStreamFunction", "HttpApiFunction"}
    # where sessions and images are deleted: the AgentX commands and the HTTP app (on both functions)
    assert holders("s3:DeleteObject") == {"WsDefaultFunction", "ChatStreamFunction", "HttpApiFunction"}
    for name in holders("s3:GetObject"):  # S3 answers 404, not 403, for an object not archived yet
        assert [st for st in _allowed(name, "s3:ListBucket") if st["Resource"] == {"Fn::GetAtt": ["Bucket", "Arn"]}]
    # the worker task reads its own tenant's archive only, and lists only under it
    tenant = {st["Sid"]: st for st in _role_statements("TenantWorkerRole")}
    assert tenant["TenantHistoryArchive"]["Action"] == "s3:GetObject"
    assert _text(tenant["TenantHistoryArchive"]["Resource"]) == (
        "${Bucket.Arn}/archive/${!aws:PrincipalTag/agentvm-tenant}/*")
    assert tenant["ListTenantWorkspaces"]["Condition"] == {"StringLike": {"s3:prefix": [
        "workspaces/${aws:PrincipalTag/agentvm-tenant}/*", "archive/${aws:PrincipalTag/agentvm-tenant}/*"]}}
    # small objects (most archive batches) never move to a class that bills 128 KB minimum
    lifecycle = _resource("Bucket")["Properties"]["LifecycleConfiguration"]
    assert lifecycle["TransitionDefaultMinimumObjectSize"] == "all_storage_classes_128K"
