"""What `AgentVMClient` raises."""

from __future__ import annotations

import asyncio

from agentvm_client.frames import Event

__all__ = ["ClientClosed", "ClientError", "ConnectError", "ConnectionLost", "RequestFailed", "RequestTimeout"]


class ClientError(Exception):
    """Base of every error raised by `AgentVMClient`."""


class ConnectError(ClientError):
    """The server could not be reached, or it refused the WebSocket upgrade."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConnectionLost(ClientError):
    """There is no usable connection, or it dropped before the answer arrived.

    A request that fails this way may or may not have reached the server; it is not resent.
    """


class ConnectionRefused(ConnectionLost):
    """The server closed the connection with 1008 (policy violation): it refuses this client, most
    often for its API key, and says why in `reason` ("API key required", "API key not valid").
    Reconnecting would be refused again: the client gives up."""

    def __init__(self, reason: str, *, code: int = 1008) -> None:
        super().__init__(f"the server refused the connection: {reason} (code {code})")
        self.reason = reason
        self.code = code


class ClientClosed(ConnectionLost):
    """`close()` was called."""


class RequestTimeout(ClientError, asyncio.TimeoutError):
    """No response (or, for `send_message`, no end of turn) within the timeout."""


class RequestFailed(ClientError):
    """The server answered with `data.error` set."""

    def __init__(self, message: str, response: Event) -> None:
        super().__init__(message)
        self.response = response
