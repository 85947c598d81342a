"""AWS calls per pure-chat turn in the cloud tier, counted from botocore events.

    .venv/bin/python -m tests.bench.aws_calls [--quick] [--json FILE]

The real handlers run behind the emulated API Gateway edge (tests/support/cloud_edge.py: the
WebSocket routes, the Lambda Invoke API for `chat_turn`, warm environments) against DynamoDB and
the management API on an in-process moto server; a `StockClient` talks to the edge. The turn is a
500-token reply of 100 text deltas over 10 s (scripted driver, 100 ms apart), sent as the second
message of a conversation (the first one also registers the agent). Counted from the message frame
until `chat_turn` returns, for each `stream.flushMs`:

* `post_to_connection` calls, and the 32 KB units API Gateway bills them as;
* DynamoDB write requests and write units (per item: ceil(size / 1 KB), sizes computed from the
  request items, or from `ALL_NEW` attributes for UpdateItem; deletes count 1; plus the index
  writes of each put, see `index_units`), read requests and read units (ceil(size / 4 KB) of the
  returned items, minimum 1; half for an eventually consistent read);
* Lambda invocations per function and inbound frames.

`--quick` (the version inside `make test`) scales time by 1/10: 10 ms between deltas and every
window ÷ 10, which keeps the frame counts on an idle machine. Exits 1 if at flushMs=250 a turn
makes more than 6 DynamoDB write requests for the turn itself, more than 1 for metering (the turn's
one LLM call: its usage record and the month's spend counter in one transaction; counted apart, and
in the totals), or (full run only: frame counts depend on timing) more than 25
`post_to_connection` calls: the cloud issue's targets, and the billing issue's.
Feed the JSON to `python -m tests.bench.cost_model --counts FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLUSH_MS = (0, 100, 250, 500)
MAX_FLUSH_MS = 2000  # template.yaml: AVM_STREAM_MAX_FLUSH_MS
DELTAS = 100
DELTA_GAP_MS = 100
TARGET_FLUSH_MS = 250
MAX_POSTS = 25
MAX_WRITE_REQUESTS = 6
MAX_METERING_REQUESTS = 1  # one per LLM call; a pure-chat turn makes one
_METERING_PREFIXES = ("USAGE#", "SPEND#", "RATE#", "BUDGET#")

_DDB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_DDB_READS = frozenset({"GetItem", "Query", "BatchGetItem", "Scan"})


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
    key is unchanged, which writes no index; its GSI4 key is removed, which deletes one entry).
    Any other item with index keys is counted as new in each index it names."""
    sk = item.get("SK", {}).get("S", "")
    if sk.startswith("TURN#"):
        return 2 if "SPK" in item and item.get("status", {}).get("S") == "queued" else 1
    return sum(1 for k in _INDEX_KEYS if k in item)


def read_units(items: list[Mapping[str, Any]]) -> int:
    return max(1, math.ceil(sum(item_size(i) for i in items) / 4096))


@dataclass
class Counts:
    posts: int = 0
    post_units: int = 0
    write_requests: int = 0
    metering_requests: int = 0  # of write_requests: the usage ledger's (usage/models.py, services/metering.py)
    write_units: int = 0
    read_requests: int = 0
    read_units: float = 0.0
    other: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def as_json(self, invocations: Mapping[str, int], inbound: int) -> dict[str, Any]:
        return {"post_to_connection": self.posts, "post_units_32kb": self.post_units,
                "ddb_write_requests": self.write_requests, "ddb_metering_requests": self.metering_requests,
                "ddb_write_units": self.write_units,
                "ddb_read_requests": self.read_requests, "ddb_read_units": round(self.read_units, 1),
                "lambda_invocations": dict(invocations), "inbound_frames": inbound,
                "other_calls": dict(self.other)}


