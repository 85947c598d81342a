"""Who calls the HTTP API: the caller dependencies every composition root gives the HTTP app (`avm
serve`, `http_api`, `chat_stream`). The key is read from the `Authorization` header only (a key in a
URL ends up in access logs); the request gate (api/request_gate.py) runs these before the body is
read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request

from agentvm.auth.api_keys import Authenticator, http_token, require_operator
from agentvm.domain.models import ApiKey, Principal
from agentvm.services.keys import Caller


class HttpCallers:
    """`authenticator`: the key check, or how to get it (a runtime built on first use).
    `open_tenant`: the open single-tenant mode of `avm serve` (no key is read; every caller is that
    tenant's operator); None: every request needs a key."""

    def __init__(self, authenticator: Authenticator | Callable[[], Awaitable[Authenticator]], *,
                 open_tenant: str | None = None) -> None:
        self._authenticator = authenticator
        self._open = None if open_tenant is None else Principal(open_tenant)

    async def key(self, request: Request) -> ApiKey | None:
        """The caller's key; None in the open mode."""
        if self._open is not None:
            return None
        found = self._authenticator
        authenticator = found if isinstance(found, Authenticator) else await found()
        return await authenticator.authenticate_key(http_token(request.headers))

    async def principal(self, request: Request) -> Principal:
        key = await self.key(request)
        return self._open_principal() if key is None else Principal(key.tenant_id, key.key_id)

    async def vendor_principal(self, request: Request) -> Principal:
        """The token API's caller (api/openai_http.py, api/anthropic_http.py): the key of `Authorization:
        Bearer` or `x-api-key`, as the vendors' SDKs send it; in the open mode, anyone."""
        if self._open is not None:
            return self._open
        from agentvm.api.token_common import vendor_token

        found = self._authenticator
        authenticator = found if isinstance(found, Authenticator) else await found()
        key = await authenticator.authenticate_key(vendor_token(request))
        return Principal(key.tenant_id, key.key_id)

    async def admin(self, request: Request) -> Principal:
        """A caller whose key has the `operator` scope; in the open mode, anyone."""
        key = await self.key(request)
        if key is None:
            return self._open_principal()
        require_operator(key)
        return Principal(key.tenant_id, key.key_id)

    async def key_caller(self, request: Request) -> Caller:
        key = await self.key(request)
        if key is None:
            return Caller(self._open_principal().tenant_id, admin=True)  # the open mode's operator
        return Caller(key.tenant_id, admin="admin" in key.scopes, key_id=key.key_id)

    def _open_principal(self) -> Principal:
        assert self._open is not None
        return self._open
