"""`/v1/budgets` and `/v1/usage`: a tenant's budgets and limits, its usage aggregates and exports."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel

from agentvm.ids import MAX_EPOCH_MS, now_ms
from agentvm.services.billing import FORMATS, GROUPS, BillingService, window
from agentvm.services.keys import Caller

JSON = dict[str, Any]
DAY_MS = 86_400_000


def _not_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a decimal amount in USD, such as \"25.00\", not a boolean")
    return value


class BudgetBody(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    key_id: str | None = Field(None, min_length=1, max_length=200,
                               description="a key of the tenant; none: the tenant's own budget")
    # a boolean is not an amount or a count (lax validation would make true a 1)
    monthly_budget: Annotated[str | float | int | None, BeforeValidator(_not_boolean)] = Field(
        None, description="billed USD per calendar month (UTC), decimal text such as \"25.00\"")
    requests_per_minute: StrictInt | None = Field(None, description="turns started per minute")


def billing_router(billing: Callable[[], BillingService],
                   caller_for: Callable[[Request], Awaitable[Caller]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["usage and budgets"])
    Who = Annotated[Caller, Depends(caller_for)]

    @router.get("/budgets", summary="The tenant's budgets and this month's spent and reserved amounts")
    async def budgets(caller: Who) -> JSON:
        return await billing().budgets(caller)

    @router.put("/budgets", summary="Set the tenant's (or one of its keys') monthly budget and rate limit (admin)")
    async def set_budget(body: BudgetBody, caller: Who) -> JSON:
        monthly = body.monthly_budget
        budget = await billing().set_budget(caller, key_id=body.key_id,
                                            monthly=None if monthly is None else str(monthly),
                                            requests_per_minute=body.requests_per_minute)
        return budget.to_wire()

    @router.delete("/budgets", status_code=204, summary="Remove the tenant's (or a key's) budget (admin)")
    async def delete_budget(caller: Who, key_id: Annotated[str | None, Query(alias="keyId")] = None) -> Response:
        await billing().delete_budget(caller, key_id)
        return Response(status_code=204)

    @router.get("/usage", summary="Usage aggregates of the tenant: totals and rows per group")
    async def usage(
        caller: Who,
        since: Annotated[int | None, Query(ge=0, le=MAX_EPOCH_MS,
                                           description="epoch ms, inclusive (default: 30 days ago)")] = None,
        until: Annotated[int | None, Query(ge=0, le=MAX_EPOCH_MS,
                                           description="epoch ms, exclusive (default: now)")] = None,
        period: Annotated[str | None, Query(description="a month (2026-11) or a day (2026-11-05) instead of "
                                                        "since/until")] = None,
        group_by: Annotated[str, Query(alias="groupBy", description=f"comma-separated: {', '.join(GROUPS)}")]
        = "day",
    ) -> JSON:
        if period is not None:
            w = window(period)
            since, until = w.since_ms, w.until_ms
        end = until if until is not None else now_ms() + 1
        start = since if since is not None else end - 30 * DAY_MS
        groups = [g.strip() for g in group_by.split(",") if g.strip()]
        return await billing().usage(caller.tenant_id, since_ms=start, until_ms=end, group_by=groups)

    @router.get("/usage/export", summary="The tenant's usage of a period as FOCUS 1.0 CSV or JSON lines",
                response_class=Response)
    async def export(
        caller: Who,
        period: Annotated[str, Query(description="a month (2026-11) or a day (2026-11-05)")],
        fmt: Annotated[str, Query(alias="format", description=" or ".join(FORMATS))] = "focus",
    ) -> Response:
        media, text = await billing().export(caller.tenant_id, period, fmt)
        ext = "csv" if fmt == "focus" else "jsonl"
        name = f"agentvm-usage-{period}.{ext}"
        return Response(text, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})

    return router
