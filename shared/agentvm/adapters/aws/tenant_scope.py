"""The container task's AWS credentials, scoped to its one tenant (docs/cloud-design.md, "Tenant scope").

The worker task runs untrusted tool code. Its ECS task role may do nothing but read the LLM key and
assume the template's tenant worker role (`TenantWorkerRole`) with one session tag,
`agentvm-tenant = <tenant id>`. That role's policy reaches only items whose partition key carries
that tag's tenant (`dynamodb:LeadingKeys`) and objects under `workspaces/<tenant>/` (S3), plus the
WebSocket connections and the runtime configuration. On top, the worker passes a session policy
that names its tenant and its container literally (the effective rights are the intersection).

At start-up the worker (`agentvm.worker`):

1. resolves the task-role credentials once (the ECS credentials endpoint, whose secret path is in
   `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`) and reads the LLM key with them;
2. removes every credential variable from its own environment (`drop_task_credentials`), so no
   process it starts can inherit them (tools get `tool_env` anyway, which never carries them);
3. builds every AWS client from `tenant_session`: credentials from AssumeRole with the tag and the
   session policy, refreshed by botocore before they expire (one hour, the role-chaining limit).

Tenant ids become a session tag value and part of IAM patterns, so only ids made of letters, digits
and `_ . : = + - @` can be scoped (`check_scopable`): no `*`/`?` (IAM wildcards), no `#`/`%`/`/`
(escaped in table and S3 keys, so the tag would not match them), no `$` (policy variables). A task
for any other tenant refuses to start, and `EcsContainerTier.start` refuses to run one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Final

import botocore.session
from botocore.credentials import (
    AssumeRoleCredentialFetcher,
    ContainerProvider,
    CredentialProvider,
    CredentialResolver,
    Credentials,
    DeferredRefreshableCredentials,
)

from agentvm.errors import InvalidRequest

TENANT_TAG: Final = "agentvm-tenant"
#: AssumeRole from a role's credentials is role chaining: one hour at most.
SESSION_S: Final = 3600
#: What a tenant id may hold to be a session tag value and a literal inside IAM patterns.
SCOPABLE_TENANT = re.compile(r"[A-Za-z0-9_.:=+@-]{1,128}")
#: The table's partition-key prefixes a worker reads and writes: each is `PREFIX#{tenant}#…` (or the
#: bare `PREFIX#{tenant}` where listed in EXACT). Items of other shapes are out of its reach:
#: connection records (`WSCONN#`), API keys, the config audit, published names, usage exports.
TABLE_PREFIXES: Final = ("SESS", "IMG", "CONT", "CTASK", "SRCH", "SUBS", "WATCH", "USAGE", "BUDGET", "SPEND",
                         "RATE", "RES", "RESNAME")
EXACT_PREFIXES: Final = ("BUDGET", "SPEND", "RATE")
#: Index partition-key prefixes the worker queries, per index (docs in dynamodb_table.py).
INDEX_PREFIXES: Final = {"GSI1": ("TENANT",), "GSI2": ("CONT",), "GSI3": ("AGENT", "TURN")}
#: Credential variables of the task (ECS, or a developer's shell) that no child may inherit.
CREDENTIAL_VARIABLES: Final = (
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
    "ECS_CONTAINER_METADATA_URI", "ECS_CONTAINER_METADATA_URI_V4")


class TenantNotScopable(InvalidRequest):
    code = "tenant_not_scopable"


def check_scopable(tenant_id: str) -> str:
    """`tenant_id` if a tenant-scoped session can be made for it, else TenantNotScopable."""
    if not SCOPABLE_TENANT.fullmatch(tenant_id):
        raise TenantNotScopable(
            f"Tenant id {tenant_id!r} cannot have a tenant-scoped sandbox in the cloud: the container tier "
            "needs ids of 1-128 letters, digits and _ . : = + - @ (an IAM session tag value); this tenant's "
            "tool turns cannot run", field="tenant_id")
    return tenant_id


def session_policy(tenant_id: str, container_id: str, *, bucket: str) -> str:
    """The AssumeRole session policy: the role's rights narrowed to this tenant (literally) and, in S3,
    to this container's workspace. Compact: AWS limits it to 2,048 characters."""
    t = check_scopable(tenant_id)
    c = container_id.replace("%", "%25").replace("/", "%2F")  # as s3_workspace escapes it
    # coarse on purpose (any `X#{t}…` key): the role's policy lists the exact prefixes per table and index,
    # and the effective rights are the intersection; this keeps the policy short for long ids
    keys = [f"*#{t}#*", f"*#{t}"]
    workspace = f"workspaces/{t}/{c}/"
    statements: list[dict[str, Any]] = [
        # the table: the role names it (and each index) exactly; here only the tenant is narrowed
        {"Effect": "Allow", "Action": "dynamodb:*", "Resource": "*",
         "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": keys},
                       "Null": {"dynamodb:LeadingKeys": "false"}}},
        {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:*:s3:::{bucket}/{workspace}*",
                                                         f"arn:*:s3:::{bucket}/tmp/*"]},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:*:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": f"{workspace}*"}}},
        {"Effect": "Allow", "Action": ["execute-api:ManageConnections", "ssm:GetParameter*"], "Resource": "*"},
    ]
    policy = json.dumps({"Version": "2012-10-17", "Statement": statements}, separators=(",", ":"))
    if len(policy) > 2048:
        raise TenantNotScopable(f"The session policy for tenant {tenant_id!r} and container {container_id!r} "
                                f"is {len(policy)} characters, above AWS's 2,048", field="container_id")
    return policy


