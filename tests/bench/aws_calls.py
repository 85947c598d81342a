"""AWS calls per pure-chat turn in the cloud tier, counted from botocore events.

    .venv/bin/python -m tests.bench.aws_calls [--quick] [--detail] [--json FILE]

The real handlers run behind the emulated API Gateway edge (tests/support/cloud_edge.py: the
WebSocket routes, the Lambda Invoke API for `chat_turn`, warm environments) against DynamoDB and
the management API on an in-process moto server; a `StockClient` talks to the edge. One
conversation of `TURNS` turns runs on a priced model (`MODEL`, the scripted driver reporting that
name, so every call is billed at its list price) for a tenant with a monthly budget, so each LLM call
pays its budget hold and its usage record and spend counter as in production. The turns counted are
turns 1, 20 and 100 of the conversation (`LENGTHS`): each streams a 500-token reply of 100 text
deltas over 10 s (100 ms apart); every other turn is a short reply with no delay. A counted turn is
counted from the message frame until `chat_turn` returns, at `stream.flushMs` = `FLUSH_MS`:

* `post_to_connection` calls, and the 32 KB units API Gateway bills them as;
* DynamoDB write requests and write units (per item: ceil(size / 1 KB), sizes computed from the
  request items, or from `ALL_NEW`/`ALL_OLD` attributes for UpdateItem (the larger of the item
  before and after); deletes count 1; plus the index writes of each put, see `index_units`;
  TransactWriteItems twice), of them the metering requests (budget hold, usage record, spend
  counter: 3 requests, 4 units with a tenant budget), read requests and read units (ceil(size /
  4 KB) of the returned items, minimum 1; half for an eventually consistent read);
* Lambda invocations per function and inbound frames.

`--detail` prints every DynamoDB request of each counted turn: the function that made it, the
operation, the items it touched (partition key prefix / sort key prefix) and its units.
`--quick` (the version inside `make test`) scales time by 1/10 (10 ms between deltas, every window
÷ 10). Exits 1 if a counted turn at any length makes more than `MAX_WRITE_UNITS` write units, or the
read units of turn 100 exceed those of turn 1 by more than `MAX_READ_GROWTH`: reads must not grow with
the conversation (the issue-17 targets). Then `chat_turn` runs two long turns again in a process of its
own, as Lambda runs it, with the real SDK-free driver: its peak RSS, CPU time and the memory size
recommended ("chat_turn" in the JSON; tests/bench/chat_turn_rss.py).
Feed the JSON to `python -m tests.bench.cost_model --counts FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import math
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

LENGTHS = (1, 20, 100)
FLUSH_MS = 250
MAX_FLUSH_MS = 2000  # template.yaml: AVM_STREAM_MAX_FLUSH_MS
DELTAS = 100
DELTA_GAP_MS = 100
MODEL = "claude-haiku-4-5"  # priced (agentvm/money.py): the scripted driver reports it as the model that answered
MONTHLY_BUDGET = Decimal("1000")
#: what a message must contain for the script (`_script`) to answer with the long reply, or a short one
LONG, SHORT = "LONGREPLY", "SHORTREPLY"
MAX_WRITE_UNITS = 8
MAX_READ_GROWTH = 1.0
_METERING_PREFIXES = ("USAGE#", "SPEND#", "RATE#", "BUDGET#")

_DDB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DDB_READS = frozenset({"GetItem", "Query", "BatchGetItem", "Scan"})

#: the Lambda function whose invocation makes an AWS call (set by the bench's handler wrapper)
FUNCTION: contextvars.ContextVar[str] = contextvars.ContextVar("avm_bench_function", default="bench")


# ---- DynamoDB item sizes (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html)


def _value_size(v: Mapping[str, Any]) -> int:
    (kind, value), = v.items()
    if kind == "S":
        return len(str(value).encode())
    if kind == "N":
        digits = len(str(value).lstrip("-").replace(".", "").lstrip("0")) or 1
        return math.ceil(digits / 2) + 1
    if kind == "B":
        return len(value)
    if kind in ("SS", "NS", "BS"):
        return sum(_value_size({kind[0]: x}) for x in value)
    if kind == "M":
        return 3 + sum(len(k.encode()) + _value_size(x) for k, x in value.items())
    if kind == "L":
        return 3 + sum(1 + _value_size(x) for x in value)
    return 1  # BOOL, NULL


def item_size(item: Mapping[str, Any]) -> int:
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def write_units(item: Mapping[str, Any]) -> int:
    return max(1, math.ceil(item_size(item) / 1024))


_INDEX_KEYS = ("G1PK", "G2PK", "G3PK", "SPK")


def index_units(item: Mapping[str, Any]) -> int:
    """Write units the table's indexes add for a put of `item` (KEYS_ONLY or small projections: 1 each).

    A turn is put when queued (new in GSI3 and in the sparse GSI4) and again when it ends (its GSI3
    key is unchanged, which writes no index; its GSI4 key is removed, which deletes one entry; a
    finished turn enters the tenant's turn log, GSI1: one more). Any other item with index keys is
    counted as new in each index it names."""
    sk = item.get("SK", {}).get("S", "")
    if sk.startswith("TURN#"):
        if "SPK" in item and item.get("status", {}).get("S") == "queued":
            return 2
        return 1 + ("G1PK" in item)
    return sum(1 for k in _INDEX_KEYS if k in item)


def read_units(items: list[Mapping[str, Any]]) -> int:
    return max(1, math.ceil(sum(item_size(i) for i in items) / 4096))


def _kind(key: Mapping[str, Any] | None) -> str:
    """`PK prefix/SK prefix` of an item key, e.g. `SESS/MSG`."""
    if not key:
        return "?"
    pk = str(key.get("PK", {}).get("S", "?")).split("#", 1)[0]
    sk = str(key.get("SK", {}).get("S", "?")).split("#", 1)[0]
    return f"{pk}/{'<month>' if sk[:2] in ('19', '20') else sk}"


@dataclass
class Request:
    """One DynamoDB request, for `--detail`."""

    function: str
    op: str
    items: str
    wcu: float = 0
    rcu: float = 0
    returns: str = ""
    unsized: Any = None  # an UpdateItem's table and key: sized after the turn unless it returned the item


    def line(self) -> str:
        units = f"{self.wcu:g} WCU" if self.op in _DDB_WRITES else f"{self.rcu:g} RCU"
        return f"{self.function:<11} {self.op:<18} {units:>8}  {self.items}"


@dataclass
class Counts:
    posts: int = 0
    post_units: int = 0
    bytes_out: int = 0
    write_requests: int = 0
    metering_requests: int = 0  # of write_requests: the usage ledger's (services/metering.py)
    write_units: int = 0
    read_requests: int = 0
    read_units: float = 0.0
    sqs: int = 0
    s3_put: int = 0
    s3_get: int = 0
    other: Counter[str] = field(default_factory=Counter)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def as_json(self, invocations: Mapping[str, int], inbound: int) -> dict[str, Any]:
        return {"post_to_connection": self.posts, "post_units_32kb": self.post_units, "inbound_frames": inbound,
                "frames_per_client": {"stock": self.posts},
                "ddb_write_requests": self.write_requests, "ddb_write_units": self.write_units,
                "ddb_metering_requests": self.metering_requests,
                "ddb_read_requests": self.read_requests, "ddb_read_units": round(self.read_units, 1),
                "lambda_invocations": dict(invocations), "sqs_requests": self.sqs,
                "s3_put_requests": self.s3_put, "s3_get_requests": self.s3_get, "bytes_out": self.bytes_out,
                "other_calls": dict(self.other),
                "requests": [r.line() for r in self.requests]}


def _metering(params: Mapping[str, Any]) -> bool:
    """Does a write request touch the usage ledger's items (by their partition keys)?"""
    return any(str((k or {}).get("PK", {}).get("S", "")).startswith(_METERING_PREFIXES) for k in _keys(params))


def _keys(params: Mapping[str, Any]) -> list[Mapping[str, Any] | None]:
    keys = [params.get("Key"), params.get("Item")]
    keys += [t.get(op, {}).get("Key") or t.get(op, {}).get("Item") for t in params.get("TransactItems", [])
             for op in ("Put", "Update", "ConditionCheck", "Delete")]
    for requests in params.get("RequestItems", {}).values():
        if isinstance(requests, list):
            keys += [r.get("PutRequest", {}).get("Item") or r.get("DeleteRequest", {}).get("Key") for r in requests]
        else:
            keys += list(requests.get("Keys", []))
    return [k for k in keys if k]


def _describe(op: str, params: Mapping[str, Any]) -> str:
    if op in ("Query", "Scan"):
        values = params.get("ExpressionAttributeValues", {})
        pk = next((str(v.get("S", "")).split("#", 1)[0] for k, v in values.items() if k in (":pk", ":p")), "?")
        sk = next((str(v.get("S", "")).split("#", 1)[0] for k, v in values.items()
                   if k in (":msg", ":lo", ":sk", ":prefix")), "")
        index = params.get("IndexName")
        return f"{pk}/{sk or '*'}" + (f" on {index}" if index else "") + (
            " (consistent)" if params.get("ConsistentRead") else "")
    kinds = Counter(_kind(k) for k in _keys(params))
    text = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))
    if op in ("GetItem", "BatchGetItem") and params.get("ConsistentRead"):
        text += " (consistent)"
    return text


