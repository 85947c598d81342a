"""Protocol fuzzing (the reliability issue): hypothesis-generated frames against the command router
in-process (fast, many examples) and against a live `avm serve` over real WebSockets.

The oracle: a frame that is JSON text (RFC 8259: UTF-8, any depth, any number, escaped lone
surrogates allowed) holding an object, not an ACK, whose `type` ends in `_request` and whose
`data.requestId` is a non-empty string of valid Unicode gets exactly ONE `<command>_response` with
that requestId; any other frame gets none. A frame nested deeper than orjson reads (1024 levels) gets
one `system_error` saying so, unless it is JSON that is not an object; one too large for the deep
scanner (DEEP_SCAN_MAX) gets it without a requestId, naming the scan limit. Besides: no error text
leaks a traceback, a source path or an exception class (unless the frame itself held that text); no
request fails with `internal_error` (the protocol's 5xx); the router never raises; the connection
stays open, except for a frame over `max_frame_bytes` (close 1009 with a reason) or a text frame that
is not UTF-8 (close 1007), which close that connection only; a second, well-behaved connection
meanwhile gets correct answers and nothing else.

`make test` runs a small deterministic sample (150 router examples, ~60 live frames); FUZZ_SCALE=<n>
multiplies the examples (e.g. FUZZ_SCALE=20 for a long run)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentvm.api.ws_hub import Connection
from agentvm.config import Settings
from agentvm.domain.models import DEFAULT_TENANT, Principal
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.protocol.commands import COMMANDS, ImageConfig
from agentvm.protocol.refused import DEEP_SCAN_MAX, PARSER_MAX_DEPTH, _scan
from avm.app import Runtime, build_runtime
from tests.support.servers import REPO, InProcess, in_process
from tests.support.stock_client import Event, StockClient
from tests.unit.test_router import json_values, request_frames, scalars

SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
ROUTER_EXAMPLES = 150 * SCALE
LIVE_EXAMPLES = 15 * SCALE
LIVE_LIMIT = 16 * 1024  # the live server's max_frame_bytes: huge frames cross it cheaply
ANSWER_TIMEOUT_S = 20.0
SETTLE_S = 0.05  # after the expected answers: time for a duplicate or stray one to show up

FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example,
                                       HealthCheck.filter_too_much])

# no shrinking on the live server: each step costs connections, and a failing batch is short already
LIVE_PHASES = [Phase.explicit, Phase.generate]
IMAGE = "$IMAGE"  # replaced by an existing image's id when the frame is sent
CONTAINER = "fz"
COMMAND_TYPES = [f"{name}_request" for name in COMMANDS]


# ---- frames ----------------------------------------------------------------------------------

NOT_JSON: Any = type("NotJson", (), {"__repr__": lambda self: "NOT_JSON"})()


@dataclass(frozen=True)
class Frame:
    payload: bytes
    envelope: Any = NOT_JSON  # the JSON value the payload encodes; NOT_JSON when it is not JSON text
    binary: bool = False  # sent as a binary frame (else as text, which must be UTF-8)
    label: str = ""
    levels: int = 0  # its nesting, when deeper than the stdlib's parser reads

    def __repr__(self) -> str:
        head = self.payload[:160]
        more = f"…(+{len(self.payload) - 160} bytes)" if len(self.payload) > 160 else ""
        return f"Frame<{self.label}{' binary' if self.binary else ''}>({head!r}{more})"

    @property
    def utf8(self) -> bool:
        try:
            self.payload.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def bind(self, image_id: str) -> Frame:
        return dataclasses.replace(self, payload=self.payload.replace(IMAGE.encode(), image_id.encode()))

    def wire(self) -> str | bytes:
        return self.payload if self.binary or not self.utf8 else self.payload.decode("utf-8")


def encoded(env: Any, *, ascii_only: bool = True, label: str = "json") -> Frame:
    """`env` as JSON text; raw UTF-8 unless `ascii_only` or it holds a surrogate (then escaped). The
    envelope is what a parser reads back (escaped surrogates that make a pair are one character)."""
    text = json.dumps(env, ensure_ascii=ascii_only, allow_nan=False)
    try:
        payload = text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(env, allow_nan=False)
        payload = text.encode("utf-8")
    return Frame(payload, json.loads(text), label=label)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def raw(payload: str | bytes, *, binary: bool = False, label: str = "raw") -> Frame:
    """A hand-written frame (not nested deeper than the stdlib's parser can read); its envelope is
    what an RFC 8259 parser reads (the stdlib's, which keeps escaped lone surrogates), or NOT_JSON."""
    data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
    try:
        env = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        env = NOT_JSON
    return Frame(data, env, binary, label)


def valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def expected_answer(frame: Frame) -> tuple[str, str] | None:
    """(requestId, response type) of the one response the frame must get; None: it gets none."""
    env = frame.envelope
    if env is NOT_JSON or not isinstance(env, dict) or "__ack" in env:
        return None
    if frame.levels > PARSER_MAX_DEPTH and len(frame.payload) > DEEP_SCAN_MAX:
        return None  # too deep for the parser, and too large to be scanned instead (docs/protocol.md)
    type_, data = env.get("type"), env.get("data")
    if not isinstance(type_, str) or not type_.endswith("_request") or not valid_unicode(type_):
        return None
    if not isinstance(data, dict):
        return None
    rid = data.get("requestId")
    if not isinstance(rid, str) or not rid or not valid_unicode(rid):
        return None
    return rid, type_[: -len("_request")] + "_response"


TOO_DEEP = f"nests deeper than {PARSER_MAX_DEPTH} levels"
NOT_READ = f"read only up to {DEEP_SCAN_MAX} characters"


def expected_deep_error(frame: Frame) -> str | None:
    """What the one `system_error` a frame nested deeper than orjson reads gets must say (besides its
    response, when it has one): every such frame is answered, unless it is not an object."""
    if frame.levels <= PARSER_MAX_DEPTH or not frame.utf8:
        return None
    if len(frame.payload.decode("utf-8")) > DEEP_SCAN_MAX:
        return NOT_READ  # too large to be scanned: neither its grammar nor its requestId is known
    if not frame.payload.startswith(b"{"):
        return None  # JSON that is not an object is ignored, however deep
    return TOO_DEEP


# ---- strategies ------------------------------------------------------------------------------

wrong_types = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
               | st.lists(scalars, max_size=3) | st.dictionaries(st.text(max_size=5), scalars, max_size=3))
edge_text = st.sampled_from(["\ud800", "\udfff", "a\ud83d", "\ude00b", "\ud83d\ude00", "\ufeff", "\x00", "\u202e",
                             "\uffff", "\U0010ffff", "e\u0301", "\u2028", '"', "\\", "</script>", "%s%n", "😀" * 3])
# every code point (lone surrogates included: escaped on the wire) and the classic troublemakers
weird_text = st.text(st.characters(exclude_categories=()), max_size=12) | edge_text
ids = (st.sampled_from([IMAGE, CONTAINER, "img_nope", "agent_nope", "sess_nope", "", " ", "../etc", "a" * 129,
                        "c:1@x", "Traceback"]) | st.text(max_size=12) | weird_text)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` three times in four (st.one_of would weigh each of the many branches of `bad` alike)."""
    return st.integers(0, 3).flatmap(lambda i: good if i else bad)


request_ids = mostly(st.sampled_from(["r1", "r2", "dup"]) | st.text(min_size=1, max_size=8),
                     st.just("") | weird_text | wrong_types)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "file", "video"]) | wrong_types},
    optional={"text": st.text(max_size=20) | weird_text | wrong_types,
              "data": st.sampled_from(["aGk=", ""]) | wrong_types,
              "mediaType": st.sampled_from(["image/png", "application/pdf", "text/plain", ""]) | wrong_types,
              "filename": st.text(max_size=8) | wrong_types})
contents = (st.sampled_from(["hi", "", "   ", "fail"]) | st.text(max_size=40) | weird_text
            | st.lists(parts, max_size=3) | wrong_types)
# MCP servers are only ever given commands and URLs that go nowhere: a turn may try to start them
mcp_servers = wrong_types | st.dictionaries(st.text(max_size=4), wrong_types | st.fixed_dictionaries(
    {"type": st.sampled_from(["stdio", "http", "nope"])},
    optional={"command": st.just("/nonexistent/avm-fuzz"), "url": st.just("http://127.0.0.1:9/mcp"),
              "args": st.lists(st.text(max_size=4), max_size=2) | wrong_types}), max_size=2)
configs = wrong_types | st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=10) | weird_text | wrong_types,
    "description": st.text(max_size=10) | wrong_types,
    "systemPrompt": st.text(max_size=20) | weird_text | wrong_types,
    "model": st.sampled_from(["scripted", ""]) | wrong_types,
    "maxTokens": st.integers() | wrong_types,
    "tools": st.lists(st.sampled_from(["bash", "read_file", "nope", "resource://tools/x", ""]), max_size=3)
    | wrong_types,
    "mcpServers": mcp_servers,
    "agent": st.sampled_from(["resource://agents/nope", "nope", ""]) | wrong_types})
FIELDS = {"containerId": ids | wrong_types, "imageId": ids | wrong_types, "agentId": ids | wrong_types,
          "sessionId": ids | wrong_types, "content": contents, "config": configs,
          "updates": wrong_types | st.fixed_dictionaries({}, optional={"name": st.text(max_size=10) | wrong_types,
                                                                      "description": weird_text | wrong_types})}
envelope_extras = st.fixed_dictionaries({}, optional={
    "timestamp": st.integers() | wrong_types, "source": st.just("command") | wrong_types,
    "category": st.just("request") | wrong_types, "intent": st.just("request") | wrong_types,
    "context": wrong_types})

# every command of the protocol, with fuzzed (mostly plausible, often wrong) payloads
command_envs = st.builds(
    lambda type_, fields, rid, extra: {"type": type_, "data": {**fields, **rid}, **extra},
    st.sampled_from(COMMAND_TYPES), st.fixed_dictionaries({}, optional=FIELDS),
    mostly(st.fixed_dictionaries({"requestId": request_ids}), st.just({})), envelope_extras)
command_frames = st.builds(lambda env, ascii_only: encoded(env, ascii_only=ascii_only, label="command"),
                           command_envs, st.booleans())
# valid envelopes with fields of the wrong type (and types that are not commands)
odd_types = (st.sampled_from(COMMAND_TYPES) | wrong_types | weird_text
             | st.sampled_from(["subscribe", "auth", "_request", "nope_request", "image_get_response", "request"]))
wrong_envelopes = st.builds(
    lambda type_, data, extra: encoded({"type": type_, "data": data, **extra}, label="wrong-types"),
    odd_types, wrong_types | json_values | st.dictionaries(st.sampled_from(["requestId", *FIELDS]), wrong_types,
                                                           max_size=4), envelope_extras)
random_json = (json_values.map(lambda v: encoded(v, label="random"))
               | st.dictionaries(st.sampled_from(["type", "data", "__ack", "sessionId", "afterSeq", "headers"]),
                                 json_values, max_size=4).map(lambda v: encoded(v, label="random"))
               | request_frames.map(lambda v: encoded(v, label="test_router")))
subscribes = st.builds(lambda sid, after: encoded({"type": "subscribe", "sessionId": sid, **after}, label="subscribe"),
                       ids | wrong_types, st.fixed_dictionaries({}, optional={"afterSeq": st.integers() | wrong_types}))
edge_frames = st.sampled_from([
    "", " ", "{}", "[]", "null", "0", '"x"', "{", '{"type":', "\n\t", "{}{}",
    '{"type":"container_list_request"}', '{"type":"container_list_request","data":null}',
    '{"type":"container_list_request","data":{"requestId":"r1"}} trailing',
    '{"type":"container_list_request","data":{"requestId":"r1"},"type":"x"}',  # duplicate keys: the last wins
    '{"type":"x","data":{"requestId":"r1"},"type":"container_list_request"}',
    '{"type":"container_list_request","data":{"requestId":"r1","requestId":"r2"}}',
    '{"type":"container_list_request","data":{"requestId":"nan","n":NaN}}',  # not JSON
    '{"type":"container_list_request","data":{"requestId":"big","n":1e400}}',  # JSON; not a double
    '{"type":"container_list_request","data":{"requestId":"int","n":123456789012345678901234567890}}',
    '{"type":"container_list_request","data":{"requestId":"sur","x":"\\ud800"}}',
    '{"type":"container_list_request","data":{"requestId":"\\ud800"}}',  # the id itself cannot be echoed
    '{"type":"container_list\\udc00_request","data":{"requestId":"t"}}',
    '{"type":"container_list_request","data":{"requestId":"ctl","x":"a\tb"}}',  # raw control char: not JSON
    '\ufeff{"type":"container_list_request","data":{"requestId":"bom"}}',  # a BOM is not JSON text
    '{"__ack":"x","type":"container_list_request","data":{"requestId":"ack"}}',
    '{"type":"auth","headers":{"Authorization":"Bearer sk-nope"}}',
    '{"type":"subscribe","sessionId":"sess_nope","afterSeq":-1}',
]).map(lambda text: raw(text, label="edge"))


@st.composite
def huge_frames(draw: st.DrawFn, *, near: int) -> Frame:
    """A command whose one field is padded so that the frame has about `near` bytes (often exactly
    the limit, one less or one more)."""
    env = draw(command_envs)
    target = draw(st.sampled_from([near - 1, near, near + 1]) | st.integers(near // 2, near * 2))
    char = draw(st.sampled_from(["a", "é", "😀", "\u2028", "\\", '"', "\x00", "\ud800"]))
    ascii_only = draw(st.booleans())
    where = draw(st.sampled_from(["content", "requestId", "containerId", "type", "junk"]))

    def put(value: str) -> dict[str, Any]:
        if where == "type":
            return {**env, "type": value + "_request"}
        return {**env, "data": {**env["data"], where: value}}

    base = len(encoded(put(""), ascii_only=ascii_only).payload)
    unit = len(encoded(put(char), ascii_only=ascii_only).payload) - base
    count = max(0, target - base) // unit
    rest = max(0, target - base - count * unit)
    return encoded(put(char * count + "a" * rest), ascii_only=ascii_only, label=f"huge {where}")


DEEP = "\x01deep\x01"


@st.composite
def deep_frames(draw: st.DrawFn) -> Frame:
    """Nesting around orjson's limit of 1024 levels and far beyond it, in `data`, beside it or around
    the whole envelope; the requestId comes after the deep value."""
    depth = draw(st.sampled_from([1021, 1022, 1023, 1024, 1025]) | st.integers(1, 2500))
    opener, leaf, closer = draw(st.sampled_from([("[", "", "]"), ('{"a":', "1", "}"), ('[{"a":', "1", "}]")]))
    deep = opener * depth + leaf + closer * depth
    env = draw(command_envs)
    where = draw(st.sampled_from(["content", "config", "x", "top", "around"]))
    if where == "around":  # no envelope at the top: never a response
        levels = max(itertools.accumulate((c in "[{") - (c in "]}") for c in opener * depth)) + json_depth(env)
        return Frame((opener * depth + encoded(env).payload.decode() + closer * depth).encode(), label="deep around",
                     levels=levels)
    return nested(env, where, deep)


def json_depth(value: Any) -> int:
    """How many containers deep a (shallow) JSON value nests."""
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    return 0


def nested(env: dict[str, Any], where: str, deep: str) -> Frame:
    """`env` with the JSON text `deep` as the value of `where` in its `data` (before the requestId),
    or beside `data` (`top`). Its envelope is `env` read back with a placeholder for `deep` (which
    the stdlib's recursive parser could not read)."""
    if where == "top":
        env = {**env, "x": DEEP}
    else:
        data = {k: v for k, v in env["data"].items() if k != "requestId"}
        data[where] = DEEP
        if "requestId" in env["data"]:
            data["requestId"] = env["data"]["requestId"]
        env = {**env, "data": data}
    frame = encoded(env)
    levels = max(itertools.accumulate((c in "[{") - (c in "]}") for c in deep))
    return Frame(frame.payload.replace(json.dumps(DEEP).encode(), deep.encode()), frame.envelope,
                 label=f"deep {where}", levels=levels + (1 if where == "top" else 2))


@st.composite
def broken_utf8(draw: st.DrawFn, *, text_frames: bool) -> Frame:
    """Invalid UTF-8 (and a BOM) inside a command: never JSON text. As a text frame (live only) it is a
    WebSocket protocol error."""
    payload = encoded(draw(command_envs)).payload
    bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xf4\x90\x80\x80"]))
    at = draw(st.integers(0, len(payload)))
    binary = draw(st.booleans()) if text_frames else True
    if draw(st.booleans()):
        return Frame(b"\xef\xbb\xbf" + payload, NOT_JSON, binary, "bom")
    return Frame(payload[:at] + bad + payload[at:], NOT_JSON, binary, "invalid utf-8")


def binary_too(frames: st.SearchStrategy[Frame]) -> st.SearchStrategy[Frame]:
    """Some frames go as binary frames (JSON in a binary frame is accepted)."""
    return st.builds(lambda f, b: dataclasses.replace(f, binary=b or f.binary), frames,
                     st.sampled_from([False, False, False, True]))


def frames(*, huge_near: int, text_frames: bool) -> st.SearchStrategy[Frame]:
    return binary_too(st.one_of(command_frames, wrong_envelopes, random_json, subscribes, edge_frames,
                                huge_frames(near=huge_near), deep_frames(), broken_utf8(text_frames=text_frames)))


def batches(one: st.SearchStrategy[Frame], *, min_size: int = 1, max_size: int) -> st.SearchStrategy[list[Frame]]:
    """Frames sent together (handled concurrently), and the same request several times in flight."""
    return (st.lists(one, min_size=min_size, max_size=max_size)
            | st.builds(lambda f, n, rest: [f] * n + rest, command_frames, st.integers(2, 4),
                        st.lists(one, max_size=3)))


# ---- checks ----------------------------------------------------------------------------------

_EXCEPTIONS = sorted(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))
LEAKS = ["Traceback", 'File "', ".py", "site-packages", str(REPO), "agentvm.", "pydantic", "orjson", "sqlite",
         "starlette", "ValidationError", "JSONDecodeError", "AgentVMError", "InvalidRequest", *_EXCEPTIONS]


def error_texts(ev: Event) -> list[str]:
    data = ev.get("data")
    if not isinstance(data, dict) or not (ev.get("category") == "response" or "error" in str(ev.get("type"))):
        return []
    return [v for k in ("error", "message") if isinstance(v := data.get(k), str)]


def check_answers(sent: list[Frame], events: list[Event]) -> None:
    expected = Counter(a for f in sent if (a := expected_answer(f)) is not None)
    got = Counter((e["data"].get("requestId"), e["type"]) for e in events if e.get("category") == "response")
    assert got == expected, f"answers {dict(got)} != expected {dict(expected)} for {sent}"
    deep = Counter(d for f in sent if (d := expected_deep_error(f)) is not None)
    deep_got = Counter(NOT_READ if NOT_READ in m else TOO_DEEP for e in events if e.get("type") == "system_error"
                       and TOO_DEEP in (m := str((e.get("data") or {}).get("message"))))
    assert deep_got == deep, f"deep-frame errors {dict(deep_got)} != expected {dict(deep)} for {sent}"
    for e in events:
        if NOT_READ in str((e.get("data") or {}).get("message")):
            assert "requestId" not in e["data"], e
    wire = b"\n".join(f.payload for f in sent).decode("utf-8", "replace")
    for ev in events:
        data = ev.get("data") or {}
        for key in ("errorCode", "code"):
            assert data.get(key) != "internal_error", (ev, sent)
        for text in error_texts(ev):
            leaked = [leak for leak in LEAKS if leak in text and leak not in wire]
            assert not leaked, (leaked, text, sent)


# ---- (a) the router in-process ---------------------------------------------------------------

@dataclass
class Rig:
    """`avm serve`'s runtime, started in a loop of its own that every example reuses (state builds up
    across examples); frames go straight to its CommandRouter."""

    loop: asyncio.AbstractEventLoop
    rt: Runtime
    principal: Principal = field(default_factory=lambda: Principal(DEFAULT_TENANT))
    image_id: str = ""
    ids: Iterator[int] = field(default_factory=itertools.count)

    async def ensure_image(self) -> str:
        """An image for `$IMAGE` (a fuzzed image_delete_request may have deleted the last one)."""
        images = self.rt.services.images
        if not self.image_id or await images.get(self.principal, self.image_id) is None:
            self.image_id = (await images.create(self.principal, CONTAINER, ImageConfig())).image_id
        return self.image_id

    async def exchange(self, batch: list[Frame]) -> list[Event]:
        image_id = await self.ensure_image()
        conn = Connection(f"conn_fuzz_{next(self.ids)}", self.principal.tenant_id, max_queue=1_000_000, wrap=False)
        self.rt.hub.register(conn)
        try:  # concurrently, as the endpoint runs them (spec §2.1): duplicates are in flight together
            await asyncio.gather(*(self.rt.router.handle_frame(self.principal, conn.id, f.bind(image_id).wire())
                                   for f in batch))
            return [json.loads(frame) for frame in conn.queue]
        finally:
            self.rt.hub.unregister(conn)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    rt = build_runtime(Settings(data_dir=tmp_path / "d", auth="open"), driver=ScriptedDriver())
    stack = contextlib.AsyncExitStack()
    loop.run_until_complete(stack.enter_async_context(rt.app.router.lifespan_context(rt.app)))
    try:
        yield Rig(loop, rt)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


ALWAYS = [  # every run sends these besides the generated batches: what the fuzzing found, among others
    raw('{"type":"message_send_request","data":{"imageId":"$IMAGE","content":"cut \\ud83d","requestId":"s1"}}'),
    nested({"type": "image_get_request", "data": {"requestId": "d1"}}, "imageId", "[" * 2000 + "]" * 2000),
    nested({"type": "image_get_request", "data": {}}, "imageId", "[" * 2000 + "]" * 2000),  # no requestId
    nested({"type": "image_get_request", "data": {"requestId": "d2"}}, "imageId", "[" * 9000 + "]" * 9000),
    raw('{"type":"image_get_request","data":{"imageId":"$IMAGE","requestId":"dup"}}'),
    raw('{"type":"image_get_request","data":{"imageId":"$IMAGE","requestId":"dup"}}'),
    raw('{"type":"container_list_request","data":{"requestId":"e1","n":1e400}}'),
    raw('{"type":"container_list_request","data":{"requestId":"e2","n":-' + "9" * 400 + "}}"),
    Frame(b'{"type":"container_list_request","data":{"requestId":"u1","x":"\xff"}}', label="invalid utf-8"),
    Frame(b'{"type":"container_list_request","data":{"requestId":"u2","x":"\xc0\xaf"}}', binary=True,
          label="invalid utf-8"),
    encoded({"type": "message_send_request", "data": {"requestId": "h1", "imageId": IMAGE,
                                                      "content": "x" * LIVE_LIMIT}}, label="huge"),
]


@settings(FUZZ, max_examples=ROUTER_EXAMPLES)
@example(batch=ALWAYS)
@given(batch=batches(frames(huge_near=200_000, text_frames=False), max_size=8))
def test_router_answers_every_request_exactly_once(rig: Rig, batch: list[Frame]) -> None:
    events = rig.loop.run_until_complete(rig.exchange(batch))
    check_answers([f.bind(rig.image_id) for f in batch], events)  # as sent: the id changes lengths


def test_the_strategies_reach_every_kind_of_frame() -> None:
    """The generators do produce what the oracle distinguishes (a guard against a strategy that
    silently stopped generating, e.g. after a refactoring)."""
    labels: Counter[str] = Counter()
    answered = 0

    @settings(FUZZ, max_examples=400)
    @given(frames(huge_near=LIVE_LIMIT, text_frames=True))
    def sample(frame: Frame) -> None:
        nonlocal answered
        labels[frame.label.split()[0]] += 1
        answered += expected_answer(frame) is not None

    sample()
    assert {"command", "wrong-types", "random", "test_router", "subscribe", "edge", "huge", "deep",
            "invalid", "bom"} <= set(labels), labels
    assert 40 <= answered <= 360, answered


@settings(FUZZ, max_examples=ROUTER_EXAMPLES * 2)
@given(frame=st.one_of(command_frames, wrong_envelopes, random_json, edge_frames), cut=st.integers(0, 20),
       garbage=st.text(max_size=5))
def test_the_deep_frame_scanner_reads_what_a_json_parser_reads(frame: Frame, cut: int, garbage: str) -> None:
    """The iterative scanner of frames too deep for any recursive parser (agentvm/protocol/refused.py)
    against the stdlib's parser: the same verdict on every text (a cut or a tail makes most invalid)."""
    text = frame.payload.decode("utf-8", "surrogatepass")
    for variant in (text, text[: len(text) - cut], text + garbage):
        try:
            body = json.loads(variant, parse_constant=_no_constants)
        except ValueError:
            assert _scan(variant) is None, variant
            continue
        want = None
        if isinstance(body, dict) and "__ack" not in body:
            type_, data = body.get("type"), body.get("data")
            rid = data.get("requestId") if isinstance(data, dict) else None
            want = (type_ if isinstance(type_, str) else None, rid if isinstance(rid, str) else None)
        assert _scan(variant) == want, variant


# ---- (b) a live server over real WebSockets --------------------------------------------------

@dataclass
class Live:
    loop: asyncio.AbstractEventLoop
    srv: InProcess
    well_behaved: StockClient
    image_id: str
    made: list[str] = field(default_factory=list)

    async def behave(self, rounds: int) -> None:
        """The well-behaved connection's requests, interleaved with the fuzzing: each gets its right answer."""
        b = self.well_behaved
        for _ in range(rounds):
            cid = f"wellbehaved-{len(self.made)}"
            res = await b.request("container_create_request", {"containerId": cid})
            assert res["type"] == "container_create_response" and res["data"]["containerId"] == cid, res
            assert "error" not in res["data"], res
            self.made.append(cid)
            res = await b.request("container_get_request", {"containerId": cid})
            assert res["data"]["exists"] is True and res["data"]["containerId"] == cid, res
            res = await b.request("container_list_request")
            assert set(self.made) <= set(res["data"]["containerIds"]), res

    def check_well_behaved(self) -> None:
        """It got its answers, the notifications of its own containers, and nothing else."""
        for ev in self.well_behaved.events:
            if ev.get("category") == "response":
                assert str(ev["data"].get("requestId", "")).startswith("req_"), ev
            else:
                assert ev["type"] == "container_created" and ev["data"]["containerId"] in self.made, ev

    async def exchange(self, batch: list[Frame]) -> None:
        images, p = self.srv.runtime.services.images, Principal(DEFAULT_TENANT)
        if await images.get(p, self.image_id) is None:  # a fuzzed image_delete_request got it
            self.image_id = (await images.create(p, CONTAINER, ImageConfig())).image_id
        bound = [f.bind(self.image_id) for f in batch]
        fits = [f for f in bound if len(f.payload) <= LIVE_LIMIT and (f.binary or f.utf8)]
        refused = [f for f in bound if f not in fits]
        behaving = asyncio.get_running_loop().create_task(self.behave(2))
        try:
            async with StockClient(self.srv.url) as a:
                for f in fits:
                    await a.send_raw(f.wire())
                want = sum(expected_answer(f) is not None for f in fits)
                deep = sum(expected_deep_error(f) is not None for f in fits)

                def answered(_: Event) -> bool:
                    return (sum(e.get("category") == "response" for e in a.events) >= want
                            and sum(TOO_DEEP in str((e.get("data") or {}).get("message")) for e in a.events) >= deep)

                if want or deep:
                    await a.wait_for(answered, ANSWER_TIMEOUT_S)
                await asyncio.sleep(SETTLE_S)
                check_answers(fits, a.events)
                assert not a.closed.is_set(), "the fuzzed connection was closed"
                res = await a.request("container_get_request", {"containerId": CONTAINER})  # still answering
                assert "error" not in res["data"], res
            for f in refused:
                await self.refused(f)
        finally:
            await behaving
        self.check_well_behaved()

    async def refused(self, frame: Frame) -> None:
        """A frame over the limit (1009) or a text frame that is not UTF-8 (1007) closes its connection
        with a reason; the others go on."""
        async with connect(self.srv.url, max_size=None) as ws:
            await ws.send(frame.payload, text=not frame.binary)
            with pytest.raises(ConnectionClosed) as info:
                while True:  # nothing is answered before the close
                    got = await asyncio.wait_for(ws.recv(), 10)
                    raise AssertionError(f"{frame}: got {got!r} before the close")
        close = info.value.rcvd
        assert close is not None, frame
        if len(frame.payload) > LIVE_LIMIT:
            assert close.code == 1009, (close, frame)
            assert str(LIVE_LIMIT) in close.reason and "exceed" in close.reason, close
        else:  # uvicorn closes without a reason (avm serve logs it as one INFO line: logs.ClientFaultFilter)
            assert close.code == 1007, (close, frame)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()

    async def start() -> Live:
        srv = await stack.enter_async_context(in_process(tmp_path / "d", driver=ScriptedDriver(), auth="open",
                                                         max_frame_bytes=LIVE_LIMIT))
        b = await stack.enter_async_context(StockClient(srv.url))
        return Live(loop, srv, b, "")

    try:
        yield loop.run_until_complete(start())
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()




@settings(FUZZ, max_examples=LIVE_EXAMPLES, phases=LIVE_PHASES)
@example(batch=ALWAYS)
@given(batch=batches(frames(huge_near=LIVE_LIMIT, text_frames=True), min_size=2, max_size=8))
def test_live_server_answers_every_request_and_isolates_connections(live: Live, batch: list[Frame]) -> None:
    live.loop.run_until_complete(live.exchange(batch))
