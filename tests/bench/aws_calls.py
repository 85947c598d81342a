"""AWS calls per pure-chat turn in the cloud tier, counted from botocore events.

    .venv/bin/python -m tests.bench.aws_calls [--quick] [--json FILE]

The real handlers (`functions/ws_default`, `functions/chat_turn`) run against DynamoDB and the API
Gateway management API on an in-process moto server; `ws_default`'s async invoke of `chat_turn`
reaches a small local Lambda Invoke endpoint that runs the handler in a new thread (a new
execution environment). The turn is a 500-token reply of 100 text deltas over 10 s (scripted
driver, 100 ms apart), sent as the second message of a conversation (the first one also registers
the agent). Counted from the message frame until `chat_turn` returns, for each `stream.flushMs`:

* `post_to_connection` calls, and the 32 KB units API Gateway bills them as;
* DynamoDB write requests and write units (per item: ceil(size / 1 KB), sizes computed from the
  request items, or from `ALL_NEW` attributes for UpdateItem; deletes count 1; plus the index
  writes of each put, see `index_units`), read requests and read units (ceil(size / 4 KB) of the
  returned items, minimum 1; half for an eventually consistent read);
* Lambda invocations per function and inbound frames.

`--quick` (the version inside `make test`) scales time by 1/10: 10 ms between deltas and every
window ÷ 10, which keeps the frame counts on an idle machine. Exits 1 if at flushMs=250 a turn
makes more than 6 DynamoDB write requests or (full run only: frame counts depend on timing) more
than 25 `post_to_connection` calls: the cloud issue's targets.
Feed the JSON to `python -m tests.bench.cost_model --counts FILE`.
"""

from __future__ import annotations

import argparse
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.cloud_edge import load_handler

FLUSH_MS = (0, 100, 250, 500)
MAX_FLUSH_MS = 1000  # template.yaml: AVM_STREAM_MAX_FLUSH_MS
DELTAS = 100
DELTA_GAP_MS = 100
TARGET_FLUSH_MS = 250
MAX_POSTS = 25
MAX_WRITE_REQUESTS = 6

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
    write_units: int = 0
    read_requests: int = 0
    read_units: float = 0.0
    other: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def as_json(self, invocations: Mapping[str, int], inbound: int) -> dict[str, Any]:
        return {"post_to_connection": self.posts, "post_units_32kb": self.post_units,
                "ddb_write_requests": self.write_requests, "ddb_write_units": self.write_units,
                "ddb_read_requests": self.read_requests, "ddb_read_units": round(self.read_units, 1),
                "lambda_invocations": dict(invocations), "inbound_frames": inbound,
                "other_calls": dict(self.other)}


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
                if op == "PutItem":
                    c.write_units += write_units(params["Item"]) + index_units(params["Item"])
                elif op == "BatchWriteItem":
                    for requests in params["RequestItems"].values():
                        for r in requests:
                            item = r["PutRequest"]["Item"] if "PutRequest" in r else None
                            c.write_units += 1 if item is None else write_units(item) + index_units(item)
                elif op == "DeleteItem":
                    c.write_units += 1
                elif op == "TransactWriteItems":
                    c.write_units += 2 * sum(write_units(t.get("Put", {}).get("Item", {})) for t in
                                             params["TransactItems"])
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