class CallCounter:
    """Counts AWS calls from botocore events on the session every adapter client comes from."""

    def __init__(self) -> None:
        self.counts = Counts()
        self.enabled = False

    def install(self, session: Any) -> None:
        session.register("before-parameter-build", self._before)
        session.register("after-call", self._after)

    def reset(self) -> Counts:
        out, self.counts = self.counts, Counts()
        return out

    def _before(self, params: Mapping[str, Any], model: Any, context: dict[str, Any] | None = None,
                **_: Any) -> None:
        if not self.enabled:
            return
        service, op = model.service_model.service_name, model.name
        if context is not None and op == "BatchGetItem":
            context["avm_consistent"] = all(t.get("ConsistentRead", False) for t in params["RequestItems"].values())
        elif context is not None:
            context["avm_consistent"] = bool(params.get("ConsistentRead", False))
        c = self.counts
        with c.lock:
            if service == "apigatewaymanagementapi" and op == "PostToConnection":
                c.posts += 1
                c.bytes_out += len(params["Data"])
                c.post_units += max(1, math.ceil(len(params["Data"]) / (32 * 1024)))
            elif service == "dynamodb" and op in _DDB_WRITES | _DDB_READS:
                request = Request(FUNCTION.get(), op, _describe(op, params))
                if op == "UpdateItem":
                    request.returns = str(params.get("ReturnValues", "NONE"))
                    request.unsized = (params["TableName"], params["Key"])
                c.requests.append(request)
                if context is not None:
                    context["avm_request"] = request
                if op in _DDB_READS:
                    c.read_requests += 1
                    return
                c.write_requests += 1
                if _metering(params):
                    c.metering_requests += 1
                units = 0
                if op == "PutItem":
                    units = write_units(params["Item"]) + index_units(params["Item"])
                elif op == "BatchWriteItem":
                    for requests in params["RequestItems"].values():
                        for r in requests:
                            item = r["PutRequest"]["Item"] if "PutRequest" in r else None
                            units += 1 if item is None else write_units(item) + index_units(item)
                elif op == "DeleteItem":
                    units = 1
                elif op == "TransactWriteItems":  # 2 units per item per KB, plus the puts' index writes
                    for t in params["TransactItems"]:
                        item = t.get("Put", {}).get("Item")
                        units += 2 * write_units(item) + index_units(item) if item else 2
                # UpdateItem: counted after the call, from the item it left
                request.wcu = units
                c.write_units += units
            elif service == "sqs":
                c.sqs += 1
            elif service == "s3" and op in ("PutObject", "UploadPart", "CopyObject"):
                c.s3_put += 1
            elif service == "s3" and op in ("GetObject", "HeadObject"):
                c.s3_get += 1
            elif service != "dynamodb":
                c.other[f"{service}.{op}"] += 1

    def _after(self, parsed: Mapping[str, Any], model: Any, context: dict[str, Any] | None = None,
               **_: Any) -> None:
        if not self.enabled or model.service_model.service_name != "dynamodb":
            return
        c, op = self.counts, model.name
        request = (context or {}).get("avm_request")
        # eventually consistent reads cost half a unit per 4 KB
        factor = 1.0 if context is None or context.get("avm_consistent") else 0.5
        units = 0.0
        if op == "UpdateItem":
            # ceil(the size of the item / 1 KB): ALL_NEW or ALL_OLD is what the bench sees; an
            # UpdateItem that returns neither is sized after the turn (`size_updates`)
            if request is not None and request.returns not in ("ALL_NEW", "ALL_OLD"):
                return
            units = write_units(parsed.get("Attributes") or {"PK": {"S": "x"}})
        elif op == "GetItem":
            units = factor * read_units([parsed["Item"]] if "Item" in parsed else [])
        elif op in ("Query", "Scan"):
            units = factor * read_units(list(parsed.get("Items", [])))
        elif op == "BatchGetItem":
            units = factor * sum(read_units([i]) for items in parsed.get("Responses", {}).values() for i in items)
        else:
            return
        with c.lock:
            if op == "UpdateItem":
                c.write_units += int(units)
                if request is not None:
                    request.wcu = units
            else:
                c.read_units += units
                if request is not None:
                    request.rcu = units


