"""The conversation loop of `avm chat`: set up the image, read a line, run a command or a turn, repeat.

Ctrl-C while a reply streams sends `agent_interrupt_request` (the turn ends `interrupted`); a second
Ctrl-C before it ends leaves the chat. At the prompt Ctrl-C clears the line (chat_input.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from prompt_toolkit.application import run_in_terminal

from agentvm_client import AgentVMClient, ClientError, ConnectionLost, ConnectionRefused, RequestFailed, RequestTimeout
from agentvm_client.management import ManagementClient

from .chat_commands import Commands, Conversation, Exit, help_text
from .chat_input import LineInput
from .chat_render import Screen, TurnRenderer
from .runner import Args

_INTERRUPT_TIMEOUT_S = 10.0
_T = TypeVar("_T")


class ChatLoop:
    def __init__(self, client: AgentVMClient, http: ManagementClient, http_url: str, args: Args,
                 lines: LineInput, screen: Screen) -> None:
        self._client = client
        self._http = http
        self._http_url = http_url
        self._args = args
        self._lines = lines
        self._screen = screen
        self._quit = asyncio.Event()
        self._turn: TurnRenderer | None = None
        self._interrupt_sent = False
        self._background: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        try:
            where = await self._setup()
        except ClientError as exc:
            # a server that closes the connection at once (no key or a bad key: close 1008) ends here:
            # the line is "avm chat: " and the client's error, which names the refusal's reason
            hint = " (check --token or $AVM_TOKEN)" if isinstance(exc, ConnectionRefused) else ""
            self._screen.error(f"avm chat: {exc}{hint}")
            return 1
        self._screen.say(f"image: {where.image_id}")
        if self._screen.rich:
            self._screen.notice(help_text())
        commands = Commands(self._client, self._http, where, self._screen, self._http_url)
        self._client.on_disconnected(lambda: self._notice("(connection lost, reconnecting…)"))
        self._client.on_reconnected(lambda: self._notice("(reconnected)"))
        loop = asyncio.get_running_loop()
        try:
            while True:
                line = await self._race(self._lines.read())
                if line is None:
                    return 0
                text = line.strip()
                if not text:
                    continue
                if Commands.is_command(text):
                    await self._command(commands, text, loop)
                else:
                    await self._send(commands.where, text, loop)
                if self._client.failed is not None:
                    self._screen.error(f"avm chat: {self._client.failed}")
                    return 1
        except (Exit, _Quit):
            return 0
        finally:
            await self._drain_background()

    async def _setup(self) -> Conversation:
        if self._args.image:
            res = await self._client.request_ok("image_get", {"imageId": self._args.image})
            record = res["data"].get("record")
            if not isinstance(record, dict):
                raise ClientError(f"image not found: {self._args.image}")
            return Conversation(str(record.get("containerId") or self._args.container), str(self._args.image))
        container = self._args.container
        await self._client.request_ok("container_create", {"containerId": container})
        config: dict[str, Any] = {}
        if self._args.name:
            config["name"] = self._args.name
        if self._args.system:
            config["systemPrompt"] = self._args.system
        if self._args.tools:
            config["tools"] = [t.strip() for t in self._args.tools.split(",") if t.strip()]
        res = await self._client.request_ok("image_create", {"containerId": container, "config": config})
        record = res["data"].get("record")
        image_id = record.get("imageId") if isinstance(record, dict) else None
        if not isinstance(image_id, str) or not image_id:
            raise ClientError("the server did not return an image id")
        return Conversation(container, image_id)

    async def _command(self, commands: Commands, text: str, loop: asyncio.AbstractEventLoop) -> None:
        """Run a command; Ctrl-C while it waits (a slow server) cancels it, not the chat."""
        task = asyncio.ensure_future(commands.run(text))
        sigint = _install_sigint(loop, task.cancel)
        try:
            await self._race(asyncio.wait({task}))
        finally:
            if sigint:
                loop.remove_signal_handler(signal.SIGINT)
            if not task.done():
                task.cancel()
        if task.cancelled():
            self._screen.notice("(cancelled)")
        else:
            task.result()  # Exit, or a bug

    async def _send(self, where: Conversation, text: str, loop: asyncio.AbstractEventLoop) -> None:
        turn = self._turn = self._screen.renderer()
        self._interrupt_sent = False
        sigint = _install_sigint(loop, lambda: self._on_sigint(where))
        try:
            await self._race(self._client.send_message(where.image_id, text, session_id=where.session_id,
                                                       on_event=turn))
        except RequestFailed as exc:
            turn.finish()
            self._screen.error(f"error: {exc}")
        except RequestTimeout as exc:
            turn.finish()
            self._screen.error(f"error: {exc}")
        except ConnectionLost as exc:
            turn.finish()
            self._screen.error(f"error: {exc}; the message may not have been delivered")
        finally:
            if sigint:
                loop.remove_signal_handler(signal.SIGINT)
            self._turn = None
            turn.finish()

    def _on_sigint(self, where: Conversation) -> None:
        if self._turn is None or self._interrupt_sent:
            self._quit.set()
            return
        self._interrupt_sent = True
        self._turn.notice("(interrupting… press Ctrl-C again to quit)")
        task = asyncio.ensure_future(self._interrupt(where))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _interrupt(self, where: Conversation) -> None:
        payload = {"imageId": where.image_id}
        if where.session_id is not None:
            payload["sessionId"] = where.session_id
        try:
            await self._client.request_ok("agent_interrupt", payload, timeout=_INTERRUPT_TIMEOUT_S)
        except ClientError as exc:
            self._screen.error(f"error: interrupt failed: {exc}")

    async def _race(self, aw: Awaitable[_T]) -> _T:
        """Await `aw`, unless the user quits first: then cancel it and raise `_Quit`."""
        work = asyncio.ensure_future(aw)
        quit_wait = asyncio.ensure_future(self._quit.wait())
        try:
            await asyncio.wait({work, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, quit_wait):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        if work.cancelled():
            raise _Quit
        return work.result()

    async def _drain_background(self) -> None:
        if self._background:
            _done, pending = await asyncio.wait(set(self._background), timeout=_INTERRUPT_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    def _notice(self, text: str) -> None:
        if self._turn is not None:
            self._turn.notice(text)
        elif self._screen.rich:  # above the prompt, which is redrawn below it
            run_in_terminal(lambda: self._screen.notice(text))
        else:
            self._screen.notice(text)


class _Quit(Exception):
    """Ctrl-C twice during a reply."""


def _install_sigint(loop: asyncio.AbstractEventLoop, callback: Any) -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):  # e.g. Windows
        return False
    return True
