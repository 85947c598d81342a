"""The error hierarchy. Each class maps once to a protocol error code and an HTTP status."""

from __future__ import annotations


class AgentVMError(Exception):
    """Base of every error that is safe to show to a client."""

    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(AgentVMError):
    code = "invalid_request"
    http_status = 400


class UnknownModel(InvalidRequest):
    """A model this server neither prices nor runs (an image's `model`): the message lists the known ones."""

    code = "unknown_model"


class NotFound(AgentVMError):
    code = "not_found"
    http_status = 404


class Conflict(AgentVMError):
    code = "conflict"
    http_status = 409


class Unauthorized(AgentVMError):
    code = "unauthorized"
    http_status = 401


class Forbidden(AgentVMError):
    code = "forbidden"
    http_status = 403


class QuotaExceeded(AgentVMError):
    code = "quota_exceeded"
    http_status = 429


class RateLimited(AgentVMError):
    code = "rate_limited"
    http_status = 429


class PayloadTooLarge(AgentVMError):
    """A request body over the server's limit (refused before it is read whole)."""

    code = "payload_too_large"
    http_status = 413


class NotConfigured(AgentVMError):
    """The deployment lacks a setting this request needs."""

    code = "not_configured"
    http_status = 503


class ContainerUnavailable(AgentVMError):
    """The container tier could not take a turn (not configured, or its task did not start)."""

    code = "container_unavailable"
    http_status = 503


class SandboxUnavailable(AgentVMError):
    """No isolating tool sandbox on this host and no unsafe opt-in: tools that need one are refused
    (agentvm/adapters/local/tool_sandbox.py)."""

    code = "sandbox_unavailable"
    http_status = 503


class SecretsMissing(AgentVMError):
    """The image was imported from a session archive exported without its secrets (the values hold
    `<redacted>`): the tools that need them cannot run (domain/config_secrets.py)."""

    code = "secrets_missing"
    http_status = 409


class StorageUnavailable(AgentVMError):
    """The database cannot be read or written (a damaged page, an I/O error, a full disk): nothing
    the caller did; the operator has to act (`/health` says what)."""

    code = "storage_unavailable"
    http_status = 503


class WorkerLost(AgentVMError):
    """The process running a turn stopped before the turn finished (cloud: a `chat_turn` invocation
    or container task that died holding the session's lease)."""

    code = "worker_lost"
    http_status = 503


class UpstreamError(AgentVMError):
    """The LLM provider (or another upstream) failed. `code` is the provider's error code."""

    code = "upstream_error"
    http_status = 502

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        if code:
            self.code = code
        self.retryable = retryable


def public_message(exc: BaseException) -> str:
    """The text a client may see for an exception: ours verbatim, anything else generic."""
    if isinstance(exc, AgentVMError):
        return exc.message
    return "Internal error"
