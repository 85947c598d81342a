"""API keys of a tenant (`/v1/auth/keys`, `avm keys`): created with their token shown once, listed
without their secrets, revoked. A key belongs to one tenant and acts only in it; creating and
revoking keys needs an `admin` key of that tenant (or the open local mode's operator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentvm.auth.api_keys import Authenticator, new_key
from agentvm.domain.models import ApiKey
from agentvm.errors import Forbidden, NotFound
from agentvm.ids import now_ms
from agentvm.ports import KeyStore

DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Caller:
    """Who manages keys: a tenant, and whether it may create and revoke them."""

    tenant_id: str
    admin: bool
    key_id: str | None = None


def key_wire(key: ApiKey, now: int) -> dict[str, Any]:
    status = "revoked" if key.revoked else "expired" if key.expired(now) else "active"
    return {"keyId": key.key_id, "tenantId": key.tenant_id, "scopes": list(key.scopes), "name": key.name,
            "createdAt": key.created_at, "expiresAt": key.expires_at, "revokedAt": key.revoked_at,
            "status": status}


class KeyService:
    def __init__(self, keys: KeyStore, authenticator: Authenticator | None = None) -> None:
        self.keys = keys
        self.authenticator = authenticator

    async def create(self, caller: Caller, *, scopes: list[str], name: str | None,
                     expires_days: int | None) -> tuple[ApiKey, str]:
        _admin(caller, "create keys")
        if "operator" in scopes:
            raise Forbidden("Operator keys are made by the deployment's operator (`avm keys create --scope "
                            "operator`), not over the API")
        now = now_ms()
        expires = None if expires_days is None else now + expires_days * DAY_MS
        key, token = new_key(caller.tenant_id, scopes, name=name, expires_at=expires, now_ms=now)
        await self.keys.put_key(key)
        return key, token

    async def list(self, caller: Caller) -> list[ApiKey]:
        return await self.keys.list_keys(caller.tenant_id)

    async def revoke(self, caller: Caller, key_id: str) -> None:
        _admin(caller, "revoke keys")
        if not await self.keys.revoke_key(caller.tenant_id, key_id, now_ms()):
            raise NotFound(f"API key not found: {key_id}", field="keyId")
        if self.authenticator is not None:
            self.authenticator.invalidate(key_id)


def _admin(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise Forbidden(f"Only an admin key may {what}")
