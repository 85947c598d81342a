"""template.yaml for issue 17: the turn-host tier (only with a worker image and TurnHostTier), the
history archive (the table's stream, the archive function, who touches archive/), and the cost
settings (JSON logs without platform lines, the PITR parameter, one kept SnapStart version)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from agentvm.turnhost.host import HostOptions
from tests.template.conditions import stack
from tests.template.template_model import (
    CONFIG_PARAMETER_ARN,
    FUNCTIONS,
    NO_VALUE,
    STREAM_READ,
    TURN_DISPATCHERS,
    TURN_HOST_RESOURCES,
    TURN_QUEUE_ARN,
    WS_API_ARN_PREFIX,
    _allowed,
    _as_list,
    _branches,
    _function,
    _resource,
    _resources,
    _role_statements,
    _sam_transformed,
    _statements,
    _template,
    _text,
)

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
    # with the default WebSocketFront (the load balancer front keeps one task: test_front.py)
    created, _ = stack(WorkerImageUri="123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1")
    service = created["TurnHostService"]["Properties"]
    assert service["DesiredCount"] == 0
    assert "LaunchType" not in service and service["Cluster"] == {"Ref": "WorkerCluster"}
    assert service["CapacityProviderStrategy"] == [{"CapacityProvider": "FARGATE_SPOT", "Weight": 1}]  # default
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
    # SIGTERM (scale-in, a Fargate Spot interruption's two-minute warning): the drain, then the interrupted
    # turns' grace (HostOptions.abort_grace_s), both before ECS's SIGKILL
    drain_s = next(float(e["Value"]) for e in container["Environment"] if e.get("Name") == "AVM_TURN_HOST_DRAIN_S")
    assert drain_s + HostOptions().abort_grace_s <= container["StopTimeout"] == 120
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


def test_the_turn_host_capacity_provider_spot_by_default_on_demand_for_the_front_s_one_task() -> None:
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1"
    parameter = _template()["Parameters"]["TurnHostCapacityProvider"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("FargateSpot", ["FargateSpot", "Fargate"])
    front = {"WebSocketFront": "LoadBalancer",
             "LoadBalancerCertificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/abc"}
    cases = {
        (): [{"CapacityProvider": "FARGATE_SPOT", "Weight": 1}],
        (("TurnHostCapacityProvider", "Fargate"),): [{"CapacityProvider": "FARGATE", "Weight": 1}],
        tuple(front.items()): [{"CapacityProvider": "FARGATE", "Base": 1, "Weight": 0},
                               {"CapacityProvider": "FARGATE_SPOT", "Weight": 1}],
        (*front.items(), ("TurnHostCapacityProvider", "Fargate")): [{"CapacityProvider": "FARGATE", "Weight": 1}],
    }
    for given, strategy in cases.items():
        created, _ = stack(WorkerImageUri=image, **dict(given))
        service = created["TurnHostService"]["Properties"]
        assert service["CapacityProviderStrategy"] == strategy, given
        assert "LaunchType" not in service
        # a strategy names only providers associated with the cluster
        assert created["WorkerCluster"]["Properties"]["CapacityProviders"] == ["FARGATE", "FARGATE_SPOT"]
    # the worker tasks keep their launch type (RunTask with launchType FARGATE)
    assert _resource("WorkerTaskDefinition")["Properties"]["RequiresCompatibilities"] == ["FARGATE"]


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
        ("TakeTurns", ("sqs:DeleteMessage", "sqs:ReceiveMessage")): ["${TurnQueue.Arn}"],
        ("FallBackToChatTurn", ("lambda:InvokeFunction",)): ["${ChatTurnFunction.Alias}"],
        ("ReadConfig", ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath")): config,
        ("ReadLlmKey", ("secretsmanager:GetSecretValue",)): ["${LlmSecretArn}"],
        ("InvokeBedrockModels", ("bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream")): [
            "arn:${AWS::Partition}:bedrock:*:${AWS::AccountId}:inference-profile/*${BedrockModels}",
            "arn:${AWS::Partition}:bedrock:*::foundation-model/${BedrockModels}"],
        # with its own WebSocket front (WebSocketFront=LoadBalancer): ws_default's dispatch and deletes
        ("SendTurnsToHosts", ("sqs:SendMessage",)): ["${TurnQueue.Arn}"],
        ("DeleteArchivedHistory", ("s3:DeleteObject",)): ["${Bucket.Arn}/archive/*"],
    }
    secret, bedrock, *front = [st for st in _resource("TurnHostTaskRole")["Properties"]["Policies"][0]
                               ["PolicyDocument"]["Statement"] if "Fn::If" in st]
    assert secret["Fn::If"][0] == "HasLlmSecret" and secret["Fn::If"][2] == NO_VALUE
    assert bedrock["Fn::If"][0] == "HasBedrockModels" and bedrock["Fn::If"][2] == NO_VALUE
    assert [(st["Fn::If"][0], st["Fn::If"][2]) for st in front] == [("LoadBalancerFront", NO_VALUE)] * 2
    # escalation to the sandbox: the same grant as chat_turn's, attached only with the tier
    roles = _resource("ChatTurnContainerTierPolicy")["Properties"]["Roles"]
    assert {"Fn::If": ["HasTurnHostTier", {"Ref": "TurnHostTaskRole"}, NO_VALUE]} in roles
    trust = _resource("TurnHostTaskRole")["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [st["Principal"] for st in trust] == [{"Service": "ecs-tasks.amazonaws.com"}]
    execution = {st["Sid"]: st for st in _role_statements("TurnHostExecutionRole")}
    assert set(execution) == {"EcrLogin", "EcrPull", "Logs"}
    assert execution["Logs"]["Resource"] == {"Fn::GetAtt": ["TurnHostLogGroup", "Arn"]}


def test_the_turn_hosts_scale_out_on_spilled_turns_and_in_to_zero_when_idle() -> None:
    created, _ = stack(WorkerImageUri="123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1")
    target = created["TurnHostScalableTarget"]["Properties"]
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
    # docs/cost-model.md, crossover: a 0.5 vCPU host pays for itself from about 2.2 concurrent turns
    assert _template()["Parameters"]["TurnHostScaleOutConcurrency"]["Default"] == 3
    idle = _resource("TurnHostIdleAlarm")["Properties"]
    assert {k: idle[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Period", "EvaluationPeriods",
                                 "DatapointsToAlarm", "Threshold", "ComparisonOperator", "AlarmActions")} == {
        "Namespace": "AgentVM", "MetricName": "HostRunningTurns",
        "Dimensions": [{"Name": "function", "Value": "turn_host"}, {"Name": "service", "Value": "agentvm"}],
        "Statistic": "Average", "Period": 60, "EvaluationPeriods": 15, "DatapointsToAlarm": 15,
        "Threshold": {"Ref": "TurnHostScaleInTurns"}, "ComparisonOperator": "LessThanThreshold",
        "AlarmActions": [{"Ref": "TurnHostScaleIn"}]}
    params = _template()["Parameters"]
    # below the scale-out threshold: a host is stopped only where chat_turn would not start one again
    assert params["TurnHostScaleInTurns"]["Default"] == 1 < params["TurnHostScaleOutConcurrency"]["Default"]
    # the metric and dimensions the hosts publish (turnhost/__main__.py)
    from agentvm.turnhost.__main__ import RUNNING_METRIC
    assert idle["MetricName"] == RUNNING_METRIC
    # the tier's only alarms (0.10 USD a month each, the tier's whole idle cost); the guard rails' exist
    # whatever the tiers (test_guard_rails.py)
    assert {name for name, alarm in _resources("AWS::CloudWatch::Alarm").items()
            if alarm.get("Condition") == "HasTurnHostTier"} == {"TurnHostDemandAlarm", "TurnHostIdleAlarm"}


# ------------------------------------------------------------------------------------------ translated by SAM

def test_sam_keeps_one_published_chat_turn_version_and_logs_json_everywhere() -> None:
    """The SAM translation itself (the SAM CLI venv's translator): chat_turn's generated
    AWS::Lambda::Version is deleted when a deploy replaces it, so one SnapStart snapshot stays cached."""
    transformed = _sam_transformed()
    if transformed is None:
        pytest.skip("SAM CLI venv not found (.venv-sam/bin/sam; `make sam-cli` builds it, AVM_SAM_CLI overrides)")
    resources = transformed["Resources"]
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
    assert holders("s3:GetObject") == {"WsDefaultFunction", "ChatTurnFunction", "ChatStreamFunction", "HttpApiFunction",
                                       "TurnFailedFunction"}
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
