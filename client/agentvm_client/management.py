"""The management API from Python: definitions, images, sessions, resources, configuration, API keys,
usage and budgets over HTTP.

```python
async with ManagementClient("http://127.0.0.1:8080", token=None) as avm:
    await avm.resources.publish(kind="prompt", name="sales", version="1.0.0", content={"text": "..."})
    image = await avm.images.build("user-alice", agent="resource://agents/seller")
    print(image["pins"])
```

An image may have several sessions; each runs with the image exactly as it was built:

```python
    session = await avm.sessions.create(image["imageId"], title="Second try")
    async with await session.resume() as chat:     # the conversation, over the WebSocket
        result = await chat.send("Hello again")    # an agentvm_client.TurnResult
```

Errors raise `ManagementError` with the server's code, message and field. Streaming a conversation
is the WebSocket client's (`agentvm_client.AgentVMClient`); `Session.resume()` opens one for you.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

if TYPE_CHECKING:  # the WebSocket client loads only when a session is resumed
    from agentvm_client.client import AgentVMClient
    from agentvm_client.turns import TurnResult

JSON = dict[str, Any]


class ManagementError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def _failure(res: httpx.Response) -> ManagementError:
    try:
        body = res.json()
    except ValueError:
        body = None
    err = body.get("error", {}) if isinstance(body, dict) else {}
    if not isinstance(err, dict) or "message" not in err:  # not an AgentVM answer: its status, not its page
        return ManagementError(res.status_code, "error", f"{res.request.url} answered HTTP {res.status_code} "
                               f"{res.reason_phrase}".rstrip(), None)
    return ManagementError(res.status_code, str(err.get("code", "error")), str(err["message"]), err.get("field"))


class _Api:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def _call(self, method: str, path: str, *, json: Any = None, params: JSON | None = None) -> Any:
        res = await self._http.request(method, path, json=json,
                                       params={k: v for k, v in (params or {}).items() if v is not None})
        if res.status_code >= 400:
            raise _failure(res)
        if res.status_code == 204:
            return None
        try:
            return res.json()
        except ValueError:  # another kind of server at that address
            raise ManagementError(res.status_code, "bad_response", f"{res.request.url} answered HTTP "
                                  f"{res.status_code} without JSON: is it an AgentVM server?", None) from None


class Definitions(_Api):
    async def list(self) -> list[JSON]:
        return list((await self._call("GET", "/v1/definitions"))["items"])

    async def get(self, name: str) -> JSON:
        return dict(await self._call("GET", f"/v1/definitions/{name}"))


class Images(_Api):
    async def build(self, container_id: str, *, agent: str | None = None, config: JSON | None = None) -> JSON:
        body: JSON = {"containerId": container_id, "config": config or {}}
        if agent is not None:
            body["agent"] = agent
        return dict(await self._call("POST", "/v1/images", json=body))

    async def get(self, image_id: str) -> JSON:
        return dict(await self._call("GET", f"/v1/images/{image_id}"))

    async def list(self, container_id: str | None = None) -> list[JSON]:
        return list((await self._call("GET", "/v1/images", params={"containerId": container_id}))["items"])

    async def delete(self, image_id: str) -> None:
        await self._call("DELETE", f"/v1/images/{image_id}")


class Resources(_Api):
    async def register(self, *, kind: str, name: str, version: str, content: JSON, **extra: Any) -> JSON:
        body = {"kind": kind, "name": name, "version": version, "content": content, **extra}
        return dict(await self._call("POST", "/v1/resources", json=body))

    async def publish(self, *, kind: str, name: str, version: str, content: JSON, **extra: Any) -> JSON:
        """Register the resource, or add `version` to the caller's own resource of that kind and name.
        Safe to run again: a version that exists with the same content is returned as it is; one that
        exists with other content still raises the server's conflict (versions are immutable)."""
        own = await self._own(kind, name)
        if own is None:
            return await self.register(kind=kind, name=name, version=version, content=content, **extra)
        try:
            return await self.add_version(own, version=version, content=content, **extra)
        except ManagementError as conflict:
            if conflict.status != 409:
                raise
            try:
                existing = await self.get(own, version)
            except ManagementError:
                raise conflict from None
            if existing["content"] != content or any(existing.get(k) != v for k, v in extra.items()):
                raise
            return existing

    async def _own(self, kind: str, name: str) -> str | None:
        """The id of the caller's own resource `kind`/`name` (discover matches names by prefix)."""
        cursor: str | None = None
        while True:
            page = await self.discover(kind=kind, name=name, limit=200, cursor=cursor)
            for item in page["items"]:
                if item["own"] and item["name"] == name:
                    return str(item["resourceId"])
            cursor = page.get("nextCursor")
            if not cursor:
                return None

    async def add_version(self, resource_id: str, *, version: str, content: JSON, **extra: Any) -> JSON:
        return dict(await self._call("PUT", f"/v1/resources/{resource_id}",
                                     json={"version": version, "content": content, **extra}))

    async def discover(self, *, kind: str | None = None, name: str | None = None, tag: str | None = None,
                       q: str | None = None, limit: int = 50, cursor: str | None = None) -> JSON:
        return dict(await self._call("GET", "/v1/resources", params={
            "kind": kind, "name": name, "tag": tag, "q": q, "limit": limit, "cursor": cursor}))

    async def get(self, resource_id: str, version: str | None = None) -> JSON:
        return dict(await self._call("GET", f"/v1/resources/{resource_id}", params={"version": version}))

    async def resolve(self, uri: str) -> JSON:
        return dict(await self._call("GET", "/v1/resources/resolve", params={"uri": uri}))

    async def delete(self, resource_id: str, *, force: bool = False) -> None:
        await self._call("DELETE", f"/v1/resources/{resource_id}", params={"force": "true" if force else None})