async def size_updates(counts: Counts, client: Any) -> None:
    """Price the UpdateItems that returned no item at the size of their item after the turn."""
    for request in counts.requests:
        if request.op != "UpdateItem" or request.returns in ("ALL_NEW", "ALL_OLD") or request.unsized is None:
            continue
        table, key = request.unsized
        item = (await client.get_item(TableName=table, Key=key, ConsistentRead=True)).get("Item")
        request.wcu = write_units(item or key)
        counts.write_units += int(request.wcu)


class _LabelledPool(ThreadPoolExecutor):
    """The AWS call pool, running each call in the context of the task that made it, so that the
    counter sees which Lambda function (`FUNCTION`) made it."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def _label_functions() -> None:
    """Wrap each handler the edge loads so that its calls carry the function's name."""
    from agentvm.adapters.aws import botocore_async
    from tests.support import cloud_edge

    if isinstance(botocore_async._POOL, _LabelledPool):
        return
    botocore_async._POOL = _LabelledPool(max_workers=16, thread_name_prefix="aws")
    load = cloud_edge._load

    def labelled(path: Path) -> Any:
        module = load(path)
        handler, label = module.handler, cloud_edge.function_label(path)

        def run(event: Any, context: Any) -> Any:
            token = FUNCTION.set(label)
            try:
                return handler(event, context)
            finally:
                FUNCTION.reset(token)

        module.handler = run  # type: ignore[attr-defined]
        return module

    cloud_edge._load = labelled


