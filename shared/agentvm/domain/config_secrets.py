"""The secrets an image's snapshot holds, for leaving them out of session archives.

An image's MCP servers and HTTP tools carry credentials in their configuration: stdio servers in
`env` (and sometimes in a flag of `args`), remote servers and HTTP tools in `headers` and in the
URL (a query value such as `?token=…`, or `user:password@`). `redact_config` replaces each of
those values with `REDACTED_MARK`; everything else is kept, so the image still says which servers
it had and how they were reached. Which values count as secret:

* every `env` value and every header value (no name is trusted to be harmless);
* every value of a URL's query string, and the URL's user information;
* in `args`: the value of a flag named like a credential (`--token=…`, `--api-key …`,
  `GITHUB_TOKEN=…`), and URLs as above. Other arguments are kept: a secret elsewhere in an argument
  (a path segment of a URL, a positional argument) is not recognized.

`missing_secrets` finds the markers again in an imported snapshot: a server holding one cannot be
started until it is given its real configuration."""

from __future__ import annotations

import copy
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

REDACTED_MARK = "<redacted>"

_SECRET_WORD = re.compile(r"token|key|secret|passw|pwd|auth|credential|sig|cookie|session", re.IGNORECASE)
_FLAG = re.compile(r"^(-{1,2}[A-Za-z0-9_.-]+)$")
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z0-9_.-]+)=(.*)$", re.DOTALL)


def redact_url(url: str) -> str:
    """`url` with its user information and every query value replaced by the marker."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return REDACTED_MARK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED_MARK}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(_redact_query_item(item) for item in parts.query.split("&")) if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_query_item(item: str) -> str:
    if not item:
        return item
    name, sep, value = item.partition("=")
    if not sep:
        return REDACTED_MARK  # a bare value (`?abc123`) may be a key itself
    return f"{name}={REDACTED_MARK}" if value else item


def _looks_like_url(text: str) -> bool:
    return text.startswith(("http://", "https://", "ws://", "wss://"))


def _redact_args(args: list[Any], found: list[str] | None = None) -> list[Any]:
    """`args` with credential values replaced; the replaced values are added to `found`."""
    out: list[Any] = []
    found = [] if found is None else found
    secret_next = False
    for arg in args:
        if not isinstance(arg, str):
            out.append(arg)
            continue
        if secret_next:
            out.append(REDACTED_MARK)
            found.append(arg)
            secret_next = False
            continue
        assignment = _ASSIGNMENT.match(arg)
        if assignment and _SECRET_WORD.search(assignment.group(1)) and assignment.group(2):
            out.append(f"{assignment.group(1)}={REDACTED_MARK}")
            found.append(assignment.group(2))
        elif _looks_like_url(arg):
            out.append(redact_url(arg))
            found.extend(url_secrets(arg))
        else:
            flag = _FLAG.match(arg)
            secret_next = bool(flag and arg.startswith("-") and _SECRET_WORD.search(arg))
            out.append(arg)
    return out


def url_secrets(url: str) -> list[str]:
    """The values `redact_url` replaces: the user information and every query value."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    found = [v for v in (parts.username, parts.password) if v]
    for item in parts.query.split("&"):
        name, sep, value = item.partition("=")
        found += [value, urllib.parse.unquote_plus(value)] if sep and value else [name] if name else []
    return found


def args_secrets(args: list[Any]) -> list[str]:
    """The values of `args` that `redact_config` replaces."""
    found: list[str] = []
    _redact_args(args, found)
    return found


def _redact_values(table: Any) -> Any:
    if not isinstance(table, Mapping):
        return table
    return {k: REDACTED_MARK if isinstance(v, str) and v else v for k, v in table.items()}