class Session:
    """A session of an image, as the server described it (`data`); `resume()` continues it."""

    def __init__(self, data: JSON, sessions: Sessions) -> None:
        self.data = data
        self._sessions = sessions

    @property
    def session_id(self) -> str:
        return str(self.data["sessionId"])

    @property
    def image_id(self) -> str:
        return str(self.data["imageId"])

    @property
    def title(self) -> str | None:
        return self.data.get("title")

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, image={self.image_id!r}, title={self.title!r})"

    async def messages(self) -> list[JSON]:
        return await self._sessions.messages(self.session_id)

    async def turns(self) -> list[JSON]:
        return await self._sessions.turns(self.session_id)

    async def resume(self, client: AgentVMClient | None = None) -> Conversation:
        """The conversation of this session, to go on with: its turns run with the image as it was
        built (its pinned resources), however much later. Over the WebSocket: `client`, or one
        opened on the management client's `ws_url` and closed with the conversation."""
        current = await self._sessions.get(self.session_id)  # it still exists, with its image
        self.data = current.data
        if client is not None:
            return Conversation(self, client, own=False)
        from agentvm_client.client import AgentVMClient

        opened = AgentVMClient(self._sessions.ws_url, token=self._sessions.token)
        await opened.connect()
        return Conversation(self, opened, own=True)