# ---- the emulated cloud ------------------------------------------------------------------------


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Words of ordinary English prose: a reply drawn from them compresses about as well as a real one
#: (zlib ~2.5x), where a repeated chunk would compress ~40x and understate every stored byte.
_PROSE = ("the of and to in is that for it as with was on be by this are or from at which an but not have "
          "has had can will would should could model answer question data value function server request "
          "response client session message system user time first second number result example because "
          "however therefore between within without during before after while where when each other more "
          "most some such only also than then them these those into over under about through ")
_WORDS = tuple(_PROSE.split())


def reply_chunks(n: int = DELTAS, seed: int = 17) -> list[str]:
    """`n` deltas of ~20 characters of prose-like text (deterministic): ≈ 2,000 characters ≈ 500 tokens."""
    rng = random.Random(seed)
    chunks = []
    for _ in range(n):
        chunk = ""
        while len(chunk) < 20:
            chunk += rng.choice(_WORDS) + rng.choice((" ", " ", " ", " ", ", ", ". "))
        chunks.append(chunk)
    return chunks


def _script(path: Path, gap_ms: float) -> None:
    path.write_text(json.dumps({"rules": [
        {"match": LONG, "responses": [{"text": reply_chunks(), "delay_ms": gap_ms, "model": MODEL,
                                              "usage": {"input_tokens": 500, "output_tokens": 500}}]},
        {"match": SHORT, "responses": [{"text": ["Sure."], "model": MODEL,
                                               "usage": {"input_tokens": 50, "output_tokens": 5}}]}]}))


