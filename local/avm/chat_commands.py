"""The slash commands of `avm chat` and the conversation they act on (an image and one of its sessions).

The AgentX WebSocket knows images (`/images`, `/resume img_…`, `/history`); sessions beyond an
image's primary one live in the management API over HTTP (`/new`, `/sessions`, `/resume sess_…`),
at the server's base URL (`avm serve`) or a stack's ChatStreamUrl (`--http-url`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from agentvm_client import AgentVMClient, ClientError
from agentvm_client.management import ManagementClient, ManagementError

from .chat_keys import KEYS_HELP
from .chat_render import Screen, describe_message

COMMANDS = (
    ("/new", "start a new session of this image (a fresh conversation, same agent)"),
    ("/sessions", "list this image's sessions (* marks the current one)"),
    ("/resume <id>", "continue a session (sess_…) or the primary session of an image (img_…)"),
    ("/images", "list the images of this container"),
    ("/history", "show the current conversation"),
    ("/help", "show this help"),
    ("/exit", "leave (also /quit, or Ctrl-D)"),
)


def help_text() -> str:
    width = max(len(name) for name, _ in COMMANDS)
    lines = [f"  {name.ljust(width)}  {what}" for name, what in COMMANDS]
    return "\n".join(["Commands:", *lines, KEYS_HELP])


@dataclass
class Conversation:
    """Where messages go: the image, and the session (None: the image's primary session)."""

    container_id: str
    image_id: str
    session_id: str | None = None


class Exit(Exception):
    """The user asked to leave."""


class Commands:
    def __init__(self, client: AgentVMClient, http: ManagementClient, where: Conversation, screen: Screen,
                 http_url: str) -> None:
        self._client = client
        self._http = http
        self.where = where
        self._screen = screen
        self._http_url = http_url
        self._table: dict[str, Callable[[str], Awaitable[None]]] = {
            "/new": self._new, "/sessions": self._sessions, "/resume": self._resume, "/images": self._images,
            "/history": self._history, "/help": self._help, "/exit": self._exit, "/quit": self._exit,
        }

    @staticmethod
    def is_command(text: str) -> bool:
        """`/word` first (a path such as `/etc/hosts …` is a message)."""
        return re.fullmatch(r"/[a-z]+", text.split(None, 1)[0] if text.strip() else "") is not None

    async def run(self, text: str) -> None:
        """Run one command line; `Exit` when it asks to leave. Failures are shown, not raised."""
        name, _, arg = text.strip().partition(" ")
        handler = self._table.get(name)
        if handler is None:
            self._screen.error(f"unknown command {name}; /help lists them")
            return
        try:
            await handler(arg.strip())
        except ManagementError as exc:
            self._screen.error(f"{name}: {exc.message or exc.code} (HTTP {exc.status} from {self._http_url})")
        except ClientError as exc:
            self._screen.error(f"{name}: {exc}")
        except httpx.HTTPError as exc:  # the HTTP API cannot be reached
            self._screen.error(f"{name}: cannot reach {self._http_url}: {exc} (a stack: pass --http-url "
                               "with its ChatStreamUrl)")

    async def _new(self, arg: str) -> None:
        session = await self._http.sessions.create(self.where.image_id, title=arg or None)
        self.where.session_id = session.session_id
        self._screen.notice(f"new session {session.session_id} of image {self.where.image_id}")

    async def _sessions(self, _arg: str) -> None:
        sessions = await self._http.sessions.list(self.where.image_id)
        current = self.where.session_id
        for s in sessions:
            primary = bool(s.data.get("primary"))
            mark = "*" if s.session_id == current or (current is None and primary) else " "
            fields = [f"{mark} {s.session_id}", _when(s.data.get("createdAt"))]
            if primary:
                fields.append("primary")
            if s.title:
                fields.append(str(s.title))
            self._screen.say("  ".join(f for f in fields if f))

    async def _resume(self, arg: str) -> None:
        if not arg:
            self._screen.error("/resume: which one? /resume sess_… or /resume img_… (/sessions, /images)")
            return
        if arg.startswith("img_"):
            res = await self._client.request_ok("image_get", {"imageId": arg})
            record = res["data"].get("record")
            if not isinstance(record, dict):
                self._screen.error(f"/resume: image not found: {arg}")
                return
            self.where.image_id, self.where.session_id = arg, None
            self.where.container_id = str(record.get("containerId") or self.where.container_id)
        else:
            session = await self._http.sessions.get(arg)
            self.where.image_id, self.where.session_id = session.image_id, session.session_id
            self.where.container_id = str(session.data.get("containerId") or self.where.container_id)
        messages = await self._client.messages(self.where.image_id, session_id=self.where.session_id)
        self._screen.notice(f"resumed {self.where.session_id or 'the primary session'} of image "
                            f"{self.where.image_id}: {_count(len(messages), 'message')}")
        for message in messages[-4:]:
            self._show(message)

    async def _images(self, _arg: str) -> None:
        res = await self._client.request_ok("image_list", {"containerId": self.where.container_id})
        records = res["data"].get("records")
        if not isinstance(records, list) or not records:
            self._screen.say(f"(no images in {self.where.container_id})")
            return
        for r in records:
            if isinstance(r, dict):
                mark = "*" if r.get("imageId") == self.where.image_id else " "
                state = "online" if r.get("online") else ""
                fields = [f"{mark} {r.get('imageId')}", _when(r.get("createdAt")), str(r.get("name") or ""), state]
                self._screen.say("  ".join(f for f in fields if f))

    async def _history(self, _arg: str) -> None:
        messages = await self._client.messages(self.where.image_id, session_id=self.where.session_id)
        if not messages:
            self._screen.say("(no messages)", "dim")
        for message in messages:
            self._show(message)

    async def _help(self, _arg: str) -> None:
        self._screen.notice(help_text())

    async def _exit(self, _arg: str) -> None:
        raise Exit

    def _show(self, message: Any) -> None:
        if isinstance(message, dict):
            who, body = describe_message(message)
            self._screen.say(f"{who}: {body}")


def _when(ms: Any) -> str:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
