"""Tools registered in the resource center (`tool` resources), and the HTTP tools among them.

A tool resource's content is one of:

* `{"type": "builtin", "name": "bash"}`: a built-in tool (it runs in the container tier);
* `{"type": "mcp", "server": {...}}`: an MCP server (the `mcpServers` entry shape), whose tools
  reach the model as `mcp__<resource name>__<tool>`;
* `{"type": "http", "url": "https://…", "method"?: "POST"|"GET", "description": "…",
  "inputSchema": {JSON schema, type object}, "headers"?: {…}, "timeoutS"?: 1-30}`: an HTTP endpoint
  the model calls with the input (POST: as a JSON body; GET: as query parameters). It needs no
  sandbox, so it runs where the turn runs (the function tier too).

HTTP tools call only public addresses: the host is resolved once, every address must be public
(no loopback, private, link-local, multicast or reserved range: no cloud metadata endpoint, no
service next to the server), and the request goes to the address that was checked (no DNS
rebinding in between). Redirects are not followed. A deployment may allow private addresses
(`AVM_HTTP_TOOLS_ALLOW_PRIVATE`, e.g. for tools on its own network). Credential headers are
refused in a resource: its content is readable by whoever may read the resource.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import unavailable

JSON = dict[str, Any]

TOOL_TYPES = ("builtin", "mcp", "http")
HTTP_METHODS = ("GET", "POST")
MAX_TIMEOUT_S = 30.0
DEFAULT_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 256 * 1024
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def tool_name(resource_name: str) -> str:
    """The model-facing name of an HTTP tool resource (tool names allow no '.')."""
    return resource_name.replace(".", "_")[:64]


def check_tool_content(content: Mapping[str, Any]) -> None:
    """A tool resource's content: ValueError naming the problem (`field: why`)."""
    kind = content.get("type")
    if kind not in TOOL_TYPES:
        raise ValueError(f"type: one of {', '.join(TOOL_TYPES)}")
    if kind == "builtin":
        from agentvm.tools.builtin import BUILTIN_TOOLS

        if content.get("name") not in BUILTIN_TOOLS:
            raise ValueError(f"name: one of {', '.join(BUILTIN_TOOLS)}")
        _only(content, ("type", "name"))
    elif kind == "mcp":
        server = content.get("server")
        if not isinstance(server, dict):
            raise ValueError("server: an MCP server config ({command, args?, env?} or {type, url, headers?})")
        from agentvm.errors import InvalidRequest
        from agentvm.tools.mcp import parse_mcp_servers

        try:
            parse_mcp_servers({"server": server})
        except InvalidRequest as exc:
            raise ValueError(exc.message.replace("mcpServers.server", "server")) from None
        _only(content, ("type", "server"))
    else:
        _check_http(content)


def _check_http(content: Mapping[str, Any]) -> None:
    _only(content, ("type", "url", "method", "description", "inputSchema", "headers", "timeoutS"))
    url = content.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or len(url or "") > 2000:
        raise ValueError("url: an http(s) URL with a host")
    if parts.username or parts.password:
        raise ValueError("url: no credentials in the URL")
    if content.get("method", "POST") not in HTTP_METHODS:
        raise ValueError(f"method: one of {', '.join(HTTP_METHODS)}")
    description = content.get("description")
    if not isinstance(description, str) or not description.strip() or len(description) > 2000:
        raise ValueError("description: 1 to 2000 characters (the model reads it to decide when to call)")
    schema = content.get("inputSchema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError('inputSchema: a JSON schema with "type": "object"')
    headers = content.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("headers: an object of header names to strings")
    for name in headers:
        if name.lower() in CREDENTIAL_HEADERS:
            raise ValueError(f"headers.{name}: no credentials in a resource (its content is readable by "
                             "whoever may read the resource)")
    timeout = content.get("timeoutS", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"timeoutS: a number of seconds above 0, at most {MAX_TIMEOUT_S:g}")


def _only(content: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(content) - set(allowed))
    if extra:
        raise ValueError(f"{extra[0]}: unknown key (a {content.get('type')} tool has {', '.join(allowed)})")


def http_tool_spec(resource_name: str, pinned: str, content: Mapping[str, Any]) -> JSON:
    """The image snapshot's entry of an HTTP tool resource (`httpTools`)."""
    return {"name": tool_name(resource_name), "source": pinned, "url": content["url"],
            "method": content.get("method", "POST"), "description": content["description"],
            "inputSchema": content["inputSchema"], "headers": dict(content.get("headers", {})),
            "timeoutS": float(content.get("timeoutS", DEFAULT_TIMEOUT_S))}


class AddressRefused(Exception):
    pass


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _resolve(host: str, port: int, *, allow_private: bool) -> str:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise AddressRefused(f"{host} has no address")
    if not allow_private:
        refused = [a for a in addresses if not _public(a)]
        if refused:
            raise AddressRefused(f"{host} resolves to {refused[0]}, which is not a public address")
    return addresses[0]


class HttpTools:
    """The HTTP tools of one image (`ToolRunner`): each call is one request to the tool's endpoint."""

    def __init__(self, specs: list[JSON], *, allow_private: bool = False) -> None:
        self.specs = {str(s["name"]): s for s in specs}
        self.allow_private = allow_private

    def schemas(self) -> list[JSON]:
        return [{"name": name, "description": s["description"], "input_schema": s["inputSchema"]}
                for name, s in self.specs.items()]

    def needs_sandbox(self, name: str) -> bool:
        return False

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        spec = self.specs.get(name)
        if spec is None:
            return unavailable(name)
        import httpx  # loaded by the first HTTP tool call, not on a cold start

        parts = urlsplit(str(spec["url"]))
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            address = await _resolve(host, port, allow_private=self.allow_private)
        except AddressRefused as exc:
            return ToolOutcome(f"{name}: refused: {exc}", is_error=True)
        except OSError as exc:
            return ToolOutcome(f"{name}: cannot resolve {host}: {exc.strerror or exc}", is_error=True)
        netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        pinned_url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        headers = {**spec.get("headers", {}), "host": parts.netloc.rsplit("@", 1)[-1],
                   "user-agent": "AgentVM-http-tool"}
        method = str(spec.get("method", "POST"))
        request_args: JSON = {"headers": headers, "extensions": {"sni_hostname": host}}
        if method == "GET":
            request_args["params"] = {k: v if isinstance(v, str) else _json(v) for k, v in input_.items()}
        else:
            request_args["json"] = input_
        timeout = float(spec.get("timeoutS", DEFAULT_TIMEOUT_S))
        try:
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client, \
                    client.stream(method, pinned_url, **request_args) as res:
                body = bytearray()
                async for chunk in res.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        break
        except httpx.TimeoutException:
            return ToolOutcome(f"{name}: no answer from {host} within {timeout:g} s", is_error=True)
        except httpx.HTTPError as exc:
            return ToolOutcome(f"{name}: request to {host} failed: {type(exc).__name__}", is_error=True)
        text = bytes(body[:MAX_RESPONSE_BYTES]).decode("utf-8", errors="replace")
        if len(body) > MAX_RESPONSE_BYTES:
            text += f"\n[response cut at {MAX_RESPONSE_BYTES:,} bytes]"
        if res.status_code >= 300:
            return ToolOutcome(f"{name}: HTTP {res.status_code} from {host}\n{text}", is_error=True)
        return ToolOutcome(text)


def _json(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def http_tools(config: Mapping[str, Any], *, allow_private: bool) -> HttpTools | None:
    specs = config.get("httpTools") or []
    return HttpTools(list(specs), allow_private=allow_private) if specs else None
