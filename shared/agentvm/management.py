"""The management API from Python: definitions, images, resources and configuration over HTTP.

```python
async with ManagementClient("http://127.0.0.1:8080", token=None) as avm:
    await avm.resources.register(kind="prompt", name="sales", version="1.0.0", content={"text": "..."})
    image = await avm.images.build("user-alice", agent="resource://agents/seller")
    print(image["pins"])
```

Errors raise `ManagementError` with the server's code, message and field. The conversation itself
(messages, streaming) is the WebSocket client's (`agentvm.client.AgentVMClient`).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import httpx

JSON = dict[str, Any]


class ManagementError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


class _Api:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def _call(self, method: str, path: str, *, json: Any = None, params: JSON | None = None) -> Any:
        res = await self._http.request(method, path, json=json,
                                       params={k: v for k, v in (params or {}).items() if v is not None})
        if res.status_code == 204:
            return None
        body = res.json()
        if res.status_code >= 400:
            err = body.get("error", {}) if isinstance(body, dict) else {}
            raise ManagementError(res.status_code, str(err.get("code", "error")), str(err.get("message", res.text)),
                                  err.get("field"))
        return body


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


class Config(_Api):
    async def get(self, key: str | None = None) -> JSON:
        return dict(await self._call("GET", f"/v1/config/{key}" if key else "/v1/config"))

    async def set(self, key: str, value: Any) -> JSON:
        return dict(await self._call("PUT", f"/v1/config/{key}", json={"value": value}))

    async def unset(self, key: str) -> JSON:
        return dict(await self._call("DELETE", f"/v1/config/{key}"))


def http_base(url: str) -> str:
    """`ws://host:port/ws` → `http://host:port` (wss → https); an http(s) URL is kept."""
    if url.startswith(("ws://", "wss://")):
        scheme = "https" if url.startswith("wss://") else "http"
        host = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
        return f"{scheme}://{host}"
    return url.rstrip("/")


class ManagementClient:
    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0,
                 http_client: httpx.AsyncClient | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=http_base(url), headers=headers, timeout=timeout)
        self.definitions = Definitions(self._http)
        self.images = Images(self._http)
        self.resources = Resources(self._http)
        self.config = Config(self._http)

    async def close(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
