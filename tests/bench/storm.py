"""Disconnect storm: followers drop and reconnect with `afterSeq` at random points while turns run;
every follower must end with every event of its sessions exactly once, in seq order, with no gap.

    .venv/bin/python -m tests.bench.storm [--quick] [--turns N] [--json FILE]

A real `avm serve` (scripted driver, each reply word streamed 2 ms apart so that turns overlap the
reconnects) and, in this process: one driver connection per session sending the turns (a session
runs one turn at a time, sessions run concurrently) and `clients` followers, each subscribed to
`follows` sessions. A follower reads a random number of frames (1 to `max_frames`; one time in ten
none: it drops right after `subscribe`, while the replay is being read), then drops the connection
(half the time with a close frame, half by aborting the TCP connection) and reconnects at once
with `afterSeq` = the last seq it received of each session. It records every session event it
receives, never deduplicating. At the end the server is stopped and the event log is read from its
SQLite database: each follower's events of a session must equal that log (same seqs, same
payloads, same order), and the log itself must have no gap. The random choices are seeded
(`--seed`); timing is not.

The small version runs in `make test` (tests/reliability/test_disconnect_storm.py), the full one
(500 turns) in `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop
from websockets.asyncio.client import connect

from tests.bench.load import RawConn, request_frame
from tests.support.servers import ServeProcess, start_serve, stop_serve

# Every reply word 2 ms apart: a turn streams for ~20-30 ms, so drops land mid-turn.
STORM_SCRIPT = "echo_delay_ms: 2\n"


@dataclass(frozen=True)
class StormSizes:
    turns: int  # in total, spread round-robin over the sessions
    sessions: int
    clients: int  # followers
    follows: int  # sessions per follower
    max_frames: int  # a follower drops after 1..max_frames frames (or 0, one time in ten)
    seed: int = 1
    timeout_s: float = 300.0


FULL = StormSizes(turns=500, sessions=10, clients=40, follows=2, max_frames=40)
QUICK = StormSizes(turns=40, sessions=4, clients=8, follows=2, max_frames=30, timeout_s=60.0)


@dataclass
class Follower:
    index: int
    sessions: list[str]
    rng: random.Random
    last: dict[str, int] = field(default_factory=dict)  # session → last seq received
    got: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # session → (seq, payload) as received
    connections: int = 0
    aborted: int = 0  # drops without a close frame
    dropped_at_subscribe: int = 0  # drops right after subscribe (0 frames read)

    @property
    def reconnects(self) -> int:
        return max(0, self.connections - 1)


@dataclass
class StormResult:
    turns: int
    sessions: int
    clients: int
    reconnects: int
    aborted: int
    dropped_at_subscribe: int
    events_in_log: int  # sum over sessions of the log's length
    events_expected: int  # sum over followers of the logs of the sessions they follow
    events_delivered: int  # session events the followers received, duplicates included
    duplicates: int
    gaps: int  # events of the log a follower never received
    out_of_order: int  # events received after one with a higher seq
    mismatched: int  # events whose payload differs from the log's
    log_gaps: int  # seqs missing inside the stored log itself
    wall_s: float
    seed: int
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    problems: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.gaps or self.out_of_order or self.mismatched or self.log_gaps) and \
            self.events_delivered == self.events_expected

    def summary(self) -> str:
        return (f"disconnect storm: {self.turns} turns on {self.sessions} sessions, {self.clients} followers"
                f"\n  reconnects {self.reconnects} ({self.aborted} aborted without a close frame, "
                f"{self.dropped_at_subscribe} right after subscribe)"
                f"\n  events delivered {self.events_delivered} of {self.events_expected} expected "
                f"({self.events_in_log} in the sessions' logs)"
                f"\n  duplicates {self.duplicates}, gaps {self.gaps}, out of order {self.out_of_order}, "
                f"payload mismatches {self.mismatched}, gaps in the log {self.log_gaps}"
                f"\n  {self.wall_s:.1f} s (CPU: server {self.server_cpu_s:.1f} s, this client "
                f"{self.client_cpu_s:.1f} s), seed {self.seed}: {'PASS' if self.ok else 'FAIL'}")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def subscribe_frame(session_id: str, after_seq: int) -> str:
    return orjson.dumps({"type": "subscribe", "sessionId": session_id, "afterSeq": after_seq}).decode()


async def setup_sessions(url: str, n: int) -> tuple[list[RawConn], list[str], list[str]]:
    """One driver connection per session: its image's id and session id."""
    conns, images, sessions = [], [], []
    for i in range(n):
        conn = await RawConn.open(url)
        conns.append(conn)
        res = await conn.request("container_create_request", {"containerId": f"storm-{i:03d}"})
        if res["data"].get("error"):
            raise RuntimeError(f"container_create failed: {res['data']}")
        res = await conn.request("image_create_request", {"containerId": f"storm-{i:03d}", "config": {}})
        record = res["data"].get("record")
        if not record:
            raise RuntimeError(f"image_create failed: {res['data']}")
        images.append(str(record["imageId"]))
        sessions.append(str(record["sessionId"]))
    return conns, images, sessions