class _Invokes:
    """The Lambda Invoke API (InvocationType=Event) for `chat_turn`: 202 at once, the handler runs in a
    new thread, i.e. a new execution environment."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        invokes = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                thread = threading.Thread(target=invokes._run, args=(payload,), daemon=True)
                invokes.threads.append(thread)
                thread.start()
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _run(self, payload: dict[str, Any]) -> None:
        try:
            self.handler(payload, None)
        except BaseException as exc:
            self.errors.append(exc)

    def wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while any(t.is_alive() for t in self.threads):
            if time.monotonic() > deadline:
                raise TimeoutError("chat_turn did not finish")
            time.sleep(0.01)
        if self.errors:
            raise RuntimeError("chat_turn failed") from self.errors[0]


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


def measure(flush_ms: int, *, scale: float, endpoint: str, counter: CallCounter, script: Path) -> dict[str, Any]:
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.auth.api_keys import new_key
    from agentvm.cloud import runtime as cloud_runtime

    chat_turn = load_handler("chat_turn")
    invokes = _Invokes(chat_turn.handler)
    env = {"AVM_TABLE_NAME": f"bench-{uuid.uuid4().hex[:12]}", "AVM_AWS_ENDPOINT_URL": endpoint,
           "AVM_WS_ENDPOINT": endpoint, "AVM_LAMBDA_ENDPOINT_URL": invokes.url,
           "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), "AVM_STREAM_FLUSH_MS": str(round(flush_ms * scale)),
           "AVM_STREAM_MAX_FLUSH_MS": str(round(MAX_FLUSH_MS * scale))}
    with _environment(**env):
        cloud_runtime.reset()
        rt = cloud_runtime.runtime()
        cloud_runtime.run(rt.ready())
        cloud_runtime.run(rt.store.create_table())
        key, token = new_key("bench")
        cloud_runtime.run(DynamoDBKeys(rt.store).put_key(key))
        connect, default = load_handler("ws_connect"), load_handler("ws_default")
        conn = f"{uuid.uuid4().hex[:14]}Q="
        ctx = {"connectionId": conn, "stage": "prod", "domainName": "bench.execute-api.us-east-1.amazonaws.com",
               "apiId": "bench"}
        assert connect.handler({"requestContext": {**ctx, "routeKey": "$connect", "eventType": "CONNECT"},
                                "queryStringParameters": {"token": token}}, None)["statusCode"] == 200

        def frame(type_: str, data: dict[str, Any]) -> None:
            body = json.dumps({"type": type_, "data": {**data, "requestId": uuid.uuid4().hex}})
            default.handler({"requestContext": {**ctx, "routeKey": "$default", "eventType": "MESSAGE"},
                             "body": body, "isBase64Encoded": False}, None)

        frame("container_create_request", {"containerId": "bench"})
        frame("image_create_request", {"containerId": "bench", "config": {"name": "bench"}})
        images = cloud_runtime.run(rt.store.list_images("bench", "bench"))
        frame("message_send_request", {"imageId": images[0].image_id, "content": "hello"})  # registers the agent
        invokes.wait()
        counter.reset()
        counter.enabled = True
        started = time.monotonic()
        frame("message_send_request", {"imageId": images[0].image_id, "content": "a long answer please"})
        invokes.wait()
        elapsed = time.monotonic() - started
        counter.enabled = False
        counts = counter.reset()
        turns = cloud_runtime.run(rt.store.list_turns("bench", images[0].session_id))
        assert [t.status for t in turns] == ["completed", "completed"], turns
        cloud_runtime.run(rt.store.close())
        cloud_runtime.reset()
    invokes.server.shutdown()
    out = counts.as_json({"ws_default": 1, "chat_turn": 1}, inbound=1)
    out["turn_seconds"] = round(elapsed, 2)
    return out


def run(quick: bool) -> dict[str, Any]:
    from moto.server import ThreadedMotoServer

    from agentvm.adapters.aws.botocore_async import default_session

    scale = 0.1 if quick else 1.0
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access line per moto request
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
                results[str(flush)] = measure(flush, scale=scale, endpoint=f"http://{host}:{port}",
                                              counter=counter, script=script)
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
    writes_ok = target["ddb_write_requests"] <= MAX_WRITE_REQUESTS
    # Frame counts depend on timing (the coalescing windows): judged in the full run only, as the
    # quick run's time scale on a loaded machine says nothing about them. Write counts do not.
    ok = writes_ok and (data["mode"] == "quick" or target["post_to_connection"] <= MAX_POSTS)
    verdict = (f"flushMs={TARGET_FLUSH_MS}: {target['post_to_connection']} posts (target ≤ {MAX_POSTS}), "
               f"{target['ddb_write_requests']} DynamoDB write requests (target ≤ {MAX_WRITE_REQUESTS}): "
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
