"""Observability over HTTP (docs/observability.md): the caller's metrics (`/v1/metrics`) and turn logs
(`/v1/logs`), and the operator's Prometheus scrape (`/metrics`, every tenant aggregated, no ids).

The logs are read from the store's turn log (`Store.list_tenant_turns`), so they are the same in
every deployment; the metrics are this process's (`TurnMetrics`)."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from agentvm.domain.cursors import next_turn_cursor
from agentvm.domain.models import TERMINAL_TURN_STATUSES, Principal, Turn, TurnStatus
from agentvm.errors import InvalidRequest
from agentvm.ids import MAX_EPOCH_MS
from agentvm.ports import Store
from agentvm.services.metrics import TenantMetrics, TurnMetrics, parse_window, turn_log_metrics

JSON = dict[str, Any]

# A filtered page reads at most this many turns of the log; fewer entries than `limit` with a
# `nextCursor` then means: keep paging.
LOG_SCAN_MAX = 1000
_LOG_PAGE = 200

Level = Literal["info", "warning", "error"]
_LEVEL_OF = {TurnStatus.COMPLETED: "info", TurnStatus.INTERRUPTED: "warning", TurnStatus.FAILED: "error"}
_RANK = {"info": 0, "warning": 1, "error": 2}


def metrics_wire(m: TenantMetrics) -> JSON:
    c = m.counts
    return {"tenantId": m.tenant_id, "window": "all" if m.window_minutes is None else f"{m.window_minutes}m",
            "since": m.since_ms, "until": m.until_ms,
            "turns": {"total": c.turns, "completed": c.completed, "failed": c.failed, "interrupted": c.interrupted},
            "successRate": m.success_rate, "errorRate": m.error_rate,
            "tokens": {"input": c.input_tokens, "output": c.output_tokens, "cacheRead": c.cache_read_tokens,
                       "cacheWrite": c.cache_write_tokens},
            "latencyMs": {name: {"p50": lat.p50, "p95": lat.p95, "samples": lat.samples}
                          for name, lat in (("firstToken", m.first_token), ("turn", m.turn))},
            "active": {"containers": m.active_containers, "connections": m.active_connections}}


def log_level(turn: Turn) -> str:
    return _LEVEL_OF.get(turn.status, "info")


def log_entry(turn: Turn) -> JSON:
    """A turn as a log entry: what `turn_wire` says of it, with a level and a message."""
    from agentvm.api.sessions_http import turn_wire  # the session routes' module: loaded by /v1/logs only

    w = turn_wire(turn)
    done = turn.status == TurnStatus.COMPLETED
    message = "turn completed" if done else turn.error_message or f"turn {turn.status}"
    return {"time": turn.ended_at or turn.started_at or turn.created_at, "level": log_level(turn),
            "turnId": w["turnId"], "sessionId": w["sessionId"], "containerId": w["containerId"],
            "imageId": w["imageId"], "status": w["status"], "errorCode": turn.error_code, "message": message,
            "model": w["model"], "tier": w["tier"], "durationMs": w["durationMs"],
            "firstTokenMs": w["firstTokenMs"], "tokens": w["usage"],
            "createdAt": w["createdAt"]}


def parse_time(value: str | None, name: str) -> int | None:
    """Epoch ms, from epoch ms or an ISO 8601 time (UTC when it names no offset)."""
    if value is None or value == "":
        return None
    text = value.strip()
    if text.isdigit():
        if int(text) > MAX_EPOCH_MS:
            raise InvalidRequest(f"{name}: epoch milliseconds up to {MAX_EPOCH_MS} (the end of 9999)", field=name)
        return int(text)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(f"{name}: epoch milliseconds or an ISO 8601 time", field=name) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0, int(at.timestamp() * 1000))


async def read_logs(store: Store, tenant_id: str, *, since_ms: int | None, until_ms: int | None, level: str,
                    container_id: str | None, turn_id: str | None, limit: int,
                    cursor: str | None) -> tuple[list[Turn], str | None]:
    """The tenant's finished turns that pass the filters, newest first, and the next page's cursor."""
    min_rank = _RANK[level]

    def keep(t: Turn) -> bool:
        return (_RANK[log_level(t)] >= min_rank and (container_id is None or t.container_id == container_id)
                and (since_ms is None or t.created_at >= since_ms) and (until_ms is None or t.created_at < until_ms))

    if turn_id is not None:
        turn = await store.get_turn(tenant_id, turn_id)
        ok = turn is not None and turn.status in TERMINAL_TURN_STATUSES and keep(turn)
        return ([turn] if ok and turn is not None else []), None

    filtered = min_rank > 0 or container_id is not None
    page = _LOG_PAGE if filtered else limit + 1
    items: list[Turn] = []
    last: Turn | None = None  # the last turn read and passed over (kept or not)
    scanned = 0
    while True:
        turns, next_cursor = await store.list_tenant_turns(tenant_id, since_ms=since_ms, until_ms=until_ms,
                                                           limit=page, cursor=cursor)
        for t in turns:
            if keep(t):
                if len(items) == limit:
                    assert last is not None
                    return items, next_turn_cursor(last)
                items.append(t)
            last = t
            scanned += 1
        if next_cursor is None:
            return items, None
        if scanned >= LOG_SCAN_MAX:
            assert last is not None
            return items, next_turn_cursor(last)
        cursor = next_cursor


def ops_router(principal_for: Callable[[Request], Awaitable[Principal]], *,
               metrics: Callable[[], TurnMetrics] | None = None,
               admin_for: Callable[[Request], Awaitable[Principal]] | None = None,
               turn_log: Callable[[], Store] | None = None) -> APIRouter:
    """`/v1/metrics` (with `metrics`), `/metrics` (with `metrics` and `admin_for`), `/v1/logs` (with
    `turn_log`)."""
    router = APIRouter(tags=["ops"])
    Caller = Annotated[Principal, Depends(principal_for)]

    if metrics is not None:
        registry = metrics

        @router.get("/v1/metrics", summary="The caller's turns: counts, success and error rates, tokens, "
                                           "latency p50/p95, active containers and connections")
        async def tenant_metrics(p: Caller, window: Annotated[str, Query(
                max_length=8, description="`all` (since the process started), or 1m to 60m / 1h")] = "all") -> JSON:
            return metrics_wire(registry().tenant(p.tenant_id, parse_window(window)))

        if admin_for is not None:
            Admin = Annotated[Principal, Depends(admin_for)]

            @router.get("/metrics", summary="Prometheus exposition (text 0.0.4, or OpenMetrics when `Accept` asks "
                                            "for it): every tenant aggregated (admin)",
                        response_class=Response)
            async def prometheus(_admin: Admin, request: Request) -> Response:
                from agentvm.services.prometheus import exposition  # not on the cloud functions' path

                body, content_type = exposition(registry(), request.headers.get("accept"))
                return Response(body, media_type=content_type)

    if metrics is None and turn_log is not None:
        log_store = turn_log

        @router.get("/v1/metrics", summary="The caller's turns from the turn log: counts, success and error "
                                           "rates, tokens, turn latency p50/p95")
        async def turn_log_tenant_metrics(p: Caller, window: Annotated[str, Query(
                max_length=8, description="`all` (the last 24 h), or 1m to 60m / 1h")] = "all") -> JSON:
            return metrics_wire(await turn_log_metrics(log_store(), p.tenant_id, parse_window(window)))

    if turn_log is not None:
        store = turn_log

        @router.get("/v1/logs", summary="The caller's turn logs and errors, newest first")
        async def logs(p: Caller,
                       since: Annotated[str | None, Query(max_length=40,
                                                          description="epoch ms or ISO 8601, inclusive")] = None,
                       until: Annotated[str | None, Query(max_length=40,
                                                          description="epoch ms or ISO 8601, exclusive")] = None,
                       level: Annotated[Level, Query(description="info: every turn; warning: interrupted and "
                                                                 "failed turns; error: failed turns")] = "info",
                       container_id: Annotated[str | None, Query(alias="containerId", max_length=200)] = None,
                       turn_id: Annotated[str | None, Query(alias="turnId", max_length=200)] = None,
                       limit: Annotated[int, Query(ge=1, le=200)] = 50,
                       cursor: Annotated[str | None, Query(max_length=200)] = None) -> JSON:
            items, next_cursor = await read_logs(
                store(), p.tenant_id, since_ms=parse_time(since, "since"), until_ms=parse_time(until, "until"),
                level=level, container_id=container_id, turn_id=turn_id, limit=limit, cursor=cursor)
            return {"items": [log_entry(t) for t in items], "nextCursor": next_cursor}

    return router