def _metering(params: Mapping[str, Any]) -> bool:
    """Does a write request touch the usage ledger's items (by their partition keys)?"""
    keys = [params.get("Key"), params.get("Item")]
    keys += [t.get(op, {}).get("Key") or t.get(op, {}).get("Item") for t in params.get("TransactItems", [])
             for op in ("Put", "Update", "ConditionCheck", "Delete")]
    return any(str((k or {}).get("PK", {}).get("S", "")).startswith(_METERING_PREFIXES) for k in keys)


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
                c.post_units += max(1, math.ceil(len(params["Data"]) / (32 * 1024)))
            elif service == "dynamodb" and op in _DDB_WRITES:
                c.write_requests += 1
                if _metering(params):
                    c.metering_requests += 1
                if op == "PutItem":
                    c.write_units += write_units(params["Item"]) + index_units(params["Item"])
                elif op == "BatchWriteItem":
                    for requests in params["RequestItems"].values():
                        for r in requests:
                            item = r["PutRequest"]["Item"] if "PutRequest" in r else None
                            c.write_units += 1 if item is None else write_units(item) + index_units(item)
                elif op == "DeleteItem":
                    c.write_units += 1
                elif op == "TransactWriteItems":  # 2 units per item per KB, plus the puts' index writes
                    for t in params["TransactItems"]:
                        item = t.get("Put", {}).get("Item")
                        c.write_units += 2 * write_units(item) + index_units(item) if item else 2
                # UpdateItem: counted after the call, from the item it left
            elif service == "dynamodb" and op in _DDB_READS:
                c.read_requests += 1
            elif service != "dynamodb":
                c.other[f"{service}.{op}"] += 1

    def _after(self, parsed: Mapping[str, Any], model: Any, context: dict[str, Any] | None = None,
               **_: Any) -> None:
        if not self.enabled or model.service_model.service_name != "dynamodb":
            return
        c, op = self.counts, model.name
        # eventually consistent reads cost half a unit per 4 KB
        factor = 1.0 if context is None or context.get("avm_consistent") else 0.5
        with c.lock:
            if op == "UpdateItem":
                c.write_units += write_units(parsed.get("Attributes") or {"PK": {"S": "x"}})
            elif op == "GetItem":
                c.read_units += factor * read_units([parsed["Item"]] if "Item" in parsed else [])
            elif op in ("Query", "Scan"):
                c.read_units += factor * read_units(list(parsed.get("Items", [])))
            elif op == "BatchGetItem":
                c.read_units += factor * sum(read_units([i]) for items in parsed.get("Responses", {}).values()
                                             for i in items)


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


def _script(path: Path, gap_ms: float) -> None:
    chunk = "lorem ipsum dolor s "  # 20 characters: 100 chunks ≈ 2,000 characters ≈ 500 tokens
    path.write_text(json.dumps({"rules": [
        {"match": "long", "responses": [{"text": [chunk] * DELTAS, "delay_ms": gap_ms,
                                         "usage": {"input_tokens": 500, "output_tokens": 500}}]}]}))


