"""The HTTP API (management API) through Mangum."""

from __future__ import annotations

from typing import Any

from mangum import Mangum

from agentvm.api.http_app import create_app

_asgi = Mangum(create_app(), lifespan="off")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _asgi(event, context)
