"""The WebSocket front of template.yaml (`WebSocketFront`): API Gateway by default; with
`LoadBalancer` an internet-facing ALB in front of the turn hosts, which terminate the WebSockets
themselves. Each test evaluates the template's conditions for a set of parameters and reads the
resources, properties and outputs CloudFormation would create."""

from __future__ import annotations

from typing import Any

from tests.template.conditions import stack as _stack
from tests.template.template_model import _template

FRONT_RESOURCES = {
    "FrontLoadBalancerSecurityGroup": "AWS::EC2::SecurityGroup",
    "TurnHostFrontSecurityGroup": "AWS::EC2::SecurityGroup",
    "TurnHostPeerIngress": "AWS::EC2::SecurityGroupIngress",
    "FrontLoadBalancer": "AWS::ElasticLoadBalancingV2::LoadBalancer",
    "FrontTargetGroup": "AWS::ElasticLoadBalancingV2::TargetGroup",
    "FrontListener": "AWS::ElasticLoadBalancingV2::Listener",
}
CERT = "arn:aws:acm:us-east-1:123456789012:certificate/0f4a0b6e-1111-2222-3333-444455556666"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/agentvm-worker:1"
def _env(resources: dict[str, Any]) -> dict[str, Any]:
    (container,) = resources["TurnHostTaskDefinition"]["Properties"]["ContainerDefinitions"]
    return {e["Name"]: e["Value"] for e in container["Environment"]}


def test_the_front_parameters_and_the_rule_that_refuses_a_load_balancer_without_its_needs() -> None:
    params = _template()["Parameters"]
    assert (params["WebSocketFront"]["Default"], params["WebSocketFront"]["AllowedValues"]) == (
        "ApiGateway", ["ApiGateway", "LoadBalancer"])
    assert params["LoadBalancerCertificateArn"]["Default"] == "" and params["LoadBalancerDomainName"]["Default"] == ""
    rule = _template()["Rules"]["FrontNeedsHostsAndCertificate"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "WebSocketFront"}, "LoadBalancer"]}
    assert [a["Assert"] for a in rule["Assertions"]] == [
        {"Fn::Not": [{"Fn::Equals": [{"Ref": "LoadBalancerCertificateArn"}, ""]}]},
        {"Fn::Not": [{"Fn::Equals": [{"Ref": "WorkerImageUri"}, ""]}]},
        {"Fn::Equals": [{"Ref": "TurnHostTier"}, "Enabled"]}]
    import re

    pattern = re.compile(params["LoadBalancerCertificateArn"]["AllowedPattern"])
    assert pattern.fullmatch(CERT) and pattern.fullmatch("") and not pattern.fullmatch("arn:aws:iam::1:role/x")


def test_api_gateway_front_by_default_no_load_balancer_and_hosts_scale_to_zero() -> None:
    for given in ({}, {"WorkerImageUri": IMAGE}):
        resources, outputs = _stack(**given)
        assert not set(FRONT_RESOURCES) & set(resources)
        assert outputs["WebSocketUrl"]["Value"] == {
            "Fn::Sub": "wss://${WebSocketApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}/${WebSocketStageName}"}
        assert "LoadBalancerDnsName" not in outputs
        assert "WebSocketApi" in resources
    service = resources["TurnHostService"]["Properties"]
    assert service["DesiredCount"] == 0 and "LoadBalancers" not in service
    assert "HealthCheckGracePeriodSeconds" not in service
    assert service["NetworkConfiguration"]["AwsvpcConfiguration"]["SecurityGroups"] == [
        {"Fn::GetAtt": ["WorkerSecurityGroup", "GroupId"]}]
    assert resources["TurnHostScalableTarget"]["Properties"]["MinCapacity"] == 0
    env = _env(resources)
    assert "AVM_TURN_HOST_WS_PORT" not in env and "AVM_TURN_HOST_PEER_PORT" not in env
    (container,) = resources["TurnHostTaskDefinition"]["Properties"]["ContainerDefinitions"]
    assert "PortMappings" not in container