class Conversation:
    """A resumed session: send messages, read the history. `async with` closes what it opened."""

    def __init__(self, session: Session, client: AgentVMClient, *, own: bool) -> None:
        self.session = session
        self.client = client
        self._own = own

    @property
    def image(self) -> JSON:
        """The image the session runs with: config, `pins` and `sources` as built."""
        return dict(self.session.data.get("image") or {})

    async def send(self, content: str | list[JSON], *, timeout: float | None = None) -> TurnResult:
        return await self.client.send_message(self.session.image_id, content, session_id=self.session.session_id,
                                              timeout=timeout)

    async def messages(self) -> list[JSON]:
        return await self.client.messages(self.session.image_id, session_id=self.session.session_id)

    async def close(self) -> None:
        if self._own:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class Sessions(_Api):
    def __init__(self, http: httpx.AsyncClient, *, ws_url: str, token: str | None) -> None:
        super().__init__(http)
        self.ws_url, self.token = ws_url, token

    async def create(self, image_id: str, *, title: str | None = None) -> Session:
        body = {"title": title} if title is not None else {}
        return Session(dict(await self._call("POST", f"/v1/images/{image_id}/sessions", json=body)), self)

    async def get(self, session_id: str) -> Session:
        return Session(dict(await self._call("GET", f"/v1/sessions/{session_id}")), self)

    async def delete(self, session_id: str) -> None:
        await self._call("DELETE", f"/v1/sessions/{session_id}")

    async def messages(self, session_id: str) -> list[JSON]:
        return list((await self._call("GET", f"/v1/sessions/{session_id}/messages"))["items"])

    async def send(self, session_id: str, content: str | list[JSON]) -> JSON:
        """Queue a message without following its turn (read it back with `turns`)."""
        return dict(await self._call("POST", f"/v1/sessions/{session_id}/messages", json={"content": content}))

    async def turns(self, session_id: str) -> list[JSON]:
        return list((await self._call("GET", f"/v1/sessions/{session_id}/turns"))["items"])

    async def export_bytes(self, session_id: str, *, include_secrets: bool = False,
                           progress: Callable[[int, int | None], None] | None = None) -> bytes:
        """The session's archive (JSON) as the server wrote it, streamed; `progress(received, total)`
        after each chunk (`total`: None when the server did not say). The image's secrets are
        `<redacted>` unless `include_secrets` (docs/sessions.md)."""
        params = {"includeSecrets": "true"} if include_secrets else None
        async with self._http.stream("GET", f"/v1/sessions/{session_id}/export", params=params) as res:
            if res.status_code >= 400:
                await res.aread()
                raise _failure(res)
            length = res.headers.get("content-length", "")
            total = int(length) if length.isdigit() else None
            chunks: list[bytes] = []
            received = 0
            async for chunk in res.aiter_bytes():
                chunks.append(chunk)
                received += len(chunk)
                if progress is not None:
                    progress(received, total)
        return b"".join(chunks)

    async def export(self, session_id: str, *, include_secrets: bool = False,
                     progress: Callable[[int, int | None], None] | None = None) -> JSON:
        """The session as a portable archive: image snapshot with pins, messages, turns, usage (the
        image's secrets `<redacted>` unless `include_secrets`)."""
        return dict(json.loads(await self.export_bytes(session_id, include_secrets=include_secrets,
                                                       progress=progress)))

    async def import_(self, archive: bytes | JSON, container_id: str, *,
                      progress: Callable[[int, int | None], None] | None = None) -> JSON:
        """Restore an archive into `container_id` as a new image and session (new ids): `{sessionId,
        imageId, containerId, messages, turns}`. Streamed; `progress(sent, total)` after each chunk."""
        data = archive if isinstance(archive, bytes) else json.dumps(archive, ensure_ascii=False).encode()

        async def chunks() -> AsyncIterator[bytes]:
            step = 256 * 1024
            for start in range(0, len(data), step):
                yield data[start:start + step]
                if progress is not None:
                    progress(min(start + step, len(data)), len(data))

        res = await self._http.post("/v1/sessions/import", params={"containerId": container_id}, content=chunks(),
                                    headers={"content-type": "application/json", "content-length": str(len(data))})
        if res.status_code >= 400:
            raise _failure(res)
        return dict(res.json())

    async def search(self, q: str, *, limit: int = 20, cursor: str | None = None) -> JSON:
        """Full-text search over the caller's messages: `items` (snippets with <mark>…</mark>) and
        `nextCursor` (None once the search is over)."""
        return dict(await self._call("GET", "/v1/sessions/search", params={"q": q, "limit": limit, "cursor": cursor}))

    async def page(self, *, image_id: str | None = None, limit: int = 50, cursor: str | None = None) -> JSON:
        """The caller's sessions, newest first (one image's with `image_id`): `items` and
        `nextCursor` (None once the list is over)."""
        return dict(await self._call("GET", "/v1/sessions", params={"imageId": image_id, "limit": limit,
                                                                     "cursor": cursor}))

    async def list(self, image_id: str) -> list[Session]:  # last: it shadows `list` in the class body
        items = (await self._call("GET", f"/v1/images/{image_id}/sessions"))["items"]
        return [Session(dict(i), self) for i in items]


