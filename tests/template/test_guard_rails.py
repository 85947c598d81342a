"""The guard rails of template.yaml (issue 18, finding 3): the alarms and their optional SNS topic, the
optional budget, chat_turn's OnFailure destination, the reserved concurrency of the turn runners and the
per-route WebSocket throttles; on the source template and on the template SAM hands CloudFormation."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from tests.bench.cost_inputs import Assumptions
from tests.template.template_model import (
    FUNCTIONS,
    NO_VALUE,
    _function,
    _resource,
    _resources,
    _sam_transformed,
    _template,
)

#: Every stack's guard alarms → (namespace, metric, statistic, threshold, dimensions).
FN = "FunctionName"
WS = {"ApiId": {"Ref": "WebSocketApi"}, "Stage": {"Ref": "WebSocketStageName"}}
CORE: dict[str, tuple[str, str, str, Any, dict[str, Any]]] = {
    "ChatTurnErrorsAlarm": ("AWS/Lambda", "Errors", "Sum", 1, {FN: {"Ref": "ChatTurnFunction"}}),
    "ChatTurnDurationAlarm": ("AWS/Lambda", "Duration", "Maximum", 720000, {FN: {"Ref": "ChatTurnFunction"}}),
    "ChatTurnThrottlesAlarm": ("AWS/Lambda", "Throttles", "Sum", 1, {FN: {"Ref": "ChatTurnFunction"}}),
    "ChatStreamThrottlesAlarm": ("AWS/Lambda", "Throttles", "Sum", 1, {FN: {"Ref": "ChatStreamFunction"}}),
    "WebSocketExecutionErrorAlarm": ("AWS/ApiGateway", "ExecutionError", "Sum", 1, WS),
    "HttpApi5xxAlarm": ("AWS/ApiGateway", "5xx", "Sum", 5, {"ApiId": {"Ref": "HttpApi"}, "Stage": "$default"}),
    "TableWriteThrottleAlarm": ("AWS/DynamoDB", "WriteThrottleEvents", "Sum", 1, {"TableName": {"Ref": "Table"}}),
    "DeadLetterAlarm": ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum", 1,
                        {"QueueName": {"Fn::GetAtt": ["ArchiveFailures", "QueueName"]}}),
}
#: What DetailedAlarms=Enabled adds: errors of every other function, two throttles, reads, WebSocket answers.
DETAILED: dict[str, tuple[str, str, str, Any, dict[str, Any]]] = {
    **{f"{name.removesuffix('Function')}ErrorsAlarm": ("AWS/Lambda", "Errors", "Sum", 1, {FN: {"Ref": name}})
       for name in FUNCTIONS if name != "ChatTurnFunction"},
    **{f"{name.removesuffix('Function')}ThrottlesAlarm": ("AWS/Lambda", "Throttles", "Sum", 1, {FN: {"Ref": name}})
       for name in ("WsConnectFunction", "WsDefaultFunction")},
    "TableReadThrottleAlarm": ("AWS/DynamoDB", "ReadThrottleEvents", "Sum", 1, {"TableName": {"Ref": "Table"}}),
    "WebSocketIntegrationErrorAlarm": ("AWS/ApiGateway", "IntegrationError", "Sum", 25, WS),
}
ACTIONS = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], NO_VALUE]}
#: AWS's default Lambda concurrency quota of an account, and the part it always keeps unreserved.
ACCOUNT_QUOTA, UNRESERVED_MINIMUM = 1000, 100


def _guard_alarms() -> dict[str, dict[str, Any]]:
    return {name: a for name, a in _resources("AWS::CloudWatch::Alarm").items()
            if a.get("Condition") != "HasTurnHostTier"}


def test_the_guard_alarms_are_exactly_these_and_the_cost_model_prices_them() -> None:
    alarms = _guard_alarms()
    assert set(alarms) == set(CORE) | set(DETAILED)
    assert {name for name, a in alarms.items() if "Condition" not in a} == set(CORE)
    assert {name for name, a in alarms.items() if a.get("Condition") == "DetailedAlarmsEnabled"} == set(DETAILED)
    assert _template()["Conditions"]["DetailedAlarmsEnabled"] == {"Fn::Equals": [{"Ref": "DetailedAlarms"}, "Enabled"]}
    assert _template()["Parameters"]["DetailedAlarms"]["Default"] == "Disabled"
    # one metric each (CloudWatch bills per metric an alarm reads): the count is the price
    assert all("Metrics" not in a["Properties"] for a in alarms.values())
    assert (len(CORE), len(DETAILED)) == (8, 13) == (Assumptions().guard_alarms, Assumptions().detailed_alarm_count)
    for name, (namespace, metric, statistic, threshold, dimensions) in {**CORE, **DETAILED}.items():
        props = alarms[name]["Properties"]
        assert (props["Namespace"], props["MetricName"], props["Statistic"], props["Threshold"]) == (
            namespace, metric, statistic, threshold), name
        assert {d["Name"]: d["Value"] for d in props["Dimensions"]} == dimensions, name
        assert (props["AlarmActions"], props["OKActions"]) == (ACTIONS, ACTIONS), name
        assert props["TreatMissingData"] == "notBreaching", f"{name}: an idle stack is not in alarm"
        assert (props["ComparisonOperator"], props["EvaluationPeriods"], props["Period"]) == (
            "GreaterThanOrEqualToThreshold", 1, 300), name
        assert "AlarmName" not in props, f"{name}: a fixed name collides with a second stack"
    # every function's errors are watched with DetailedAlarms; chat_turn's (failed turns) always
    errors = {a["Properties"]["Dimensions"][0]["Value"]["Ref"] for a in alarms.values()
              if a["Properties"]["MetricName"] == "Errors"}
    assert errors == set(FUNCTIONS)
    # 80 % of chat_turn's timeout: turns about to be killed by it
    assert CORE["ChatTurnDurationAlarm"][3] == _function("ChatTurnFunction")["Timeout"] * 800


def test_the_alarm_topic_is_optional_and_validated() -> None:
    param = _template()["Parameters"]["AlarmTopicArn"]
    assert param["Default"] == ""
    assert _template()["Conditions"]["HasAlarmTopic"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}
    pattern = param["AllowedPattern"]
    for good in ("", "arn:aws:sns:eu-west-1:123456789012:ops-alerts", "arn:aws-cn:sns:cn-north-1:123456789012:a.fifo"):
        assert re.fullmatch(pattern, good), good
    for bad in ("ops-alerts", "arn:aws:sqs:eu-west-1:123456789012:q", "arn:aws:sns:eu-west-1:1234:t"):
        assert not re.fullmatch(pattern, bad), bad


def test_the_budget_exists_only_with_an_amount_and_an_address() -> None:
    params, conditions = _template()["Parameters"], _template()["Conditions"]
    assert (params["BudgetMonthlyUsd"]["Default"], params["BudgetEmail"]["Default"]) == (0, "")
    assert conditions["HasBudget"] == {"Fn::And": [
        {"Fn::Not": [{"Fn::Equals": [{"Ref": "BudgetMonthlyUsd"}, "0"]}]},
        {"Fn::Not": [{"Fn::Equals": [{"Ref": "BudgetEmail"}, ""]}]}]}
    assert re.fullmatch(params["BudgetEmail"]["AllowedPattern"], "ops@example.com")
    assert not re.fullmatch(params["BudgetEmail"]["AllowedPattern"], "ops at example")
    budget = _resource("CostBudget")
    assert budget["Condition"] == "HasBudget"
    props = budget["Properties"]
    assert props["Budget"] == {"BudgetType": "COST", "TimeUnit": "MONTHLY",
                               "BudgetLimit": {"Amount": {"Ref": "BudgetMonthlyUsd"}, "Unit": "USD"}}
    assert "BudgetName" not in props["Budget"], "a fixed name collides with a second stack"
    notes = [(n["Notification"]["NotificationType"], n["Notification"]["Threshold"], n["Subscribers"])
             for n in props["NotificationsWithSubscribers"]]
    email = [{"SubscriptionType": "EMAIL", "Address": {"Ref": "BudgetEmail"}}]
    assert notes == [("ACTUAL", 80, email), ("FORECASTED", 100, email)]


def test_a_failed_chat_turn_goes_to_turn_failed_at_once_and_turn_failed_to_the_dead_letters() -> None:
    chat = _function("ChatTurnFunction")["EventInvokeConfig"]
    # no retry: the lease names the request id, which a retry keeps (and a retry pays the LLM again)
    assert chat["MaximumRetryAttempts"] == 0
    assert chat["DestinationConfig"] == {"OnFailure": {"Type": "Lambda",
                                                       "Destination": {"Fn::GetAtt": ["TurnFailedFunction", "Arn"]}}}
    failed = _function("TurnFailedFunction")
    assert failed["EventInvokeConfig"]["MaximumRetryAttempts"] == 2
    # the stack's one dead-letter queue (DeadLetterAlarm), with the archive's failed batches
    assert failed["EventInvokeConfig"]["DestinationConfig"] == {
        "OnFailure": {"Type": "SQS", "Destination": {"Fn::GetAtt": ["ArchiveFailures", "Arn"]}}}
    assert failed["Environment"]["Variables"]["AVM_CHAT_TURN_FUNCTION"] == {"Ref": "ChatTurnFunction.Alias"}
    assert "Events" not in failed, "turn_failed is invoked only by Lambda, as chat_turn's destination"
    assert _resource("ArchiveFailures")["Properties"]["MessageRetentionPeriod"] == 1209600
    assert "LlmSecretArn" not in str(_resource("TurnFailedFunction")), "it calls no model"


def test_only_the_turn_runners_reserve_concurrency_within_the_default_quota() -> None:
    params, conditions = _template()["Parameters"], _template()["Conditions"]
    reserved = {name: _function(name).get("ReservedConcurrentExecutions") for name in FUNCTIONS}
    assert {name for name, value in reserved.items() if value is not None} == {"ChatTurnFunction", "ChatStreamFunction"}
    defaults = 0
    for name, parameter in (("ChatTurnFunction", "ChatTurnReservedConcurrency"),
                            ("ChatStreamFunction", "ChatStreamReservedConcurrency")):
        condition = parameter.removesuffix("Concurrency")
        assert reserved[name] == {"Fn::If": [condition, {"Ref": parameter}, NO_VALUE]}
        assert conditions[condition] == {"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, "0"]}]}
        assert params[parameter]["MinValue"] == 0  # 0: no reservation (an account with a small quota)
        defaults += params[parameter]["Default"]
    # the defaults fit the default quota with room for everything else (docs/cloud-design.md, Guard rails)
    assert defaults == 600 and ACCOUNT_QUOTA - defaults >= UNRESERVED_MINIMUM + front_door_need()


def front_door_need() -> int:
    """Concurrency the unreserved functions need at the API throttles' steady-state limits, at a
    pessimistic 1 s per invocation (warm ones take 20-100 ms): WebSocket stage + HTTP API."""
    params = _template()["Parameters"]
    return int(params["WebSocketThrottleRate"]["Default"]) + int(params["HttpThrottleRate"]["Default"])


def test_connects_have_their_own_throttle_below_the_stage() -> None:
    stage = _resource("WebSocketStage")["Properties"]
    connect = stage["RouteSettings"]["$connect"]
    assert (connect["ThrottlingRateLimit"], connect["ThrottlingBurstLimit"]) == (
        {"Ref": "WebSocketConnectThrottleRate"}, {"Ref": "WebSocketConnectThrottleBurst"})
    assert (connect["DetailedMetricsEnabled"], connect["DataTraceEnabled"], connect["LoggingLevel"]) == (
        False, False, "OFF")
    params = _template()["Parameters"]
    assert params["WebSocketConnectThrottleRate"]["Default"] <= params["WebSocketThrottleRate"]["Default"]
    assert params["WebSocketConnectThrottleBurst"]["Default"] <= params["WebSocketThrottleBurst"]["Default"]
    assert set(stage["RouteSettings"]) == {"$connect"}  # $default and $disconnect: the stage's limits


def test_sam_wires_the_destinations_and_their_permissions() -> None:
    transformed = _sam_transformed()
    if transformed is None:
        pytest.skip("no SAM CLI venv (.venv-sam): the translation is checked where it is installed")
    resources = transformed["Resources"]
    configs = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "AWS::Lambda::EventInvokeConfig"}
    chat = configs["ChatTurnFunctionEventInvokeConfig"]
    # on the alias ws_default and the sweep invoke (an unqualified config would not apply to it)
    assert (chat["Qualifier"], chat["FunctionName"], chat["MaximumRetryAttempts"]) == (
        "live", {"Ref": "ChatTurnFunction"}, 0)
    assert chat["DestinationConfig"] == {"OnFailure": {"Destination": {"Fn::GetAtt": ["TurnFailedFunction", "Arn"]}}}
    failed = configs["TurnFailedFunctionEventInvokeConfig"]
    assert failed["DestinationConfig"] == {"OnFailure": {"Destination": {"Fn::GetAtt": ["ArchiveFailures", "Arn"]}}}

    def generated(role: str, suffix: str) -> list[dict[str, Any]]:
        [policy] = [p for p in resources[role]["Properties"]["Policies"] if p["PolicyName"].endswith(suffix)]
        return list(policy["PolicyDocument"]["Statement"])

    # the execution role delivers to the destination: chat_turn may invoke turn_failed, nothing else
    assert generated("ChatTurnFunctionRole", "OnFailureLambdaPolicy") == [
        {"Action": "lambda:InvokeFunction", "Effect": "Allow",
         "Resource": {"Fn::GetAtt": ["TurnFailedFunction", "Arn"]}}]
    assert generated("TurnFailedFunctionRole", "OnFailureSQSPolicy") == [
        {"Action": "sqs:SendMessage", "Effect": "Allow", "Resource": {"Fn::GetAtt": ["ArchiveFailures", "Arn"]}}]
    for name in ("ChatTurnFunction", "ChatStreamFunction"):
        value = resources[name]["Properties"]["ReservedConcurrentExecutions"]
        assert value["Fn::If"][0] in transformed["Conditions"], name
    # every function an alarm names is a function of the stack
    functions = {name for name, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    named = {d["Value"]["Ref"] for name, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"
             for d in r["Properties"].get("Dimensions", []) if d["Name"] == "FunctionName"}
    assert named == set(FUNCTIONS) and named <= functions


def test_the_guard_rails_cost_what_the_parameters_say() -> None:
    from tests.bench.cost_prices import US_EAST_1

    a = Assumptions()
    assert US_EAST_1.alarm_month.cost(Decimal(a.guard_alarms)) == Decimal("0.80")
    assert US_EAST_1.alarm_month.cost(Decimal(a.detailed_alarm_count)) == Decimal("1.30")
    text = _template()["Parameters"]["DetailedAlarms"]["Description"]
    assert "8 guard-rail alarms (0.80 USD a month)" in text and "adds 13" in text and "(1.30 USD a month more)" in text