async def drive(conn: RawConn, image: str, turns: list[int], final: dict[str, int], session: str) -> None:
    """Run this session's turns one after another; record the seq of the last turn_response."""
    last = 0
    for t in turns:
        request_id = conn.next_rid()
        await conn.ws.send(request_frame("message_send_request",
                                         {"imageId": image, "content": f"storm turn {t} of the run, several words"},
                                         request_id))
        for _ in range(10_000):
            _raw, ev = await conn.recv()
            seq = ev.get("seq")
            if isinstance(seq, int):
                last = max(last, seq)
            if ev.get("type") == "system_error" or (ev.get("category") == "response" and ev["data"].get("error")):
                raise RuntimeError(f"turn {t} failed: {ev}")
            if ev.get("type") == "turn_response":
                if ev["data"].get("status") != "completed":
                    raise RuntimeError(f"turn {t} did not complete: {ev['data']}")
                break
        else:
            raise RuntimeError(f"turn {t} did not end")
    final[session] = last


async def follow(f: Follower, url: str, sizes: StormSizes, final: dict[str, int], done: asyncio.Event) -> None:
    """Read, drop, reconnect with afterSeq, until every followed session reached its final seq."""

    def complete() -> bool:
        return done.is_set() and all(f.last[s] >= final[s] for s in f.sessions)

    while not complete():
        # Unbounded client-side buffering: a clean close must not wait for frames nobody reads.
        conn = RawConn(await connect(url, max_size=None, max_queue=None, compression=None, ping_interval=None,
                                     open_timeout=10, close_timeout=2))
        f.connections += 1
        budget = 0 if f.rng.random() < 0.1 else f.rng.randint(1, sizes.max_frames)
        abort = f.rng.random() < 0.5
        try:
            for s in f.sessions:
                await conn.ws.send(subscribe_frame(s, f.last[s]))
            if budget == 0:
                f.dropped_at_subscribe += 1
            read = 0
            while read < budget and not complete():
                try:  # the wait alone is bounded: a frame once received is always processed
                    raw = await asyncio.wait_for(conn.ws.recv(decode=False), 0.25)
                except TimeoutError:
                    continue
                ev = await conn.ack(raw)
                read += 1
                if ev.get("type") == "system_error":
                    raise RuntimeError(f"follower {f.index}: {ev['data']}")
                seq = ev.get("seq")
                sid = (ev.get("context") or {}).get("sessionId")
                if isinstance(seq, int) and sid in f.got:
                    f.got[sid].append((seq, orjson.dumps(ev).decode()))
                    f.last[sid] = max(f.last[sid], seq)
        finally:
            if abort:
                f.aborted += 1
                conn.ws.transport.abort()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.ws.wait_closed(), 2)
            else:
                with contextlib.suppress(Exception):
                    await conn.close()


async def storm(url: str, sizes: StormSizes) -> tuple[list[Follower], list[str], int]:
    """Run the storm against a server; returns the followers, the session ids and the turns run."""
    drivers, images, sessions = await setup_sessions(url, sizes.sessions)
    master = random.Random(sizes.seed)
    followers = []
    for i in range(sizes.clients):
        picked = [sessions[(i + k) % len(sessions)] for k in range(min(sizes.follows, len(sessions)))]
        followers.append(Follower(i, picked, random.Random(master.getrandbits(64)),
                                  last=dict.fromkeys(picked, 0), got={s: [] for s in picked}))
    final: dict[str, int] = {}
    done = asyncio.Event()
    tasks = [asyncio.create_task(follow(f, url, sizes, final, done)) for f in followers]
    await asyncio.sleep(0.05)  # the followers' first subscriptions are in
    try:
        per_session: list[list[int]] = [[] for _ in sessions]
        for t in range(sizes.turns):
            per_session[t % len(sessions)].append(t)
        await asyncio.gather(*(drive(c, img, ts, final, s)
                               for c, img, ts, s in zip(drivers, images, per_session, sessions, strict=True)))
        done.set()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in drivers:
            with contextlib.suppress(Exception):
                await c.close()
    return followers, sessions, sizes.turns


