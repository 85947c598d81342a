"""The HTTP API (management API) through Mangum: every request names its caller with an API key
(`Authorization: Bearer <key>`); another tenant's ids answer as not found."""

from __future__ import annotations

from typing import Any

from mangum import Mangum
from starlette.requests import Request

from agentvm.api.http_app import HttpApi, create_app
from agentvm.auth.api_keys import http_token, require_operator
from agentvm.cloud.observability import Count, observe, status_class
from agentvm.cloud.runtime import loop, runtime
from agentvm.domain.models import Principal
from agentvm.errors import NotConfigured
from agentvm.services.config import ConfigService
from agentvm.services.keys import Caller, KeyService
from agentvm.services.resources import ResourceService

obs = observe("http_api")


async def _principal(request: Request) -> Principal:
    rt = await runtime().ready()
    # the header only: a key in a URL ends up in access logs
    return await rt.authenticator.authenticate(http_token(request.headers))


async def _admin(request: Request) -> Principal:
    rt = await runtime().ready()
    key = await rt.authenticator.authenticate_key(http_token(request.headers))
    require_operator(key)
    return Principal(key.tenant_id, key.key_id)


async def _key_caller(request: Request) -> Caller:
    rt = await runtime().ready()
    key = await rt.authenticator.authenticate_key(http_token(request.headers))
    return Caller(key.tenant_id, admin="admin" in key.scopes, key_id=key.key_id)


def _keys() -> KeyService:
    rt = runtime()
    return KeyService(rt.key_store, rt.authenticator)


def _resources() -> ResourceService:
    return ResourceService(runtime().store)  # a thin object over the environment's store


def _config() -> ConfigService:
    config = runtime().config
    if config is None:
        raise NotConfigured("AVM_CONFIG_PATH is not set: this deployment has no runtime configuration")
    return config


_asgi = Mangum(create_app(api=HttpApi(resources=_resources, principal_for=_principal, config=_config,
                                      admin_for=_admin, keys=_keys, key_caller=_key_caller,
                                      billing=lambda: runtime().billing, turn_log=lambda: runtime().store)),
                lifespan="off")


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    loop()  # the environment's loop, shared with the runtime's clients
    response = _asgi(event, context)
    # by status class only: a path holds ids, a route template would add a dimension per route
    obs.metric("Requests", Count, 1, status_class=status_class(response.get("statusCode")))
    return response
