"""Two stacks of this template in one account and region: no physical name may be the same in both.

CloudFormation generates a unique name for every resource whose name the template leaves out; a
name the template sets (or SAM sets for it, like a ScheduleV2 event's `<Function><Event>` default)
must then depend on the stack: contain `${AWS::StackName}` or a resource of the stack. Checked on
the SAM translation (what CloudFormation gets), with every name evaluated for two stack names."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.template.template_model import _sam_transformed

#: The properties that name a resource account- or region-wide, by resource type.
PHYSICAL_NAMES = {
    "AWS::Lambda::Function": ("FunctionName",),
    "AWS::Lambda::LayerVersion": ("LayerName",),
    "AWS::DynamoDB::Table": ("TableName",),
    "AWS::S3::Bucket": ("BucketName",),
    "AWS::SQS::Queue": ("QueueName",),
    "AWS::SNS::Topic": ("TopicName",),
    "AWS::IAM::Role": ("RoleName",),
    "AWS::IAM::ManagedPolicy": ("ManagedPolicyName",),
    "AWS::Logs::LogGroup": ("LogGroupName",),
    "AWS::Scheduler::Schedule": ("Name",),
    "AWS::Scheduler::ScheduleGroup": ("Name",),
    "AWS::Events::Rule": ("Name",),
    "AWS::SSM::Parameter": ("Name",),
    "AWS::SecretsManager::Secret": ("Name",),
    "AWS::ECS::Cluster": ("ClusterName",),
    "AWS::ECS::TaskDefinition": ("Family",),
    "AWS::CloudWatch::Alarm": ("AlarmName",),
    "AWS::Budgets::Budget": ("BudgetName",),
    "AWS::ApiGatewayV2::Stage": (),  # scoped to its API
    "AWS::ApplicationAutoScaling::ScalingPolicy": ("PolicyName",),
}


def _name(value: Any, stack: str) -> str:
    """A name property as CloudFormation would resolve it in stack `stack`: the stack name substituted,
    a resource of the stack (Ref, GetAtt, `${Logical}`) as a name that contains the stack's."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (fn, arg), = value.items()
        if fn == "Ref":
            return stack if arg == "AWS::StackName" else f"{stack}-{arg}-generated"
        if fn == "Fn::GetAtt":
            return f"{stack}-{'.'.join(arg) if isinstance(arg, list) else arg}-generated"
        if fn == "Fn::Sub":
            text, names = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            return re.sub(r"\$\{([^}]+)\}", lambda m: _name(names.get(m.group(1), {"Ref": m.group(1)}), stack), text)
        if fn == "Fn::Join":
            return str(arg[0]).join(_name(v, stack) for v in arg[1])
    raise AssertionError(f"a name this check cannot evaluate: {value!r}")


def names(resources: dict[str, Any], stack: str) -> dict[str, str]:
    out = {}
    for logical, resource in resources.items():
        for prop in PHYSICAL_NAMES.get(resource["Type"], ()):
            value = resource.get("Properties", {}).get(prop)
            if value is not None:
                out[f"{logical}.{prop}"] = f"{resource['Type']}:{_name(value, stack)}"
    return out


def test_two_stacks_in_one_account_share_no_physical_name() -> None:
    transformed = _sam_transformed()
    if transformed is None:
        pytest.skip("SAM CLI venv not found (.venv-sam/bin/sam; `make sam-cli` builds it, AVM_SAM_CLI overrides)")
    resources = transformed["Resources"]
    dev, prod = names(resources, "agentvm-dev"), names(resources, "agentvm-prod")
    clashes = {key: dev[key] for key in dev if dev[key] == prod[key]}
    assert not clashes, f"the same physical name in both stacks: {clashes}"
    # the names the template does set are evaluated (the check is not vacuous): log groups, the config
    # parameter, the layer, the scaling policies, and the schedules SAM generates (no Name since OmitName)
    kinds = {key.split(".", 1)[1] for key in dev}
    assert {"LogGroupName", "Name", "LayerName", "PolicyName"} <= kinds, kinds
    schedules = [r for r in resources.values() if r["Type"] == "AWS::Scheduler::Schedule"]
    assert len(schedules) == 2 and not any("Name" in r["Properties"] for r in schedules)


def test_the_check_finds_a_fixed_name() -> None:
    """What SAM generated before `OmitName`: a ScheduleV2 event's schedule named after its function."""
    fixed = {"TurnSweepFunctionSweep": {"Type": "AWS::Scheduler::Schedule",
                                        "Properties": {"Name": "TurnSweepFunctionSweep"}},
             "Logs": {"Type": "AWS::Logs::LogGroup",
                      "Properties": {"LogGroupName": {"Fn::Sub": "/aws/lambda/${Fn}"}}}}
    dev, prod = names(fixed, "dev"), names(fixed, "prod")
    assert dev["TurnSweepFunctionSweep.Name"] == prod["TurnSweepFunctionSweep.Name"]
    assert dev["Logs.LogGroupName"] != prod["Logs.LogGroupName"]
