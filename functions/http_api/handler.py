"""The HTTP API (management API) through Mangum: every request names its caller with an API key
(`Authorization: Bearer <key>`); another tenant's ids answer as not found."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import logging
from typing import TYPE_CHECKING, Any

from mangum import Mangum

from agentvm.api.http_app import HttpApi, create_app
from agentvm.api.http_callers import HttpCallers
from agentvm.auth.api_keys import Authenticator
from agentvm.cloud import init_phase
from agentvm.cloud.observability import Count, observe, status_class
from agentvm.cloud.runtime import loop, runtime
from agentvm.errors import NotConfigured
from agentvm.observability import tracing

if TYPE_CHECKING:  # the services are imported by the first request that uses them
    from agentvm.services.config import ConfigService
    from agentvm.services.keys import KeyService
    from agentvm.services.resources import ResourceService

log = logging.getLogger("agentvm.http_api")
obs = observe("http_api")


async def _authenticator() -> Authenticator:
    return (await runtime().ready()).authenticator


_callers = HttpCallers(_authenticator)


def _keys() -> KeyService:
    from agentvm.services.keys import KeyService

    rt = runtime()
    return KeyService(rt.key_store, rt.authenticator)


def _resources() -> ResourceService:
    from agentvm.services.resources import ResourceService

    return ResourceService(runtime().store)  # a thin object over the environment's store


def _config() -> ConfigService:
    config = runtime().config
    if config is None:
        raise NotConfigured("AVM_CONFIG_PATH is not set: this deployment has no runtime configuration")
    return config


_asgi = Mangum(create_app(api=HttpApi(resources=_resources, principal_for=_callers.principal, config=_config,
                                      admin_for=_callers.admin, keys=_keys, key_caller=_callers.key_caller,
                                      billing=lambda: runtime().billing, turn_log=lambda: runtime().store)),
                lifespan="off")


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    loop()  # the environment's loop, shared with the runtime's clients
    if isinstance(event.get("headers"), dict):
        tracing.inject(event["headers"])  # FastAPI's request span: a child of this invocation's
    response = _asgi(event, context)
    # totals only (a path holds ids; a status dimension would be billed per value): an error answer's
    # status is in its log line, and 5xx are counted apart for alarms
    status = response.get("statusCode")
    if not isinstance(status, int) or status >= 400:
        log.info("http request answered with an error", extra={"status": status, "status_class": status_class(status)})
    obs.metric("Requests", Count, 1)
    if isinstance(status, int) and status >= 500:
        obs.metric("ServerErrors", Count, 1)
    return response


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