async def measure(*, scale: float, endpoint: str, counter: CallCounter, script: Path,
                  lengths: tuple[int, ...] = LENGTHS) -> dict[str, Any]:
    """One conversation through the emulated API Gateway edge; the turns numbered in `lengths` are
    counted (long replies), the others are short and not counted."""
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
    from agentvm.auth.api_keys import new_key
    from agentvm.domain.usage import Budget
    from tests.support.cloud_edge import cloud_edge
    from tests.support.stock_client import StockClient

    table = f"bench-{uuid.uuid4().hex[:12]}"
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name="us-east-1")
    await store.open()
    await store.create_table()
    key, token = new_key("bench")
    await DynamoDBKeys(store).put_key(key)
    await DynamoDBUsageLedger(store).put_budget(Budget("bench", monthly=MONTHLY_BUDGET))
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), "AVM_STREAM_FLUSH_MS": str(round(FLUSH_MS * scale)),
           "AVM_STREAM_MAX_FLUSH_MS": str(round(MAX_FLUSH_MS * scale))}
    out: dict[str, Any] = {}
    try:
        async with cloud_edge(moto_endpoint=endpoint, token=token, table_name=table) as edge:
            with _environment(**edge.handler_env(), **env):
                async with StockClient(edge.url, ack=False) as client:
                    image = await client.new_image("bench", name="bench", model=MODEL)
                    for n in range(1, max(lengths) + 1):
                        if n not in lengths:
                            await client.turn(image["imageId"], f"{SHORT} {n}", timeout=60)
                            await edge.settle(include_invokes=True, timeout=60)
                            continue
                        calls_before = len(edge.invocations)
                        counter.reset()
                        counter.enabled = True
                        started = time.monotonic()
                        await client.turn(image["imageId"], f"{LONG} {n}: a long answer please", timeout=120)
                        await edge.settle(include_invokes=True, timeout=60)
                        elapsed = time.monotonic() - started
                        counter.enabled = False
                        invoked = Counter(label for label, _ in edge.invocations[calls_before:])
                        counts = counter.reset()
                        await size_updates(counts, store.client)
                        m = counts.as_json(dict(sorted(invoked.items())), inbound=invoked.get("ws_default", 0))
                        m["turn_seconds"] = round(elapsed, 2)
                        out[str(n)] = m
                # the same long reply to a client that asks for batched frames (docs/protocol.md): only its
                # frames are counted; they do not depend on the conversation's length
                async with StockClient(edge.url, ack=False, batch=True) as batched:
                    other = await batched.new_image("bench", name="bench-batched", model=MODEL)
                    await batched.turn(other["imageId"], f"{SHORT} 1", timeout=60)
                    await edge.settle(include_invokes=True, timeout=60)
                    counter.reset()
                    counter.enabled = True
                    await batched.turn(other["imageId"], f"{LONG}: a long answer please", timeout=120)
                    await edge.settle(include_invokes=True, timeout=60)
                    counter.enabled = False
                    batched_posts = counter.reset().posts
        for m in out.values():
            m["frames_per_client"]["batched"] = batched_posts
        turns = await store.list_turns("bench", image["sessionId"])
        assert len(turns) == max(lengths) and all(t.status == "completed" for t in turns), turns[-3:]
    finally:
        await store.close()
    return out


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server in this process (the edge reads posted frames from its backend); yields its URL."""
    from moto.server import ThreadedMotoServer

    from tests.aws_fixtures import exact_moto_numbers

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access line per moto request
    exact_moto_numbers()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with _environment(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true"):
            yield f"http://{host}:{port}"
    finally:
        server.stop()


async def measure_chat_turn(endpoint: str, scale: float) -> dict[str, Any]:
    """chat_turn's peak RSS and CPU time on a long reply, in a process of its own (chat_turn_rss.py)."""
    from tests.bench import chat_turn_rss

    return await chat_turn_rss.measure(endpoint=endpoint, scale=scale, deltas=DELTAS, gap_ms=DELTA_GAP_MS * scale,
                                       model=MODEL, flush_ms=FLUSH_MS, max_flush_ms=MAX_FLUSH_MS,
                                       chunks=reply_chunks(), budget=MONTHLY_BUDGET)


