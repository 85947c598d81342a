"""`avm doctor`: the smoke test of a running deployment (`avm serve`, or the cloud stack after a deploy).

One line per step, `PASS`, `FAIL` (the reason, then `fix:` and what to try) or `SKIP` (an earlier
step it needs failed): the health check, the API key, an image of its own, one turn over the AgentX
WebSocket and one over the SSE chat API (both on that image's session), the usage records of those
two turns read back from the usage API, and the image deleted again. Exit 0 when every step passed,
1 when one failed, 2 for a usage mistake (docs/deploy.md, "Smoke test").

`avm serve` answers all of it on one base URL. A cloud stack has three (its outputs): `--url`
HttpApiUrl (health, usage), `--ws-url` WebSocketUrl, `--stream-url` ChatStreamUrl (images and the
SSE chat API)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, TextIO
from urllib.parse import urlsplit

import click
import httpx
import orjson
from httpx_sse import EventSource, SSEError

from agentvm.config import ClientSettings
from agentvm.errors import InvalidRequest
from avm.runner import Args, Command, run
from avm.server_args import env_token

CONTAINER = "avm-doctor"  # reused by every run: the protocol has no container delete, an empty one costs nothing
DEFAULT_MODEL = "claude-haiku-4-5"  # the cheapest current model of the shipped price table
MAX_TOKENS = 32
PROMPT = "Reply with the single word OK."
USAGE_WAIT_S = 15.0  # a usage record is written when its call settles; the cloud may show it a moment later


def _given_url() -> str | None:
    env = ClientSettings()
    return env.url if "url" in env.model_fields_set else None


@click.command(cls=Command, help=__doc__.split("\n\n")[0] if __doc__ else None,
               short_help="smoke-test a running deployment: health, key, a WebSocket and an SSE turn, their usage "
                          "records; PASS/FAIL per step")
@click.option("--url", metavar="URL", default=_given_url,
              help="the server: avm serve's base (http://127.0.0.1:8080 or its ws:// URL), or a stack's HttpApiUrl "
                   "output (default: $AVM_URL)")
@click.option("--token", metavar="KEY", default=env_token,
              help="an API key of the deployment (default: $AVM_TOKEN); not needed by avm serve's open mode")
@click.option("--ws-url", metavar="URL", help="the AgentX WebSocket (stack output WebSocketUrl; default: <url>/ws)")
@click.option("--stream-url", metavar="URL",
              help="the SSE chat API and images (stack output ChatStreamUrl; default: --url)")
@click.option("--model", metavar="MODEL", default=DEFAULT_MODEL,
              help=f"model of the test image (default {DEFAULT_MODEL}; 'default': the deployment's own)")
@click.option("--timeout", type=float, metavar="SECONDS", default=120.0,
              help="seconds each turn may take (default 120)")
def doctor(**_: Any) -> int:
    return run(run_doctor)


@dataclass(frozen=True, slots=True)
class Targets:
    http: str  # health, the usage API
    ws: str  # the AgentX WebSocket
    stream: str  # /v1/images and the SSE chat API


def _base(value: str, flag: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.hostname:
        names = [f"{s}://" for s in schemes]
        allowed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise InvalidRequest(f"{flag}: must be a URL starting with {allowed} and naming a host, not {value!r}",
                             field=flag)
    return value.rstrip("/")


def targets(args: Args) -> Targets:
    """The three addresses from the flags; InvalidRequest for a missing or malformed one."""
    if not args.url:
        raise InvalidRequest("--url: required (avm serve: http://127.0.0.1:8080; a stack: its HttpApiUrl "
                             "output), or set $AVM_URL", field="url")
    url = _base(args.url, "--url", ("http", "https", "ws", "wss"))
    parts = urlsplit(url)
    if parts.scheme in ("ws", "wss"):  # avm serve's ws://host:port/ws: the same server over HTTP
        http = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"
        ws = url
    else:
        http = url
        ws = f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{parts.path}/ws"
    if args.ws_url:
        ws = _base(args.ws_url, "--ws-url", ("ws", "wss"))
    stream = _base(args.stream_url, "--stream-url", ("http", "https")) if args.stream_url else http
    if args.timeout <= 0:
        raise InvalidRequest("--timeout: must be a positive number of seconds", field="timeout")
    return Targets(http, ws, stream)


def shown(url: str) -> str:
    """`url` as printed: without its query, where a `?token=` would be."""
    return url.split("?", 1)[0]


class StepFailed(Exception):
    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.reason, self.fix = reason, fix


@dataclass(slots=True)
class _Turn:
    turn_id: str
    billed: Decimal


@dataclass(slots=True)
class _State:
    image_id: str | None = None
    session_id: str | None = None
    turns: list[_Turn] = field(default_factory=list)
    billed: Decimal | None = None  # of the usage records read back


def _unreachable(base: str, exc: Exception) -> StepFailed:
    detail = str(exc) or type(exc).__name__
    return StepFailed(f"cannot reach {base}: {detail}",
                      "is the server running and is the URL right? (a stack: the outputs of `aws cloudformation "
                      "describe-stacks`)")


def _error_text(res: httpx.Response) -> str:
    try:
        body = res.json()
    except ValueError:
        return f"HTTP {res.status_code}: {res.text[:200]}"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return f"HTTP {res.status_code} {err.get('code', 'error')}: {err.get('message', '')}"
    if isinstance(body, dict) and "message" in body:  # API Gateway's own answers ({"message": "Forbidden"})
        return f"HTTP {res.status_code}: {body['message']}"
    return f"HTTP {res.status_code}: {res.text[:200]}"


def _key_fix(token: str | None) -> str:
    if token is None:
        return ("this server requires an API key: pass --token or set $AVM_TOKEN (avm keys create --tenant T "
                "--data-dir DIR)")
    return ("--token must be an active API key of this deployment (avm keys create --tenant T, with --data-dir "
            "DIR, or --table <TableName> for a stack)")


def _money(value: object) -> Decimal:
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return Decimal(0)


class Doctor:
    def __init__(self, where: Targets, token: str | None, model: str | None, timeout: float, out: TextIO) -> None:
        self.where, self.token, self.model, self.timeout, self.out = where, token, model, timeout, out
        self.state = _State()
        self.failed: list[str] = []
        self.skipped = 0
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30.0, read=timeout))

    async def run(self) -> int:
        started = time.time()
        try:
            reachable = await self._step("health", self._health)
            keyed = await self._step("auth", self._auth, needs="a server that answers", ok=reachable)
            built = await self._step("image", self._image, needs="an accepted API key", ok=keyed)
            await self._step("websocket turn", self._ws_turn, needs="an image", ok=built)
            await self._step("sse turn", self._sse_turn, needs="an image", ok=built)
            await self._step("usage", lambda: self._usage(started), needs="a turn that completed",
                             ok=bool(self.state.turns))
            await self._step("cleanup", self._cleanup, needs="an image to delete", ok=built)
        finally:
            await self._http.aclose()
        self._summary()
        return 1 if self.failed else 0

    async def _step(self, name: str, action: Callable[[], Awaitable[str]], *, needs: str = "",
                    ok: bool = True) -> bool:
        if not ok:
            self.skipped += 1
            self._line("SKIP", name, f"needs {needs}")
            return False
        try:
            detail = await action()
        except StepFailed as exc:
            self.failed.append(name)
            self._line("FAIL", name, f"{exc.reason} — fix: {exc.fix}")
            return False
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # an answer not shaped like AgentVM's
            self.failed.append(name)
            self._line("FAIL", name, f"unexpected answer ({type(exc).__name__}: {exc}) — fix: do the URLs lead to "
                                     "an AgentVM server of this version?")
            return False
        self._line("PASS", name, detail)
        return True

    def _line(self, status: str, name: str, detail: str) -> None:
        self.out.write(f"{status}  {name:<14}  {detail}\n")
        self.out.flush()

    def _summary(self) -> None:
        steps = 7
        if self.failed:
            skipped = f", {self.skipped} skipped" if self.skipped else ""
            self.out.write(f"avm doctor: {len(self.failed)} of {steps} steps failed ({', '.join(self.failed)})"
                           f"{skipped}\n")
            return
        cost = "" if self.state.billed is None else f"; the test turns cost {self.state.billed:f} USD billed"
        self.out.write(f"avm doctor: all {steps} steps passed{cost}\n")

    async def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            parts = urlsplit(url)
            raise _unreachable(f"{parts.scheme}://{parts.netloc}", exc) from None

    # ---------------------------------------------------------------------------------------- steps

    async def _health(self) -> str:
        url = f"{self.where.http}/health"
        res = await self._request("GET", url)
        if res.status_code != 200:
            raise StepFailed(f"{url}: {_error_text(res)}", "is --url the server's base (a stack: HttpApiUrl)?")
        body = res.json()
        if body.get("status") != "ok":
            problems = "; ".join(str(p) for p in body.get("problems", [])) or "no reason given"
            raise StepFailed(f"{url}: {body.get('status')}: {problems}", "see the server's log")
        return f"{url}: ok, version {body.get('version', '?')}"

    async def _auth(self) -> str:
        res = await self._request("GET", f"{self.where.http}/v1/usage", params={"period": _month()})
        if res.status_code in (401, 403):
            raise StepFailed(f"the API key was refused: {_error_text(res)}", _key_fix(self.token))
        if res.status_code != 200:
            raise StepFailed(f"/v1/usage: {_error_text(res)}", "see the server's log")
        return "/v1/usage answered with this key" if self.token else "/v1/usage answered without a key (open mode)"

    async def _image(self) -> str:
        config: dict[str, Any] = {"name": "avm doctor", "systemPrompt": PROMPT, "maxTokens": MAX_TOKENS}
        if self.model:
            config["model"] = self.model
        res = await self._request("POST", f"{self.where.stream}/v1/images",
                                  json={"containerId": CONTAINER, "config": config})
        if res.status_code != 201:
            fix = _key_fix(self.token) if res.status_code in (401, 403) else \
                "is --stream-url right (a stack: ChatStreamUrl)?"
            raise StepFailed(f"POST /v1/images: {_error_text(res)}", fix)
        body = res.json()
        self.state.image_id, self.state.session_id = str(body["imageId"]), str(body["sessionId"])
        model = body.get("model") or "of the server's default"
        return f"image {self.state.image_id} in container {CONTAINER}, model {model}"

    async def _ws_turn(self) -> str:
        from agentvm_client import AgentVMClient, ClientError, ConnectError, ConnectionRefused

        assert self.state.image_id is not None
        client = AgentVMClient(self.where.ws, token=self.token, reconnect=False)
        try:
            try:
                await client.connect()
            except ConnectError as exc:
                if exc.status in (401, 403):
                    raise StepFailed(f"{shown(self.where.ws)}: the upgrade was refused (HTTP {exc.status})",
                                     _key_fix(self.token)) from None
                detail = shown(str(exc).removeprefix(f"cannot connect to {self.where.ws}: "))
                raise StepFailed(f"cannot reach {shown(self.where.ws)}: {detail}",
                                 "is --ws-url right (a stack: its WebSocketUrl output)?") from None
            try:
                result = await client.send_message(self.state.image_id, "Say OK.", session_id=self.state.session_id,
                                                   timeout=self.timeout)
            except ConnectionRefused as exc:  # avm serve, a host's front: the upgrade accepted, then closed 1008
                raise StepFailed(f"{shown(self.where.ws)}: the connection was refused: {exc.reason}",
                                 _key_fix(self.token)) from None
            except ClientError as exc:
                raise StepFailed(f"the turn did not complete: {exc}", "see the server's log (a stack: the chat_turn "
                                                                       "function's log group)") from None
        finally:
            await client.close()
        turn = result.turn or {}
        if not result.ok or turn.get("status") != "completed":
            reason = result.error or f"status {turn.get('status', 'unknown')}"
            code = f" ({result.error_code})" if result.error_code else ""
            raise StepFailed(f"the turn failed{code}: {reason}", _turn_fix(result.error_code))
        return self._turn_done(str(turn.get("turnId")), turn.get("cost") or {}, turn.get("model"),
                               turn.get("durationMs"), result.text)

    async def _sse_turn(self) -> str:
        url = f"{self.where.stream}/api/v1/chat/completions"
        events: list[tuple[str, Any]] = []
        try:
            async with self._http.stream("POST", url, json={"session_id": self.state.session_id,
                                                            "message": "Say OK."}) as res:
                if res.status_code != 200:
                    await res.aread()
                    fix = _key_fix(self.token) if res.status_code in (401, 403) else "see the server's log"
                    raise StepFailed(f"POST /api/v1/chat/completions: {_error_text(res)}", fix)
                async for sse in EventSource(res).aiter_sse():
                    events.append((sse.event, orjson.loads(sse.data)))
        except SSEError:  # a 200 that is no event stream: not the chat_stream address
            raise StepFailed(f"POST /api/v1/chat/completions answered {res.headers.get('content-type')!r}, not "
                             "text/event-stream", "is --stream-url right (a stack: ChatStreamUrl)?") from None
        except httpx.HTTPError as exc:
            if not events:
                raise _unreachable(self.where.stream, exc) from None
            raise StepFailed(f"the stream broke after {len(events)} events: {exc}", "see the server's log") from None
        done = next((data for name, data in events if name == "done"), None)
        if done is None:
            raise StepFailed(f"the stream ended without a done event ({len(events)} events)",
                             "see the server's log (a stack: the chat_stream function's log group)")
        if done.get("status") != "completed":
            error: dict[str, Any] = next((data for name, data in events if name == "error"), {})
            code = f" ({error['code']})" if error.get("code") else ""
            raise StepFailed(f"the turn {done.get('status')}{code}: {error.get('message', 'no error event')}",
                             _turn_fix(error.get("code")))
        text = "".join(str(data.get("content", "")) for name, data in events if name == "message")
        return self._turn_done(str(done.get("turn_id")), done.get("cost") or {}, done.get("model"),
                               done.get("duration_ms"), text)

    def _turn_done(self, turn_id: str, cost: dict[str, Any], model: object, duration_ms: object, text: str) -> str:
        billed = _money(cost.get("billed", "0"))
        self.state.turns.append(_Turn(turn_id, billed))
        return (f"turn {turn_id} completed: {len(text)} characters from {model}, {duration_ms} ms, "
                f"{billed:f} USD billed")

    async def _usage(self, started: float) -> str:
        wanted = {t.turn_id for t in self.state.turns}
        days = sorted({_day(started), _day(time.time())})
        deadline = time.monotonic() + USAGE_WAIT_S
        while True:
            records: list[dict[str, Any]] = []
            for day in days:
                res = await self._request("GET", f"{self.where.http}/v1/usage/export",
                                          params={"period": day, "format": "jsonl"})
                if res.status_code != 200:
                    raise StepFailed(f"/v1/usage/export: {_error_text(res)}", "see the server's log")
                records += [r for r in map(orjson.loads, res.text.splitlines()) if r.get("turnId") in wanted]
            missing = wanted - {r["turnId"] for r in records if r.get("kind") == "llm"}
            if not missing or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        if missing:
            raise StepFailed(f"no usage record of turn {', '.join(sorted(missing))} after {USAGE_WAIT_S:g} s",
                             "the ledger write failed: look for `usage record not written` in the server's log")
        billed = sum((_money(r.get("billedCost")) for r in records), Decimal(0))
        expected = sum((t.billed for t in self.state.turns), Decimal(0))
        if billed != expected:
            raise StepFailed(f"the usage records bill {billed:f} USD, the turns said {expected:f} USD",
                             "a bug: report it with both turn ids")
        self.state.billed = billed
        tokens_in = sum(int(r["usage"].get("inputTokens", 0)) for r in records)
        tokens_out = sum(int(r["usage"].get("outputTokens", 0)) for r in records)
        providers = ", ".join(sorted({str(r.get("provider")) for r in records}))
        return (f"{_count(len(records), 'record')} of {_count(len(wanted), 'turn')}: {tokens_in} input and "
                f"{tokens_out} output tokens, "
                f"{billed:f} USD billed (provider {providers})")

    async def _cleanup(self) -> str:
        image = self.state.image_id
        res = await self._request("DELETE", f"{self.where.stream}/v1/images/{image}")
        if res.status_code not in (204, 404):
            raise StepFailed(f"DELETE /v1/images/{image}: {_error_text(res)}",
                             f"delete it later: curl -X DELETE <stream-url>/v1/images/{image} with the key")
        return f"deleted image {image} (the usage records stay: they are the bill)"


def _turn_fix(code: object) -> str:
    if code in ("quota_exceeded", "rate_limited"):
        return "the tenant's budget or rate limit refused it: avm budgets list (with the key)"
    if code in ("authentication_error", "permission_error", "not_configured", "secrets_missing"):
        return "the LLM key: see docs/deploy.md, 'Store the LLM key'"
    if code in ("overloaded_error", "rate_limit_error"):
        return "the LLM provider is busy: run avm doctor again in a minute"
    return "see the server's log (a stack: the chat_turn and chat_stream log groups)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _day(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d")


def _month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


async def run_doctor(args: Args, *, out: TextIO | None = None) -> int:
    import sys

    try:
        where = targets(args)
    except InvalidRequest as exc:  # a usage mistake: one line, exit 2
        print(f"avm doctor: {exc.message}", file=sys.stderr)
        return 2
    model = None if args.model in ("", "default") else args.model
    return await Doctor(where, args.token or None, model, args.timeout, out or sys.stdout).run()
