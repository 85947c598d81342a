"""A small IAM policy evaluator for the policies of template.yaml, and the authorization requests
AWS derives from the API calls the AgentVM adapters make.

moto does not evaluate these policies (its access control knows StringEquals on request parameters
only: no `dynamodb:LeadingKeys`, no `aws:PrincipalTag`, no session policies), and no maintained
PyPI package evaluates IAM conditions offline. So this module implements the documented semantics
of exactly what the templates use, and refuses (raises) on anything it does not implement rather
than guessing:

* evaluation: an explicit Deny in any policy wins; otherwise the request needs an Allow in the
  identity policy and, when a session policy was passed, an Allow in it too (the intersection);
* Action/NotAction globs, case-insensitive; Resource globs, case-sensitive (`*`, `?`);
* policy variables `${aws:PrincipalTag/k}` (a statement whose variable has no value does not match),
  and the escapes `${*}`, `${?}`, `${$}`;
* operators StringEquals, StringLike, StringNotEquals, StringNotLike, ArnEquals, ArnLike, Null, the
  `ForAllValues:` / `ForAnyValue:` set prefixes and the `IfExists` suffix. Operators within a
  condition block are ANDed, keys within an operator ANDed, the values of a key ORed; a key absent
  from the request fails every operator except Null, `IfExists` and `ForAllValues:` (which is true
  for an absent key: why the templates pair it with `Null: false`).

`authorizations` turns one API call (service, operation, parameters as botocore takes them) into the
checks AWS makes: action, resource ARN and condition keys (DynamoDB's LeadingKeys is the partition
key the request names, of the table or of the queried index; batch requests carry every key).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentvm.adapters.aws.dynamodb_table import TABLE_DEFINITION

ACCOUNT = "123456789012"
REGION = "us-east-1"


@dataclass(frozen=True)
class Check:
    """One authorization AWS makes for a request."""

    action: str
    resource: str
    context: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __str__(self) -> str:
        ctx = " ".join(f"{k}={list(v)}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource} {ctx}".strip()


@dataclass(frozen=True)
class Principal:
    arn: str
    tags: Mapping[str, str] = field(default_factory=dict)


class Unsupported(AssertionError):
    """The policy or request uses something this evaluator does not implement."""


# ---------------------------------------------------------------------------------- matching

def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE | re.DOTALL) is not None


_VARIABLE = re.compile(r"\$\{([^}]*)\}")


def _substitute(text: str, principal: Principal) -> str | None:
    """Policy variables replaced; None when one has no value (the statement then does not apply).
    Escapes stay wildcard-free: `${*}` is a literal `*`, which `_literal` marks."""
    missing = False

    def one(m: re.Match[str]) -> str:
        nonlocal missing
        name = m.group(1)
        if name in ("*", "?", "$"):
            return "\x00" + name  # a literal, not a wildcard
        if name.startswith("aws:PrincipalTag/"):
            value = principal.tags.get(name.removeprefix("aws:PrincipalTag/"))
            if value is None:
                missing = True
                return ""
            return value.replace("*", "\x00*").replace("?", "\x00?")
        raise Unsupported(f"policy variable {name!r}")

    out = _VARIABLE.sub(one, text)
    return None if missing else out


def _like(pattern: str, value: str, *, case: bool = True) -> bool:
    """Glob where `\\x00` marks the next character as literal."""
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\x00":
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
        i += 1
    return re.fullmatch("".join(parts), value, (0 if case else re.IGNORECASE) | re.DOTALL) is not None


def _plain(pattern: str) -> str:
    return pattern.replace("\x00", "")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


_OPS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda p, v: _plain(p) == v,
    "StringNotEquals": lambda p, v: _plain(p) != v,
    "StringLike": _like,
    "StringNotLike": lambda p, v: not _like(p, v),
    "ArnEquals": lambda p, v: _plain(p) == v,
    "ArnLike": _like,
}
_NEGATED = {"StringNotEquals", "StringNotLike"}


def _condition_holds(operator: str, key: str, patterns: Sequence[str], values: tuple[str, ...] | None) -> bool:
    if operator == "Null":
        [want] = patterns
        if want not in ("true", "false"):
            raise Unsupported(f"Null {want!r}")
        return (values is None or not values) == (want == "true")
    prefix, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    if op not in _OPS or prefix not in ("", "ForAllValues", "ForAnyValue"):
        raise Unsupported(f"condition operator {operator!r}")
    test = _OPS[op]

    def matches(v: str) -> bool:
        hits = [test(p, v) for p in patterns]
        return all(hits) if op in _NEGATED else any(hits)

    if prefix == "ForAllValues":
        return values is None or all(matches(v) for v in values)
    if values is None:
        return if_exists
    if prefix == "ForAnyValue":
        return any(matches(v) for v in values)
    if len(values) != 1:
        raise Unsupported(f"single-valued operator {operator} on multi-valued {key}: use ForAllValues/ForAnyValue")
    return matches(values[0])


def _statement_applies(statement: Mapping[str, Any], check: Check, principal: Principal) -> bool:
    unknown = set(statement) - {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition",
                                "Principal"}
    if unknown:
        raise Unsupported(f"statement elements {sorted(unknown)}")
    if "Action" in statement:
        if not any(_glob(a, check.action, case=False) for a in _as_list(statement["Action"])):
            return False
    elif any(_glob(a, check.action, case=False) for a in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement or "NotResource" in statement:
        element = "Resource" if "Resource" in statement else "NotResource"
        hit = False
        for raw in _as_list(statement[element]):
            pattern = _substitute(raw, principal)
            if pattern is not None and _like(pattern, check.resource):
                hit = True
        if hit != (element == "Resource"):
            return False
    for operator, block in (statement.get("Condition") or {}).items():
        for key, raw in block.items():
            patterns = []
            for r in _as_list(raw):
                p = _substitute(str(r).lower() if isinstance(r, bool) else str(r), principal)
                if p is None:
                    return False
                patterns.append(p)
            if not _condition_holds(operator, key, patterns, _context_value(check, key, principal)):
                return False
    return True


def _context_value(check: Check, key: str, principal: Principal) -> tuple[str, ...] | None:
    if key.startswith("aws:PrincipalTag/"):
        value = principal.tags.get(key.removeprefix("aws:PrincipalTag/"))
        return None if value is None else (value,)
    if key == "aws:PrincipalArn":
        return (principal.arn,)
    return check.context.get(key)


def _decisions(policy: Mapping[str, Any], check: Check, principal: Principal) -> set[str]:
    return {s["Effect"] for s in _as_list(policy["Statement"]) if _statement_applies(s, check, principal)}


def allowed(check: Check, principal: Principal, identity: Sequence[Mapping[str, Any]],
            session: Mapping[str, Any] | None = None) -> bool:
    """Would AWS allow `check` for `principal` holding the identity policies (and the session policy)?"""
    effects: set[str] = set()
    for policy in identity:
        effects |= _decisions(policy, check, principal)
    session_effects = _decisions(session, check, principal) if session is not None else {"Allow"}
    if "Deny" in effects or "Deny" in session_effects:
        return False
    return "Allow" in effects and "Allow" in session_effects


def trusts(trust_policy: Mapping[str, Any], check: Check, caller: Principal) -> bool:
    """Does a role's trust policy let `caller` make `check` (sts:AssumeRole / sts:TagSession)?"""
    allow = False
    for statement in _as_list(trust_policy["Statement"]):
        principals = statement.get("Principal", {})
        if set(principals) - {"AWS", "Service"}:
            raise Unsupported(f"principal kinds {sorted(principals)}")
        if caller.arn not in _as_list(principals.get("AWS", [])):
            continue
        body = {k: v for k, v in statement.items() if k != "Principal"}
        if _statement_applies(body, check, caller):
            if statement["Effect"] == "Deny":
                return False
            allow = True
    return allow