def run(quick: bool, lengths: tuple[int, ...] = LENGTHS) -> dict[str, Any]:
    from agentvm.adapters.aws.botocore_async import default_session

    scale = 0.1 if quick else 1.0
    _label_functions()
    counter = CallCounter()
    with tempfile.TemporaryDirectory() as tmp, moto_server() as endpoint:
        script = Path(tmp) / "script.json"
        _script(script, DELTA_GAP_MS * scale)
        counter.install(default_session())
        lam = asyncio.run(measure(scale=scale, endpoint=endpoint, counter=counter, script=script, lengths=lengths))
        chat_turn = asyncio.run(measure_chat_turn(endpoint, scale))
    return {"mode": "quick" if quick else "full", "deltas": DELTAS, "delta_gap_ms": DELTA_GAP_MS * scale,
            "time_scale": scale, "flush_ms": FLUSH_MS, "model": MODEL, "tiers": {"lambda": lam},
            "chat_turn": chat_turn}


def check(data: Mapping[str, Any]) -> list[str]:
    """What fails the issue-17 limits (an empty list: everything passes)."""
    failures = []
    for tier, by_length in data["tiers"].items():
        for length, m in by_length.items():
            if m["ddb_write_units"] > MAX_WRITE_UNITS:
                failures.append(f"{tier} turn {length}: {m['ddb_write_units']} write units (limit {MAX_WRITE_UNITS})")
        lengths = sorted(by_length, key=int)
        first, last = by_length[lengths[0]], by_length[lengths[-1]]
        if len(lengths) > 1 and last["ddb_read_units"] > first["ddb_read_units"] + MAX_READ_GROWTH:
            failures.append(f"{tier}: {last['ddb_read_units']} read units at turn {lengths[-1]} against "
                            f"{first['ddb_read_units']} at turn {lengths[0]} (limit + {MAX_READ_GROWTH:g})")
    return failures


def report(data: Mapping[str, Any], *, detail: bool = False) -> tuple[str, bool]:
    rows = [("tier", "turn", "posts", "32KB units", "DDB write req", "of them metering", "DDB WCU", "DDB read req",
             "DDB RCU", "turn s")]
    for tier, by_length in data["tiers"].items():
        for length, m in by_length.items():
            rows.append((tier, length, str(m["post_to_connection"]), str(m["post_units_32kb"]),
                         str(m["ddb_write_requests"]), str(m["ddb_metering_requests"]), str(m["ddb_write_units"]),
                         str(m["ddb_read_requests"]), str(m["ddb_read_units"]), str(m["turn_seconds"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if detail:
        for tier, by_length in data["tiers"].items():
            for length, m in by_length.items():
                lines += ["", f"{tier}, turn {length}: every DynamoDB request", *(f"  {r}" for r in m["requests"])]
    failures = check(data)
    verdict = (f"limits: ≤ {MAX_WRITE_UNITS} write units per turn, read units flat (turn 100 ≤ turn 1 + "
               f"{MAX_READ_GROWTH:g}): " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    return "\n".join([*lines, verdict]), not failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="time scaled by 1/10 (make test)")
    parser.add_argument("--detail", action="store_true", help="print every DynamoDB request of the counted turns")
    parser.add_argument("--json", type=Path, help="write the counts here (input of tests.bench.cost_model)")
    args = parser.parse_args(argv)
    data = run(args.quick)
    text, ok = report(data, detail=args.detail)
    from tests.bench.chat_turn_rss import report as chat_turn_report

    print(f"AWS calls per pure-chat turn ({DELTAS} deltas, {data['delta_gap_ms']} ms apart, model {MODEL})\n{text}")
    print(chat_turn_report(data["chat_turn"]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