def redact_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """A copy of an image snapshot with its MCP servers' and HTTP tools' secrets replaced by
    `REDACTED_MARK`, and how many values were replaced."""
    out = copy.deepcopy(dict(config))
    servers = out.get("mcpServers")
    if isinstance(servers, dict):
        for server in servers.values():
            if not isinstance(server, dict):
                continue
            for key in ("env", "headers"):
                if key in server:
                    server[key] = _redact_values(server[key])
            if isinstance(server.get("url"), str):
                server["url"] = redact_url(server["url"])
            if isinstance(server.get("args"), list):
                server["args"] = _redact_args(server["args"])
    tools = out.get("httpTools")
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                if "headers" in tool:
                    tool["headers"] = _redact_values(tool["headers"])
                if isinstance(tool.get("url"), str):
                    tool["url"] = redact_url(tool["url"])
    return out, _count(out) - _count(dict(config))


def _count(value: Any) -> int:
    if isinstance(value, str):
        return value.count(REDACTED_MARK)
    if isinstance(value, Mapping):
        return sum(_count(v) for v in value.values())
    if isinstance(value, list):
        return sum(_count(v) for v in value)
    return 0


def missing_secrets(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Where an image snapshot holds `REDACTED_MARK`: the field paths, by MCP server name (HTTP tools
    under `httpTools[<name>]`)."""
    found: dict[str, list[str]] = {}
    servers = config.get("mcpServers")
    if isinstance(servers, Mapping):
        for name, server in servers.items():
            paths = _marked(server, f"mcpServers.{name}")
            if paths:
                found[str(name)] = paths
    tools = config.get("httpTools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            paths = _marked(tool, f"httpTools[{i}]")
            if paths:
                label = tool.get("name") if isinstance(tool, Mapping) else None
                found[f"httpTools[{label or i}]"] = paths
    return found


def _marked(value: Any, path: str) -> list[str]:
    if isinstance(value, str):
        return [path] if REDACTED_MARK in value else []
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _marked(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _marked(v, f"{path}[{i}]")]
    return []


def missing_secrets_message(found: Mapping[str, list[str]]) -> str:
    """Why tools with redacted secrets cannot run, which fields, and how to give them their values."""
    names = [f"HTTP tool '{k[len('httpTools['):-1]}'" if k.startswith("httpTools[") else f"MCP server '{k}'"
             for k in found]
    paths = [p for ps in found.values() for p in ps]
    one = len(names) == 1
    return (f"{', '.join(names)} of this image {'was' if one else 'were'} imported without "
            f"{'its' if one else 'their'} secrets: {', '.join(paths)} "
            f"{'holds' if len(paths) == 1 else 'hold'} \"{REDACTED_MARK}\" (the session archive was exported "
            "without them). Images cannot be edited: import the session again from an archive exported with "
            "includeSecrets=true (avm sessions export --include-secrets), or create a new image with the "
            "full configuration (image_create)")


class ServerConfig(Protocol):
    """What of an MCP server's parsed config (tools/mcp.py McpServerConfig) these functions read."""

    @property
    def name(self) -> str: ...
    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def url(self) -> str | None: ...
    @property
    def args(self) -> tuple[str, ...]: ...


def secret_values(cfg: ServerConfig) -> list[str]:
    """The values of a server's config that may be credentials (logs redact them once registered:
    agentvm.logs.register_secrets): env and header values (and a header's credential after its
    scheme, `Bearer <this>`), the URL's query values and user information, credential flags in args."""
    values = [v for _, v in cfg.env]
    for _, v in cfg.headers:
        values += [v, v.split()[-1]] if v.split() else [v]
    if cfg.url:
        values += url_secrets(cfg.url)
    return values + args_secrets(list(cfg.args))


def redacted_fields(cfg: ServerConfig) -> list[str]:
    """The fields of a server's config that hold `REDACTED_MARK` (imported without its secrets)."""
    base = f"mcpServers.{cfg.name}"
    fields = [f"{base}.env.{k}" for k, v in cfg.env if REDACTED_MARK in v]
    fields += [f"{base}.headers.{k}" for k, v in cfg.headers if REDACTED_MARK in v]
    fields += [f"{base}.args[{i}]" for i, a in enumerate(cfg.args) if REDACTED_MARK in a]
    return fields + ([f"{base}.url"] if cfg.url and REDACTED_MARK in cfg.url else [])