class Config(_Api):
    async def get(self, key: str | None = None) -> JSON:
        return dict(await self._call("GET", f"/v1/config/{key}" if key else "/v1/config"))

    async def set(self, key: str, value: Any) -> JSON:
        return dict(await self._call("PUT", f"/v1/config/{key}", json={"value": value}))

    async def unset(self, key: str) -> JSON:
        return dict(await self._call("DELETE", f"/v1/config/{key}"))


class Keys(_Api):
    """The API keys of the caller's tenant (creating and revoking needs an admin key)."""

    async def create(self, *, scopes: list[str] | None = None, name: str | None = None,
                     expires_days: int | None = None) -> JSON:
        body = {k: v for k, v in {"scopes": scopes, "name": name, "expiresDays": expires_days}.items()
                if v is not None}
        return dict(await self._call("POST", "/v1/auth/keys", json=body))

    async def revoke(self, key_id: str) -> None:
        await self._call("DELETE", f"/v1/auth/keys/{key_id}")

    async def list(self) -> list[JSON]:  # last: it shadows `list` in the class body
        return list((await self._call("GET", "/v1/auth/keys"))["items"])


class Billing(_Api):
    """The caller's tenant's usage and budgets (setting and deleting budgets needs an admin key)."""

    async def usage(self, *, period: str | None = None, since: int | None = None, until: int | None = None,
                    group_by: str = "day") -> JSON:
        return dict(await self._call("GET", "/v1/usage", params={"period": period, "since": since, "until": until,
                                                                 "groupBy": group_by}))

    async def export(self, period: str, fmt: str = "focus") -> str:
        """The period's usage as FOCUS 1.0 CSV (`focus`) or JSON lines (`jsonl`)."""
        res = await self._http.get("/v1/usage/export", params={"period": period, "format": fmt})
        if res.status_code >= 400:
            raise _failure(res)
        return res.text

    async def budgets(self) -> JSON:
        return dict(await self._call("GET", "/v1/budgets"))

    async def set_budget(self, *, key_id: str | None = None, monthly: str | None = None,
                         requests_per_minute: int | None = None) -> JSON:
        body = {k: v for k, v in {"keyId": key_id, "monthlyBudget": monthly,
                                  "requestsPerMinute": requests_per_minute}.items() if v is not None}
        return dict(await self._call("PUT", "/v1/budgets", json=body))

    async def delete_budget(self, key_id: str | None = None) -> None:
        await self._call("DELETE", "/v1/budgets", params={"keyId": key_id})


def http_base(url: str) -> str:
    """`ws://host:port/ws` → `http://host:port` (wss → https); an http(s) URL is kept."""
    if url.startswith(("ws://", "wss://")):
        scheme = "https" if url.startswith("wss://") else "http"
        host = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
        return f"{scheme}://{host}"
    return url.rstrip("/")


def ws_url_for(url: str) -> str:
    """`http://host:port` → `ws://host:port/ws` (https → wss): where `avm serve` speaks AgentX. A
    ws(s) URL is kept (the cloud's WebSocket API has an address of its own)."""
    if url.startswith(("ws://", "wss://")):
        return url
    base = http_base(url)
    return ("wss://" if base.startswith("https://") else "ws://") + base.split("://", 1)[1] + "/ws"


class ManagementClient:
    """`url`: the server (http(s) or its ws(s) address); `ws_url`: the AgentX WebSocket for resumed
    sessions when it is not `url`'s (the cloud's WebSocket API)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0,
                 http_client: httpx.AsyncClient | None = None, ws_url: str | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=http_base(url), headers=headers, timeout=timeout)
        self.definitions = Definitions(self._http)
        self.images = Images(self._http)
        self.sessions = Sessions(self._http, ws_url=ws_url or ws_url_for(url), token=token)
        self.resources = Resources(self._http)
        self.config = Config(self._http)
        self.keys = Keys(self._http)
        self.billing = Billing(self._http)

    async def close(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
