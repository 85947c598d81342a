"""template.yaml: the linters, the DynamoDB schema, and the cost and security rules of the cloud tier.

cfn-lint comes from the project venv (the `dev` extra); `sam validate` from the separate SAM CLI venv
that `make test` builds (`$(SAM_VENV)`, default `.venv-sam`; its boto3 pin conflicts with the project's).
A missing tool skips its test with the reason; the structural checks need neither.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.template.conditions import stack
from tests.template.template_model import (
    CHAT_TURN_STARTERS,
    CONFIG_PARAMETER_ARN,
    CONFIG_WRITERS,
    FUNCTIONS,
    LAYER_MUST_HAVE,
    LAYER_REQUIREMENTS,
    LINT_REGIONS,
    NO_VALUE,
    NOT_IN_LAYER,
    ROOT,
    SCHEDULED,
    STREAM_CONSUMERS,
    STREAM_READ,
    TEMPLATE,
    TURN_DISPATCHERS,
    TURN_QUEUE_ARN,
    TURN_RUNNERS,
    WEB_ADAPTER,
    WS_API_ARN_PREFIX,
    _allowed,
    _as_list,
    _function,
    _resource,
    _resources,
    _sam_cli,
    _statements,
    _template,
    _text,
    _walk,
)

# ------------------------------------------------------------------------------------------ linters

def test_cfn_lint_passes_including_informational_rules() -> None:
    if importlib.util.find_spec("cfnlint") is None:
        pytest.skip("cfn-lint is not installed in this environment (it belongs to the `dev` extra)")
    command = [sys.executable, "-c", "from cfnlint.runner import main; main()",
               "--include-checks", "I", "--regions", *LINT_REGIONS, "--", str(TEMPLATE)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"cfn-lint found problems:\n{result.stdout}{result.stderr}"


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
        condition, own, published = function["Layers"][1]["Fn::If"]
        assert (condition, own) == ("HasWebAdapterLayerArn", {"Ref": "WebAdapterLayerArn"})
        assert _text(published).endswith(":753240598075:layer:LambdaAdapterLayerArm64:${WebAdapterLayerVersion}")
        pattern = parameters["WebAdapterLayerArn"]["AllowedPattern"]
        assert parameters["WebAdapterLayerArn"]["Default"] == "" and re.fullmatch(pattern, "")
        assert re.fullmatch(pattern, "arn:aws-cn:lambda:cn-north-1:041581134020:layer:LambdaAdapterLayerArm64:25")
        assert not re.fullmatch(pattern, "LambdaAdapterLayerArm64:25")
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
    elif name == "UsageExportFunction":  # CPU-bound: one vCPU costs the same GB-seconds a record, runs faster
        assert memory == 1769
    else:
        assert 256 <= memory <= 512
    limit = 900 if name in (*TURN_RUNNERS, "UsageExportFunction") else 300 if name in SCHEDULED + STREAM_CONSUMERS \
        else 29
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
                    "AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::VPCEndpoint"}
    for name, resource in _resources().items():
        if resource["Type"].startswith("AWS::EC2::"):
            assert resource["Type"] in free_network, name
            # the load balancer front's security groups (WebSocketFront=LoadBalancer, test_front.py)
            assert resource.get("Condition") in ("HasWorkerImage", "LoadBalancerFront"), name
            if resource["Type"] == "AWS::EC2::VPCEndpoint":
                assert resource["Properties"]["VpcEndpointType"] == "Gateway", name
    assert "AWS::EC2::NatGateway" not in types
    # ECS: tasks are started on demand (no instances); the one service is the turn hosts', at 0 tasks
    # unless Application Auto Scaling (minimum 0) adds some
    assert not types & {"AWS::AutoScaling::AutoScalingGroup", "AWS::EC2::Instance", "AWS::ECS::CapacityProvider"}
    # (with the default WebSocketFront; the load balancer front keeps one task: test_front.py)
    services = _resources("AWS::ECS::Service")
    assert list(services) == ["TurnHostService"]
    created, _ = stack(WorkerImageUri="123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1")
    assert created["TurnHostService"]["Properties"]["DesiredCount"] == 0
    targets = {name: r for name, r in created.items() if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"}
    assert [t["Properties"]["MinCapacity"] for t in targets.values()] == [0]
    # (ReservedConcurrentExecutions is free: tests/template/test_guard_rails.py)
    forbidden = {"ProvisionedConcurrencyConfig", "ProvisionedConcurrentExecutions", "ProvisionedThroughput",
                 "VpcConfig"}
    assert not [key for key, _ in _walk(_template()) if key in forbidden]
    expensive = {"AWS::ElasticLoadBalancingV2::LoadBalancer", "AWS::RDS::DBInstance", "AWS::RDS::DBCluster",
                 "AWS::ElastiCache::CacheCluster", "AWS::KMS::Key", "AWS::ApiGateway::RestApi"}
    assert not {r["Type"] for r in created.values()} & expensive
    # the one exception: the load balancer front, only when asked for (WebSocketFront=LoadBalancer)
    assert {name for name, r in _resources().items() if r["Type"] in expensive} == {"FrontLoadBalancer"}
    assert _resource("FrontLoadBalancer")["Condition"] == "LoadBalancerFront"
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
    assert "Events" not in chat, "chat_turn is only invoked asynchronously (by ws_default, turn_sweep, turn_failed)"


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

#: The functions that call LLMs: they read the LLM key and may invoke Bedrock models.
LLM_CALLERS = {"ChatTurnFunction", "HttpApiFunction", "ChatStreamFunction"}
BEDROCK_INVOKE = ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
BEDROCK_MODEL_ARNS = ("arn:${AWS::Partition}:bedrock:*::foundation-model/${BedrockModels}",
                      "arn:${AWS::Partition}:bedrock:*:${AWS::AccountId}:inference-profile/*${BedrockModels}")


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
                # only the HTTP apps (http_api, chat_stream: PUT/DELETE /v1/config/{key}) write the config
                # center's runtime layer, and only under its path
                writes = {"ssm:PutParameter", "ssm:DeleteParameter"} if name in CONFIG_WRITERS else set()
                assert set(actions) <= reads | writes, f"{name}: {actions}"
                if set(actions) & writes:
                    assert text == CONFIG_PARAMETER_ARN + "/*", f"{name}: writes {text}"
                assert text in (CONFIG_PARAMETER_ARN, CONFIG_PARAMETER_ARN + "/*"), f"{name}: {text}"
            elif service == "secretsmanager":
                assert actions == ["secretsmanager:GetSecretValue"] and resource == {"Ref": "LlmSecretArn"}
            elif service == "bedrock":  # only the LLM callers, only invoking, only the models BedrockModels names
                assert name in LLM_CALLERS and actions == BEDROCK_INVOKE, f"{name}: {actions}"
                assert text in BEDROCK_MODEL_ARNS, f"{name}: {text}"
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
    assert callers == {"WsDefaultFunction", "ChatTurnFunction", "ChatStreamFunction", "TurnFailedFunction"}
    pattern = re.escape(WS_API_ARN_PREFIX) + r"(\$\{WebSocketStageName\}|\*)/(POST|GET|DELETE)/@connections/\*"
    for name in callers:
        for statement in _allowed(name, "execute-api:ManageConnections"):
            for resource in _as_list(statement["Resource"]):
                assert re.fullmatch(pattern, _text(resource)), f"{name}: {_text(resource)}"


def test_only_ws_default_the_sweep_and_turn_failed_may_invoke_chat_turn() -> None:
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
    assert readers == LLM_CALLERS
    for name in readers:
        conditional = {statement["Fn::If"][0]: statement["Fn::If"][1]["Sid"]
                       for statement in _resource(name)["Properties"]["Policies"][0]["Statement"]
                       if "Fn::If" in statement and statement["Fn::If"][2] == NO_VALUE}
        # the key only with a secret; Bedrock only when the deployment names its models (blank: no grant)
        assert conditional == {"HasLlmSecret": "ReadLlmKey", "HasBedrockModels": "InvokeBedrockModels"}, name
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
        "OmitName": True,  # named per stack by CloudFormation (tests/template/test_stacks.py)
        "ScheduleExpression": "cron(15 0 * * ? *)", "ScheduleExpressionTimezone": "UTC",
        "RetryPolicy": {"MaximumRetryAttempts": 2}}}]
    s3 = [st for st in _statements("UsageExportFunction") if _as_list(st["Action"])[0].startswith("s3:")]
    assert [(_as_list(st["Action"]), _text(st["Resource"]), st.get("Condition")) for st in s3] == [
        # multipart, and the daily files copied into the monthly one (s3_upload.py, focus_export.py)
        (["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"], "${Bucket.Arn}/exports/*", None),
        # which days have their file: only that prefix is listed
        (["s3:ListBucket"], "${Bucket.Arn}",
         {"StringLike": {"s3:prefix": "exports/focus/daily/*"}})]
    # streamed: one vCPU for a CPU-bound run, and Lambda's longest (tests/cloud/test_usage_export_stream.py)
    assert (_function("UsageExportFunction")["MemorySize"], _function("UsageExportFunction")["Timeout"]) == (1769, 900)


def test_the_turn_sweep_runs_on_a_schedule_and_only_reads_and_starts_chat_turn() -> None:
    events = _function("TurnSweepFunction")["Events"]
    assert list(events.values()) == [{"Type": "ScheduleV2", "Properties": {
        "OmitName": True, "ScheduleExpression": {"Ref": "TurnSweepSchedule"},
        "RetryPolicy": {"MaximumRetryAttempts": 0}}}]
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
    _, default = stack()  # WebSocketFront=LoadBalancer names the load balancer instead (test_front.py)
    assert _text(default["WebSocketUrl"]["Value"]).startswith("wss://${WebSocketApi}.execute-api.")
    assert _text(default["WebSocketUrl"]["Value"]).endswith("/${WebSocketStageName}")
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


def test_cross_origin_access_is_a_parameter_off_by_default() -> None:
    """A web console on another origin may call the HTTP API and the streaming Function URL only when
    the operator names its origin (issue 18, finding 4). The apps answer CORS themselves
    (AVM_CORS_ORIGINS, tests/api/test_cors.py): neither the API nor the URL configures it."""
    parameter = _template()["Parameters"]["CorsAllowedOrigins"]
    assert (parameter["Type"], parameter["Default"]) == ("CommaDelimitedList", "")
    assert _template()["Globals"]["Function"]["Environment"]["Variables"]["AVM_CORS_ORIGINS"] == {
        "Fn::Join": [",", {"Ref": "CorsAllowedOrigins"}]}
    assert "Cors" not in _function("ChatStreamFunction")["FunctionUrlConfig"]
    assert "CorsConfiguration" not in _resource("HttpApi")["Properties"]