# ---------------------------------------------------------------------------------- requests

def _s(attr: Mapping[str, Any]) -> str:
    [(kind, value)] = attr.items()
    if kind != "S":
        raise Unsupported(f"non-string partition key {attr}")
    return str(value)


def _hash_key(index: str | None) -> str:
    if index is None:
        schema = TABLE_DEFINITION["KeySchema"]
    else:
        [gsi] = [g for g in TABLE_DEFINITION["GlobalSecondaryIndexes"] if g["IndexName"] == index]
        schema = gsi["KeySchema"]
    return str(next(k["AttributeName"] for k in schema if k["KeyType"] == "HASH"))


def _query_key(params: Mapping[str, Any]) -> str:
    attr = _hash_key(params.get("IndexName"))
    names = params.get("ExpressionAttributeNames", {})
    expression = params["KeyConditionExpression"]
    for m in re.finditer(r"(#?\w+)\s*=\s*(:\w+)", expression):
        if names.get(m.group(1), m.group(1)) == attr:
            return _s(params["ExpressionAttributeValues"][m.group(2)])
    raise Unsupported(f"no partition key condition in {expression!r}")


def _table_arn(name: str, index: str | None = None) -> str:
    arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"
    return f"{arn}/index/{index}" if index else arn


def _keys(*pks: str) -> dict[str, tuple[str, ...]]:
    return {"dynamodb:LeadingKeys": tuple(pks)}