def read_log(db: Path, sessions: list[str]) -> dict[str, list[tuple[int, str]]]:
    """The stored event log of each session: (seq, payload) in seq order."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return {s: [(int(seq), str(payload)) for seq, payload in
                    c.execute("SELECT seq, payload FROM events WHERE session_id=? ORDER BY seq", (s,))]
                for s in sessions}


def check(followers: list[Follower], log: dict[str, list[tuple[int, str]]], turns: int, sizes: StormSizes,
          wall_s: float) -> StormResult:
    problems: list[str] = []
    duplicates = gaps = out_of_order = mismatched = log_gaps = delivered = expected = 0
    for s, events in log.items():
        seqs = [seq for seq, _ in events]
        missing = (seqs[-1] - seqs[0] + 1 - len(seqs)) if seqs else 0
        log_gaps += missing
        if missing:
            problems.append(f"the log of {s} has {missing} missing seqs")
    for f in followers:
        for s in f.sessions:
            want = log[s]
            got = f.got[s]
            expected += len(want)
            delivered += len(got)
            by_seq = dict(want)
            seen: set[int] = set()
            high = 0
            for seq, payload in got:
                if seq in seen:
                    duplicates += 1
                    if len(problems) < 10:
                        problems.append(f"follower {f.index} got seq {seq} of {s} twice")
                seen.add(seq)
                if seq < high:
                    out_of_order += 1
                high = max(high, seq)
                stored = by_seq.get(seq)
                if stored is None or orjson.loads(stored) != orjson.loads(payload):
                    mismatched += 1
            lost = [seq for seq, _ in want if seq not in seen]
            gaps += len(lost)
            if lost and len(problems) < 10:
                problems.append(f"follower {f.index} never got seqs {lost[:10]} of {s}")
    return StormResult(
        turns=turns, sessions=len(log), clients=len(followers), reconnects=sum(f.reconnects for f in followers),
        aborted=sum(f.aborted for f in followers), dropped_at_subscribe=sum(f.dropped_at_subscribe for f in followers),
        events_in_log=sum(len(v) for v in log.values()), events_expected=expected, events_delivered=delivered,
        duplicates=duplicates, gaps=gaps, out_of_order=out_of_order, mismatched=mismatched, log_gaps=log_gaps,
        wall_s=wall_s, seed=sizes.seed, problems=problems)


@contextlib.contextmanager
def storm_server(workdir: Path) -> Iterator[ServeProcess]:
    script = workdir / "storm.yaml"
    script.write_text(STORM_SCRIPT)
    (workdir / "storm").mkdir()
    sp = start_serve(workdir / "storm" / "data", "--log-level", "WARNING", "--script", str(script))
    try:
        yield sp
    finally:
        stop_serve(sp)


async def run_storm(sizes: StormSizes, workdir: Path) -> StormResult:
    """Start a server, run the storm, stop the server (its last checkpoint written), check."""
    with storm_server(workdir) as sp:
        t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_seconds(sp.proc.pid)
        async with asyncio.timeout(sizes.timeout_s):
            followers, sessions, turns = await storm(sp.url, sizes)
        wall, client, server = time.perf_counter() - t0, time.process_time() - c0, cpu_seconds(sp.proc.pid) - s0
        stop_serve(sp)
        log = read_log(sp.log_path.parent / "data" / "agentvm.db", sessions)
    result = check(followers, log, turns, sizes, wall)
    result.server_cpu_s, result.client_cpu_s = round(server, 2), round(client, 2)
    return result


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.storm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small version (40 turns)")
    parser.add_argument("--turns", type=int, help="turns in total (default 500, quick 40)")
    parser.add_argument("--clients", type=int, help="followers (default 40, quick 8)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the result to this file")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = StormSizes(**{**asdict(sizes), "seed": args.seed,
                          **({"turns": args.turns} if args.turns else {}),
                          **({"clients": args.clients} if args.clients else {})})
    with tempfile.TemporaryDirectory(prefix="avm-storm-") as tmp:
        result = uvloop.run(run_storm(sizes, Path(tmp)))
    print(result.summary())
    for p in result.problems:
        print(f"  {p}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
