"""The ConfigStore port in the cloud: values in SSM Parameter Store, the audit trail in DynamoDB.

Values. Each key is one parameter under the store's path: with the path `/agentvm/prod/`, the key
`llm.model` is the parameter `/agentvm/prod/llm.model` (a key may hold `/` to nest, like SSM names;
otherwise letters, digits, `.`, `-` and `_`). A normal value is a `String`, a secret one a
`SecureString` encrypted with the account's default key for SSM (`alias/aws/ssm`); `PutParameter`
overwrites, switching the type when the secret flag changes. Removing a value deletes its parameter
(one that is already gone is fine). Values are limited to the Standard tier's 4 KB.

`runtime_values` reads the whole path (`GetParametersByPath`, recursive, decrypted, every page) at
most once per `cache_s` (30 s by default) per process; `set_value` drops the cache of this process,
so a change is read back at once here and within `cache_s` by the other execution environments.

Audit. Each change is an item of the DynamoDB table of `DynamoDBStore` (its client, its table):
`PK = CONFIGAUDIT`, `SK = {at:016d}#{uuid}` (string order is time order; two changes within one ms
have no defined order), with `key`, `old`, `new` (absent when None), `actor` and `at` (number).
`changes` reads it newest first: one Query, descending, `Limit`.

The two writes are not one transaction (SSM and DynamoDB share none): the value is put first, then
the audit item. If the audit write fails after the value was stored, the failure is logged (with
the key, never a value) and re-raised, so the caller sees it; the value stays set.

Errors of SSM are `UpstreamError`s naming the parameter or path and the AWS error code, never a value.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import botocore.session
from botocore.exceptions import BotoCoreError, ClientError

from agentvm.adapters.aws.aws_env import error_code, parameters_by_path, upstream_error
from agentvm.adapters.aws.clients import LazyClient
from agentvm.domain.models import ConfigChange
from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore

log = logging.getLogger(__name__)

#: The partition of the audit trail in the store's table.
AUDIT_PK: Final = "CONFIGAUDIT"
#: The KMS key of SecureString values: the account's AWS managed key for SSM.
DEFAULT_KMS_KEY: Final = "alias/aws/ssm"

_KEY: Final = re.compile(r"[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*")


class SsmConfigStore:
    """`ConfigStore`: values under the SSM `path`, the audit trail in `store`'s table.

    `store` must be open while this is used; it is not closed here (`close` ends the SSM client)."""

    def __init__(self, path: str, store: DynamoDBStore, *, endpoint_url: str | None = None,
                 region_name: str | None = None, session: botocore.session.Session | None = None,
                 cache_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix = "/" + path.strip("/")  # GetParametersByPath's form: no trailing slash
        self.store = store
        self._ssm = LazyClient("ssm", session=session, endpoint_url=endpoint_url, region_name=region_name)
        self._cache_s = cache_s
        self._clock = clock
        self._cached: tuple[dict[str, str], float] | None = None
        self._generation = 0  # bumped by every write: a read that began before it is not cached

    def parameter_name(self, key: str) -> str:
        """The SSM parameter that holds `key` (InvalidRequest for a key SSM cannot name)."""
        if not _KEY.fullmatch(key):
            raise InvalidRequest(f"config key {key!r} must be letters, digits, '.', '-', '_' and '/' "
                                 "(not at either end)", field="key")
        return f"{self.prefix.rstrip('/')}/{key}"

    async def close(self) -> None:
        await self._ssm.close()

    # ---- values ------------------------------------------------------------------------------

    async def runtime_values(self) -> dict[str, str]:
        """Every value under the path, keyed relative to it (a copy: callers may change it)."""
        cached = self._cached
        if cached is not None and self._clock() - cached[1] < self._cache_s:
            return dict(cached[0])
        generation = self._generation
        values = await self._read_path()
        if generation == self._generation:
            self._cached = (values, self._clock())
        return dict(values)

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        name = self.parameter_name(key)
        try:
            if value_json is None:
                await self._delete(name)
            else:
                await self._put(name, value_json, secret=secret)
        finally:
            self._invalidate()  # even after a failure: the write may have landed
        try:
            await self._put_audit(change)
        except Exception as exc:
            log.error("config value stored but its audit record failed",
                      extra={"config_key": key, "error": type(exc).__name__})
            raise

    async def _put(self, name: str, value_json: str, *, secret: bool) -> None:
        params: dict[str, Any] = {"Name": name, "Value": value_json, "Overwrite": True,
                                  "Type": "SecureString" if secret else "String"}
        if secret:
            params["KeyId"] = DEFAULT_KMS_KEY
        client = await self._ssm.get()
        try:
            await client.put_parameter(**params)
        except (ClientError, BotoCoreError) as exc:
            raise upstream_error("write", f"SSM parameter {name!r}", exc) from None

    async def _delete(self, name: str) -> None:
        client = await self._ssm.get()
        try:
            await client.delete_parameter(Name=name)
        except ClientError as exc:
            if error_code(exc) != "ParameterNotFound":
                raise upstream_error("delete", f"SSM parameter {name!r}", exc) from None
        except BotoCoreError as exc:
            raise upstream_error("delete", f"SSM parameter {name!r}", exc) from None

    async def _read_path(self) -> dict[str, str]:
        try:
            return await parameters_by_path(await self._ssm.get(), self.prefix)
        except (ClientError, BotoCoreError) as exc:
            raise upstream_error("read", f"SSM parameter path {self.prefix!r}", exc) from None

    def _invalidate(self) -> None:
        self._generation += 1
        self._cached = None

    # ---- audit -------------------------------------------------------------------------------

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        """The newest `limit` changes, newest first (none for a limit below 1)."""
        out: list[ConfigChange] = []
        params: dict[str, Any] = {"TableName": self.store.table_name, "KeyConditionExpression": "PK = :pk",
                                  "ExpressionAttributeValues": {":pk": {"S": AUDIT_PK}},
                                  "ScanIndexForward": False, "ConsistentRead": True}
        while len(out) < limit:
            resp = await self.store.client.query(**params, Limit=limit - len(out))
            out.extend(_change(item) for item in resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return out

    async def _put_audit(self, change: ConfigChange) -> None:
        item: dict[str, Any] = {"PK": {"S": AUDIT_PK}, "SK": {"S": f"{change.at:016d}#{uuid.uuid4().hex}"},
                                "key": {"S": change.key}, "actor": {"S": change.actor},
                                "at": {"N": str(change.at)}}
        for name, value in (("old", change.old), ("new", change.new)):
            if value is not None:
                item[name] = {"S": value}
        await self.store.client.put_item(TableName=self.store.table_name, Item=item)


def _change(item: Mapping[str, Any]) -> ConfigChange:
    def opt(name: str) -> str | None:
        value = item.get(name)
        return None if value is None else str(value["S"])
    return ConfigChange(key=str(item["key"]["S"]), old=opt("old"), new=opt("new"),
                        actor=str(item["actor"]["S"]), at=int(item["at"]["N"]))


if TYPE_CHECKING:
    from agentvm.ports import ConfigStore

    def _implements_config_store(store: SsmConfigStore) -> ConfigStore:  # mypy checks the signatures
        return store