def _function_arn(name: str, qualifier: str | None) -> str:
    """Lambda's FunctionName (a name, `name:qualifier`, or an ARN) as the ARN IAM checks."""
    if not name.startswith("arn:"):
        name = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    return f"{name}:{qualifier}" if qualifier else name


def _ecs_arn(kind: str, name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:ecs:{REGION}:{ACCOUNT}:{kind}/{name}"


def _queue_arn(url: str) -> str:
    """`https://sqs.<region>.amazonaws.com/<account>/<name>` (or moto's `http://host:port/...`) as an ARN."""
    account, name = url.rstrip("/").split("/")[-2:]
    return f"arn:aws:sqs:{REGION}:{account}:{name}"


def authorizations(service: str, operation: str, params: Mapping[str, Any], *,
                   ws_api: str = "wsapi", ws_stage: str = "live") -> list[Check]:
    """The checks AWS makes for one API call (raises Unsupported for calls this module does not know)."""
    p = params
    if service == "dynamodb":
        action = f"dynamodb:{operation}"
        if operation in ("GetItem", "DeleteItem", "UpdateItem"):
            return [Check(action, _table_arn(p["TableName"]), _keys(_s(p["Key"]["PK"])))]
        if operation == "PutItem":
            return [Check(action, _table_arn(p["TableName"]), _keys(_s(p["Item"]["PK"])))]
        if operation == "Query":
            return [Check(action, _table_arn(p["TableName"], p.get("IndexName")), _keys(_query_key(p)))]
        if operation == "Scan":
            return [Check(action, _table_arn(p["TableName"], p.get("IndexName")))]
        if operation == "BatchGetItem":
            return [Check(action, _table_arn(t), _keys(*(_s(k["PK"]) for k in r["Keys"])))
                    for t, r in p["RequestItems"].items()]
        if operation == "BatchWriteItem":
            return [Check(action, _table_arn(t), _keys(*(
                _s((w["PutRequest"]["Item"] if "PutRequest" in w else w["DeleteRequest"]["Key"])["PK"]) for w in r)))
                for t, r in p["RequestItems"].items()]
        if operation in ("TransactWriteItems", "TransactGetItems"):
            checks = []
            kinds = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                     "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}
            for entry in p["TransactItems"]:
                [(kind, body)] = entry.items()
                key = body["Item"] if kind == "Put" else body["Key"]
                checks.append(Check(f"dynamodb:{kinds[kind]}", _table_arn(body["TableName"]), _keys(_s(key["PK"]))))
            return checks
        raise Unsupported(f"dynamodb:{operation}")
    if service == "s3":
        obj = f"arn:aws:s3:::{p.get('Bucket')}/{p.get('Key')}"
        if operation in ("GetObject", "HeadObject"):
            return [Check("s3:GetObject", obj)]
        if operation in ("PutObject", "DeleteObject"):
            return [Check(f"s3:{operation}", obj)]
        if operation == "DeleteObjects":
            return [Check("s3:DeleteObject", f"arn:aws:s3:::{p['Bucket']}/{o['Key']}") for o in p["Delete"]["Objects"]]
        if operation in ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"):
            return [Check("s3:PutObject", obj)]  # a multipart upload is authorised as the PutObject it makes
        if operation == "UploadPartCopy":  # the destination's PutObject and the source's GetObject
            src = p["CopySource"]
            source = f"{src['Bucket']}/{src['Key']}" if isinstance(src, dict) else str(src).lstrip("/")
            return [Check("s3:PutObject", obj), Check("s3:GetObject", f"arn:aws:s3:::{source}")]
        if operation == "AbortMultipartUpload":
            return [Check("s3:AbortMultipartUpload", obj)]
        if operation in ("ListObjectsV2", "ListObjects"):
            context = {"s3:prefix": (p["Prefix"],)} if "Prefix" in p else {}
            return [Check("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}", context)]
        raise Unsupported(f"s3:{operation}")
    if service == "apigatewaymanagementapi":
        verb = {"PostToConnection": "POST", "GetConnection": "GET", "DeleteConnection": "DELETE"}[operation]
        return [Check("execute-api:ManageConnections",
                      f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{ws_api}/{ws_stage}/{verb}/@connections/{p['ConnectionId']}")]
    if service == "ssm":
        name = p.get("Path") or p.get("Name")
        names = [name] if name else list(p["Names"])
        arn = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter"
        return [Check(f"ssm:{operation}", arn + (n if n.startswith("/") else "/" + n)) for n in names]
    if service == "lambda" and operation == "Invoke":
        return [Check("lambda:InvokeFunction", _function_arn(p["FunctionName"], p.get("Qualifier")))]
    if service == "sqs":
        # a batch is authorised as its single-message action (there is no sqs:DeleteMessageBatch)
        action = {"SendMessageBatch": "SendMessage", "DeleteMessageBatch": "DeleteMessage",
                  "ChangeMessageVisibilityBatch": "ChangeMessageVisibility"}.get(operation, operation)
        if action not in ("SendMessage", "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility",
                          "GetQueueAttributes", "GetQueueUrl"):
            raise Unsupported(f"sqs:{operation}")
        return [Check(f"sqs:{action}", _queue_arn(p["QueueUrl"]))]
    if service == "ecs" and operation == "RunTask":
        cluster = _ecs_arn("cluster", p.get("cluster", "default"))
        definition = _ecs_arn("task-definition", p["taskDefinition"])
        checks = [Check("ecs:RunTask", definition, {"ecs:cluster": (cluster,)})]
        if p.get("tags") or p.get("propagateTags"):  # tags on the new task: tag-on-create
            task = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{cluster.rsplit('/', 1)[-1]}/new-task"
            checks.append(Check("ecs:TagResource", task, {"ecs:CreateAction": ("RunTask",)}))
        return checks
    if service == "bedrock-runtime" and operation in ("Converse", "ConverseStream"):
        # Converse is authorised as InvokeModel, ConverseStream as InvokeModelWithResponseStream; a cross-region
        # inference profile (`us.`, `eu.`, `global.` … before the model id) on the profile and on its model
        action = "bedrock:InvokeModelWithResponseStream" if operation == "ConverseStream" else "bedrock:InvokeModel"
        model = str(p["modelId"])
        if model.startswith("arn:"):
            return [Check(action, model)]
        prefix, _, rest = model.partition(".")
        if prefix in ("us", "eu", "apac", "jp", "au", "ca", "us-gov", "global") and rest:
            return [Check(action, f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model}"),
                    Check(action, f"arn:aws:bedrock:{REGION}::foundation-model/{rest}")]
        return [Check(action, f"arn:aws:bedrock:{REGION}::foundation-model/{model}")]
    if service == "secretsmanager" and operation == "GetSecretValue":
        return [Check("secretsmanager:GetSecretValue", p["SecretId"])]
    if service == "sts" and operation == "AssumeRole":
        tags = {t["Key"]: t["Value"] for t in p.get("Tags", [])}
        request: dict[str, tuple[str, ...]] = {f"aws:RequestTag/{k}": (v,) for k, v in tags.items()}
        if tags:
            request["aws:TagKeys"] = tuple(tags)
        checks = [Check("sts:AssumeRole", p["RoleArn"], request)]
        if tags:
            checks.append(Check("sts:TagSession", p["RoleArn"], request))
        return checks
    raise Unsupported(f"{service}:{operation}")


def denied_checks(calls: Iterable[tuple[str, str, Mapping[str, Any]]], principal: Principal,
                  identity: Sequence[Mapping[str, Any]], session: Mapping[str, Any] | None) -> list[str]:
    """The checks of `calls` that would be denied (as text, for assertion messages)."""
    return [str(c) for service, op, params in calls for c in authorizations(service, op, params)
            if not allowed(c, principal, identity, session)]