def session_name(task_id: str) -> str:
    """A RoleSessionName ([\\w+=,.@-], at most 64) naming the task, for CloudTrail."""
    tail = re.sub(r"[^\w+=,.@-]", "-", task_id.rsplit("/", 1)[-1])
    return f"avm-worker-{tail}"[:64]


def task_credentials(environ: Mapping[str, str] | None = None) -> Credentials:
    """The task role's credentials, resolved now. On ECS from the credentials endpoint, with a copy of
    the environment, so that refreshing them still works after `drop_task_credentials`; elsewhere
    (tests, a developer's shell) botocore's usual chain."""
    env = dict(os.environ if environ is None else environ)
    creds: Credentials | None
    if ContainerProvider.ENV_VAR in env or ContainerProvider.ENV_VAR_FULL in env:
        creds = ContainerProvider(environ=env).load()
    else:
        creds = botocore.session.Session().get_credentials()
    if creds is None:
        raise InvalidRequest("The worker found no AWS credentials to assume its tenant role with "
                             "(on ECS: the task role)", field="worker_tenant_role_arn")
    return creds


def drop_task_credentials(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove the task's credential variables from this process's environment (what children would
    inherit); returns the names removed."""
    env = os.environ if environ is None else environ
    removed = [name for name in CREDENTIAL_VARIABLES if name in env]
    for name in removed:
        del env[name]
    return removed


class _Fixed(CredentialProvider):
    METHOD = "agentvm-tenant-role"
    CANONICAL_NAME = "AgentVMTenantRole"

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def load(self) -> Credentials:
        return self._credentials


def tenant_session(*, source: Credentials, role_arn: str, tenant_id: str, container_id: str, task_id: str,
                   bucket: str, region_name: str | None, endpoint_url: str | None = None,
                   client_creator: Callable[..., Any] | None = None) -> botocore.session.Session:
    """A botocore session whose only credentials are the tenant role's, assumed from `source` with the
    tenant tag and the session policy; botocore refreshes them before they expire. The first
    AssumeRole happens here, so a refused one fails the start."""
    sts_session = botocore.session.Session()
    if region_name:
        sts_session.set_config_variable("region", region_name)
    creator = client_creator or (lambda service, **kw: sts_session.create_client(
        service, region_name=region_name, endpoint_url=endpoint_url, **kw))
    fetcher = AssumeRoleCredentialFetcher(
        creator, source, role_arn,
        extra_args={"RoleSessionName": session_name(task_id), "DurationSeconds": SESSION_S,
                    "Tags": [{"Key": TENANT_TAG, "Value": check_scopable(tenant_id)}],
                    "Policy": session_policy(tenant_id, container_id, bucket=bucket)})
    credentials = DeferredRefreshableCredentials(method="assume-role", refresh_using=fetcher.fetch_credentials)
    credentials.get_frozen_credentials()  # assume now: a refusal stops the start, not the first turn
    return credentials_session(credentials, region_name)


def credentials_session(credentials: Credentials, region_name: str | None) -> botocore.session.Session:
    """A botocore session that signs with exactly `credentials` (never the environment's chain)."""
    session = botocore.session.Session()
    if region_name:
        session.set_config_variable("region", region_name)
    session.register_component("credential_provider", CredentialResolver([_Fixed(credentials)]))
    return session
