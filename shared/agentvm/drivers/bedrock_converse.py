"""A driver for Amazon Bedrock's ConverseStream over botocore (IAM credentials: no secret to keep).

botocore is synchronous: the call and each read of its event stream run on a thread pool of this
driver's own (one thread per concurrent stream while it waits for the model, so a stream never
queues behind other work on the loop's default executor; `max_concurrency` bounds both the threads
and botocore's connection pool). botocore parses the `application/vnd.amazon.eventstream` frames
(prelude and message CRCs, headers, exception events); `agentvm.drivers.bedrock_wire` maps them.

Credentials come from botocore's default chain (the Lambda/ECS role, the environment, a profile);
`region` picks the Bedrock endpoint, `endpoint_url` overrides it (a VPC endpoint, tests).

Failures are `UpstreamError`s with the Anthropic drivers' codes: ThrottlingException
rate_limit_error, ServiceUnavailable / ModelNotReady overloaded_error, InternalServer / ModelStream
api_error, ModelTimeout timeout_error (all retryable); Validation invalid_request_error,
AccessDenied permission_error, ResourceNotFound not_found_error, ServiceQuotaExceeded
rate_limit_error, missing or rejected credentials authentication_error (not retryable). botocore's
own retries are off: this driver retries as `anthropic_lite` does, only before the first event,
only retryable failures, at most `max_retries`, after a jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import botocore.config
import botocore.eventstream
import botocore.exceptions
import botocore.session

from agentvm.drivers.anthropic_lite import retry_delay_s
from agentvm.drivers.base import DriverEvent, LLMRequest
from agentvm.drivers.bedrock_wire import ConverseMapper, converse_params
from agentvm.errors import UpstreamError

T = TypeVar("T")
log = logging.getLogger(__name__)

# Error code (lower-cased: HTTP errors say "ThrottlingException", stream events "throttlingException")
# → (our code, retryable).
_ERRORS: dict[str, tuple[str, bool]] = {
    "throttlingexception": ("rate_limit_error", True),
    "serviceunavailableexception": ("overloaded_error", True),
    "modelnotreadyexception": ("overloaded_error", True),
    "internalserverexception": ("api_error", True),
    "modelstreamerrorexception": ("api_error", True),
    "modeltimeoutexception": ("timeout_error", True),
    "modelerrorexception": ("api_error", False),
    "validationexception": ("invalid_request_error", False),
    "accessdeniedexception": ("permission_error", False),
    "resourcenotfoundexception": ("not_found_error", False),
    "servicequotaexceededexception": ("rate_limit_error", False),
    "unrecognizedclientexception": ("authentication_error", False),
    "invalidsignatureexception": ("authentication_error", False),
    "expiredtokenexception": ("authentication_error", False),
}

# Sleeps between attempts go through here (tests replace it to observe the delays).
_sleep = asyncio.sleep
_END = object()


class BedrockConverseDriver:
    """`Driver` for `bedrock-runtime` ConverseStream. Model ids are Bedrock's
    (`anthropic.claude-3-5-haiku-20241022-v1:0`, an inference profile `us.anthropic.…`, or its ARN).
    The botocore client is made on first use and reused (it is thread-safe)."""

    def __init__(self, *, region: str | None = None, endpoint_url: str | None = None, name: str = "bedrock",
                 timeout_s: float = 600.0, connect_timeout_s: float = 10.0, max_retries: int = 2,
                 max_concurrency: int = 64, session: botocore.session.Session | None = None,
                 client: Any = None) -> None:
        self.name = name
        self._region = region
        self._endpoint_url = endpoint_url
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_retries = max(0, max_retries)
        self._max_concurrency = max(1, max_concurrency)
        self._session = session
        self._client = client
        self._client_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"BedrockConverseDriver(region={self._region!r}, endpoint_url={self._endpoint_url!r})"

    def _get_client(self) -> Any:
        with self._client_lock:  # called on the pool's threads: one client, made once
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> Any:
        session = self._session or botocore.session.get_session()
        config = botocore.config.Config(read_timeout=self._timeout_s, connect_timeout=self._connect_timeout_s,
                                        retries={"total_max_attempts": 1, "mode": "standard"},
                                        max_pool_connections=self._max_concurrency)
        return session.create_client("bedrock-runtime", region_name=self._region,
                                     endpoint_url=self._endpoint_url, config=config)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="bedrock")
        # the caller's context goes with the call (log fields, trace, whoever records the AWS calls)
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def aclose(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        params = converse_params(request)
        retries = 0
        while True:
            yielded = False
            try:
                async with contextlib.aclosing(self._attempt(params, request.model)) as events:
                    async for event in events:
                        yielded = True
                        yield event
                return
            except UpstreamError as exc:
                error = exc
            except Exception as exc:
                error = upstream_error(exc)
            if yielded or not error.retryable or retries >= self._max_retries:
                raise error from None
            await _sleep(retry_delay_s(retries, None))
            retries += 1

    async def _attempt(self, params: dict[str, Any], model: str) -> AsyncGenerator[DriverEvent, None]:
        # the client is made (and the credentials resolved) on the pool's thread, not the loop's
        response = await self._run(lambda: self._get_client().converse_stream(**params))
        request_id = str(response.get("ResponseMetadata", {}).get("RequestId") or "")
        mapper = ConverseMapper(model, f"msg_bdrk_{request_id}" if request_id else "msg_bdrk")
        event_stream = response["stream"]
        iterator = iter(event_stream)
        try:
            while True:
                event = await self._run(next, iterator, _END)
                if event is _END:
                    break
                for driver_event in mapper.map(event):
                    yield driver_event
        finally:
            event_stream.close()  # releases the HTTP connection (also when the consumer stopped early)
        if mapper.stop_reason is None:
            raise UpstreamError("The Bedrock stream ended before messageStop", code="connection_error",
                                retryable=True)
        yield mapper.stop()


def upstream_error(exc: Exception) -> UpstreamError:
    """A botocore (or urllib3) failure as an UpstreamError. AWS error messages carry no secret; the
    signed request (which does) is not chained."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        aws_code = str(error.get("Code") or "")
        code, retryable = _ERRORS.get(aws_code.lower(), ("", False))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if not code:
            retryable = isinstance(status, int) and (status == 429 or status >= 500)
            code = "rate_limit_error" if status == 429 else "api_error" if retryable else "upstream_error"
        if code in ("permission_error", "authentication_error"):
            # AWS's text names the deployment's role and account: kept for the operator's log only.
            log.warning("Bedrock refused the call", extra={"aws_error_code": aws_code,
                                                           "aws_message": str(error.get("Message") or "")})
            message = (f"{aws_code}: the deployment's AWS role may not call this model, or access to it is "
                       "not enabled in the Bedrock console" if code == "permission_error"
                       else f"{aws_code}: the deployment's AWS credentials were refused")
        else:
            message = str(error.get("Message") or "") or f"Bedrock error {aws_code or status}"
        return UpstreamError(f"Bedrock: {message}", code=code, retryable=retryable)
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return UpstreamError("Bedrock: no AWS credentials were found (the role, environment or profile)",
                             code="authentication_error")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return UpstreamError("Bedrock: no AWS region is configured for the Bedrock endpoint",
                             code="not_configured")
    if isinstance(exc, botocore.exceptions.ReadTimeoutError | botocore.exceptions.ConnectTimeoutError):
        return UpstreamError("The request to Bedrock timed out", code="timeout", retryable=True)
    if isinstance(exc, botocore.eventstream.ParserError):
        return UpstreamError("Bedrock sent a malformed event stream message", code="malformed_response",
                             retryable=True)
    if (isinstance(exc, botocore.exceptions.HTTPClientError | botocore.exceptions.ConnectionError | ConnectionError)
            or _is_urllib3_error(exc)):
        return UpstreamError("Could not reach Bedrock or the connection was lost", code="connection_error",
                             retryable=True)
    return UpstreamError(f"Bedrock request failed: {type(exc).__name__}", code="upstream_error")


def _is_urllib3_error(exc: Exception) -> bool:
    # A connection lost mid-stream surfaces from urllib3 unwrapped (ProtocolError, IncompleteRead …).
    return type(exc).__module__.startswith("urllib3.")
