"""AWS adapter fixtures: one moto server (server mode) per test session, dummy credentials per test.

The adapters' botocore clients talk HTTP to the server exactly as to AWS (they run on a thread
pool, which moto's in-process mock would not see consistently). Each test creates its own uniquely
named table or bucket, so tests never share state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import botocore.session
import pytest
from moto.server import ThreadedMotoServer

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, dummy_session, new_client

REGION = "us-east-1"


class _OneAtATime:
    """WSGI wrapper: moto handles one request at a time.

    DynamoDB applies every request to an item atomically (an `ADD` counter, a conditional put);
    moto's threaded server runs concurrent requests on the same item in parallel threads and can
    lose updates, which would make the concurrency tests test moto instead of the store.
    """

    #: Callables that see each request's WSGI environ before moto does (tests that check who signed what).
    listeners: list[Callable[[dict[str, Any]], None]] = []

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            for listener in list(self.listeners):
                listener(environ)
            return list(self._app(environ, start_response))


def signed_by(environ: dict[str, Any]) -> tuple[str, str] | None:
    """(access key id, service) from a request's SigV4 Authorization header or presigned query."""
    import re
    from urllib.parse import parse_qs

    auth = environ.get("HTTP_AUTHORIZATION", "")
    m = re.search(r"Credential=([^/,\s]+)/[^/]+/[^/]+/([^/]+)/", auth)
    if m is None:
        cred = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
        m = re.match(r"([^/]+)/[^/]+/[^/]+/([^/]+)/", cred)
    return (m.group(1), m.group(2)) if m else None


def exact_moto_numbers() -> None:
    """Make moto (5.2.5) write number sums as DynamoDB does. It stores `f"{Decimal}"`, so a counter
    that an `ADD` brings back to zero from 8 decimals holds "0E-8", which its next `ADD` cannot read
    (`int("0E-8")`: a 500). DynamoDB keeps numbers exact and plain: "0", "0.5", "10"."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    if getattr(DynamoType, "_avm_exact", False):
        return
    add, sub = DynamoType.__add__, DynamoType.__sub__

    def plain(result: DynamoType) -> DynamoType:
        if result.is_number():
            value = Decimal(result.value)
            result.value = format(value.normalize(), "f") if value else "0"
        return result

    DynamoType.__add__ = lambda self, other: plain(add(self, other))  # type: ignore[method-assign]
    DynamoType.__sub__ = lambda self, other: plain(sub(self, other))  # type: ignore[method-assign]
    DynamoType._avm_exact = True  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request
    exact_moto_numbers()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    wsgi = server._server  # the werkzeug server; requests reach it only after this fixture yields
    assert wsgi is not None
    wsgi.app = _OneAtATime(wsgi.app)
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def aws_session() -> botocore.session.Session:
    """One session for every test, with dummy credentials: botocore loads each service model once."""
    return dummy_session(REGION)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Dummy credentials and a region; no profile, config file or instance metadata is consulted."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                 "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path_factory.mktemp("aws") / "none"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def session(aws_env: None) -> botocore.session.Session:
    """A session of its own: the call counters registered on it do not leak into other tests."""
    return dummy_session()


def count_calls(session: botocore.session.Session, service: str, operation: str) -> list[str]:
    """A list that grows by one per `service.operation` call made by clients of `session` created
    after this call."""
    calls: list[str] = []

    def handler(**_: Any) -> None:
        calls.append(operation)

    session.register(f"before-call.{service}.{operation}", handler)
    return calls


@pytest.fixture
async def sm(session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[AsyncBotocoreClient]:
    client = new_client("secretsmanager", session=session, endpoint_url=moto_endpoint)
    yield client
    await client.close()


@pytest.fixture
async def ssm(session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[AsyncBotocoreClient]:
    client = new_client("ssm", session=session, endpoint_url=moto_endpoint)
    yield client
    await client.close()


@contextlib.asynccontextmanager
async def moto_table(moto_endpoint: str, *, session: botocore.session.Session | None = None,
                     **options: Any) -> AsyncIterator[Any]:
    """A fresh DynamoDB table of the store's schema on the moto server, opened; closed afterwards."""
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore

    store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=session, endpoint_url=moto_endpoint,
                          region_name=REGION, **options)
    await store.open()
    await store.create_table()
    try:
        yield store
    finally:
        await store.close()


async def put_new_key(store: Any, tenant: str) -> tuple[Any, str]:
    """An API key for `tenant` stored in the table: (the key, its token)."""
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.auth.api_keys import new_key

    key, token = new_key(tenant)
    await DynamoDBKeys(store).put_key(key)
    return key, token


def without_agentvm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the developer's shell reaches the handlers (AVM_*, LLM keys)."""
    for name in list(os.environ):
        if name.startswith(("AVM_", "LLM_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
