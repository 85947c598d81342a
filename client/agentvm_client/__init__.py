"""The Python client of AgentVM: `AgentVMClient` speaks the AgentX WebSocket protocol (with AgentVM's
resume extensions), `ManagementClient` the management API over HTTP.

It needs only websockets, httpx and orjson, not the server (`pip install ./client` installs it alone).
Each name loads its module on first use, so `ManagementClient` alone never loads the WebSocket client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from agentvm_client.client import AgentVMClient
    from agentvm_client.errors import (
        ClientClosed,
        ClientError,
        ConnectError,
        ConnectionLost,
        ConnectionRefused,
        RequestFailed,
        RequestTimeout,
    )
    from agentvm_client.frames import Event, EventHandler, Hook
    from agentvm_client.management import ManagementClient, ManagementError, Session
    from agentvm_client.turns import TurnResult

_MODULE_OF = {
    "AgentVMClient": "client",
    "ClientClosed": "errors",
    "ClientError": "errors",
    "ConnectError": "errors",
    "ConnectionLost": "errors",
    "ConnectionRefused": "errors",
    "RequestFailed": "errors",
    "RequestTimeout": "errors",
    "Event": "frames",
    "EventHandler": "frames",
    "Hook": "frames",
    "ManagementClient": "management",
    "ManagementError": "management",
    "Session": "management",
    "TurnResult": "turns",
}

__all__ = [
    "AgentVMClient",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "ConnectionRefused",
    "Event",
    "EventHandler",
    "Hook",
    "ManagementClient",
    "ManagementError",
    "RequestFailed",
    "RequestTimeout",
    "Session",
    "TurnResult",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