async def measure(flush_ms: int, *, scale: float, endpoint: str, counter: CallCounter,
                  script: Path) -> dict[str, Any]:
    """One conversation through the emulated API Gateway edge: a first turn (it also registers the
    agent), then the counted one."""
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    from agentvm.auth.api_keys import new_key
    from tests.support.cloud_edge import cloud_edge
    from tests.support.stock_client import StockClient

    table = f"bench-{uuid.uuid4().hex[:12]}"
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name="us-east-1")
    await store.open()
    await store.create_table()
    key, token = new_key("bench")
    await DynamoDBKeys(store).put_key(key)
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), "AVM_STREAM_FLUSH_MS": str(round(flush_ms * scale)),
           "AVM_STREAM_MAX_FLUSH_MS": str(round(MAX_FLUSH_MS * scale))}
    try:
        async with cloud_edge(moto_endpoint=endpoint, token=token, table_name=table) as edge:
            with _environment(**edge.handler_env(), **env):
                async with StockClient(edge.url, ack=False) as client:
                    image = await client.new_image("bench", name="bench")
                    await client.turn(image["imageId"], "hello")
                    await edge.settle(include_invokes=True)
                    calls_before = len(edge.invocations)
                    counter.reset()
                    counter.enabled = True
                    started = time.monotonic()
                    await client.turn(image["imageId"], "a long answer please", timeout=120)
                    await edge.settle(include_invokes=True, timeout=60)
                    elapsed = time.monotonic() - started
                    counter.enabled = False
                    invoked = Counter(label for label, _ in edge.invocations[calls_before:])
        counts = counter.reset()
        turns = await store.list_turns("bench", image["sessionId"])
        assert [t.status for t in turns] == ["completed", "completed"], turns
    finally:
        await store.close()
    out = counts.as_json(dict(sorted(invoked.items())), inbound=invoked.get("ws_default", 0))
    out["turn_seconds"] = round(elapsed, 2)
    return out


def run(quick: bool) -> dict[str, Any]:
    from moto.server import ThreadedMotoServer

    from agentvm.adapters.aws.botocore_async import default_session
    from tests.aws_fixtures import exact_moto_numbers

    scale = 0.1 if quick else 1.0
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access line per moto request
    exact_moto_numbers()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    counter = CallCounter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, _environment(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
            AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true"):
        script = Path(tmp) / "script.json"
        _script(script, DELTA_GAP_MS * scale)
        counter.install(default_session())
        try:
            for flush in FLUSH_MS:
                results[str(flush)] = asyncio.run(measure(flush, scale=scale, endpoint=f"http://{host}:{port}",
                                                          counter=counter, script=script))
        finally:
            server.stop()
    return {"mode": "quick" if quick else "full", "deltas": DELTAS, "delta_gap_ms": DELTA_GAP_MS * scale,
            "time_scale": scale, "flush_ms": results}


def report(data: Mapping[str, Any]) -> tuple[str, bool]:
    rows = [("flushMs", "posts", "32KB units", "DDB write req", "DDB WCU", "DDB read req", "DDB RCU", "turn s")]
    for flush, m in data["flush_ms"].items():
        rows.append((flush, str(m["post_to_connection"]), str(m["post_units_32kb"]), str(m["ddb_write_requests"]),
                     str(m["ddb_write_units"]), str(m["ddb_read_requests"]), str(m["ddb_read_units"]),
                     str(m["turn_seconds"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    target = data["flush_ms"][str(TARGET_FLUSH_MS)]
    metering = target["ddb_metering_requests"]
    writes_ok = target["ddb_write_requests"] - metering <= MAX_WRITE_REQUESTS and metering <= MAX_METERING_REQUESTS
    # Frame counts depend on timing (the coalescing windows): judged in the full run only, as the
    # quick run's time scale on a loaded machine says nothing about them. Write counts do not.
    ok = writes_ok and (data["mode"] == "quick" or target["post_to_connection"] <= MAX_POSTS)
    verdict = (f"flushMs={TARGET_FLUSH_MS}: {target['post_to_connection']} posts (target ≤ {MAX_POSTS}), "
               f"{target['ddb_write_requests'] - metering} DynamoDB write requests for the turn (target ≤ "
               f"{MAX_WRITE_REQUESTS}) + {metering} for metering (target ≤ {MAX_METERING_REQUESTS}): "
               + ("PASS" if ok else "FAIL"))
    return "\n".join([*lines, verdict]), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="time scaled by 1/10 (make test)")
    parser.add_argument("--json", type=Path, help="write the counts here (input of tests.bench.cost_model)")
    args = parser.parse_args(argv)
    data = run(args.quick)
    text, ok = report(data)
    print(f"AWS calls per pure-chat turn ({DELTAS} deltas, {data['delta_gap_ms']} ms apart)\n{text}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