def test_load_balancer_front_an_alb_in_front_of_at_least_one_turn_host() -> None:
    resources, outputs = _stack(WorkerImageUri=IMAGE, WebSocketFront="LoadBalancer", LoadBalancerCertificateArn=CERT)
    assert {name: resources[name]["Type"] for name in FRONT_RESOURCES} == FRONT_RESOURCES
    assert "WebSocketApi" in resources  # kept: the HTTP fronts stay, WebSocket clients can move over gradually

    alb = resources["FrontLoadBalancer"]["Properties"]
    assert (alb["Type"], alb["Scheme"]) == ("application", "internet-facing")
    attributes = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
    assert attributes["idle_timeout.timeout_seconds"] == "3600"
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    assert alb["SecurityGroups"] == [{"Fn::GetAtt": ["FrontLoadBalancerSecurityGroup", "GroupId"]}]

    listener = resources["FrontListener"]["Properties"]
    assert (listener["Port"], listener["Protocol"]) == (443, "HTTPS")
    assert listener["Certificates"] == [{"CertificateArn": {"Ref": "LoadBalancerCertificateArn"}}]
    assert listener["DefaultActions"] == [{"Type": "forward", "TargetGroupArn": {"Ref": "FrontTargetGroup"}}]
    assert listener["SslPolicy"].startswith("ELBSecurityPolicy-TLS13")

    target = resources["FrontTargetGroup"]["Properties"]
    assert (target["TargetType"], target["Protocol"], target["Port"]) == ("ip", "HTTP", 8080)
    assert (target["HealthCheckPath"], target["Matcher"]) == ("/health", {"HttpCode": "200"})

    # the ALB reaches the fronts (8080) only; the internal endpoint (8081) only the hosts themselves
    alb_sg = resources["FrontLoadBalancerSecurityGroup"]["Properties"]
    assert {(r["FromPort"], r["ToPort"]) for r in alb_sg["SecurityGroupIngress"]} == {(443, 443)}
    assert [(r["FromPort"], r["ToPort"]) for r in alb_sg["SecurityGroupEgress"]] == [(8080, 8080)]
    hosts_sg = resources["TurnHostFrontSecurityGroup"]["Properties"]
    assert [(r["FromPort"], r["SourceSecurityGroupId"]) for r in hosts_sg["SecurityGroupIngress"]] == [
        (8080, {"Fn::GetAtt": ["FrontLoadBalancerSecurityGroup", "GroupId"]})]
    peers = resources["TurnHostPeerIngress"]["Properties"]
    assert (peers["FromPort"], peers["ToPort"]) == (8081, 8081)
    assert peers["GroupId"] == peers["SourceSecurityGroupId"] == {"Fn::GetAtt": ["TurnHostFrontSecurityGroup",
                                                                                 "GroupId"]}

    service = resources["TurnHostService"]["Properties"]
    assert service["DesiredCount"] == 1  # an ALB with no healthy target refuses every connection
    assert resources["TurnHostScalableTarget"]["Properties"]["MinCapacity"] == 1
    assert service["LoadBalancers"] == [{"ContainerName": "turnhost", "ContainerPort": 8080,
                                         "TargetGroupArn": {"Ref": "FrontTargetGroup"}}]
    assert service["HealthCheckGracePeriodSeconds"] == 60
    assert service["NetworkConfiguration"]["AwsvpcConfiguration"]["SecurityGroups"] == [
        {"Fn::GetAtt": ["WorkerSecurityGroup", "GroupId"]}, {"Fn::GetAtt": ["TurnHostFrontSecurityGroup", "GroupId"]}]
    assert {"Key": "front-listener", "Value": {"Ref": "FrontListener"}} in service["Tags"]  # created after it
    env = _env(resources)
    assert (env["AVM_TURN_HOST_WS_PORT"], env["AVM_TURN_HOST_PEER_PORT"]) == ("8080", "8081")
    (container,) = resources["TurnHostTaskDefinition"]["Properties"]["ContainerDefinitions"]
    assert [m["ContainerPort"] for m in container["PortMappings"]] == [8080, 8081]

    assert outputs["WebSocketUrl"]["Value"] == {"Fn::Sub": "wss://${FrontLoadBalancer.DNSName}/"}
    assert outputs["LoadBalancerDnsName"]["Value"] == {"Fn::GetAtt": ["FrontLoadBalancer", "DNSName"]}
    _, named = _stack(WorkerImageUri=IMAGE, WebSocketFront="LoadBalancer", LoadBalancerCertificateArn=CERT,
                      LoadBalancerDomainName="ws.example.com")
    assert named["WebSocketUrl"]["Value"] == {"Fn::Sub": "wss://${LoadBalancerDomainName}/"}


def test_a_load_balancer_front_without_the_host_tier_creates_nothing_of_it() -> None:
    # (the rule refuses such a stack; the conditions alone never half-create the front)
    for given in ({"WebSocketFront": "LoadBalancer", "LoadBalancerCertificateArn": CERT},
                  {"WebSocketFront": "LoadBalancer", "LoadBalancerCertificateArn": CERT, "WorkerImageUri": IMAGE,
                   "TurnHostTier": "Disabled"}):
        resources, outputs = _stack(**given)
        assert not set(FRONT_RESOURCES) & set(resources) and "LoadBalancerDnsName" not in outputs
