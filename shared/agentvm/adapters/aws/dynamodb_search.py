"""Message search on the table (`SearchIndex`): per-tenant month partitions."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentvm.adapters.aws.dynamodb_items import (
    Item,
    _key,
    _month,
    _Pos,
    _s,
    _search_ids,
    _search_pk,
    _search_pos,
    _search_text,
    _session_pk,
)
from agentvm.adapters.aws.dynamodb_table import DynamoTable
from agentvm.adapters.sqlite_fts import rank_texts
from agentvm.domain.message_text import (
    bad_cursor,
    cursor_int,
    match_expression,
    search_cursor,
    search_cursor_state,
)
from agentvm.domain.models import SearchHit


class DynamoSearch(DynamoTable):
    """`SearchIndex` on DynamoDB."""

    #: `search_messages`: the items ranked together (one BM25 window, read newest first), the items
    #: one call reads at most (whole windows), and how many months back from now a search goes.
    search_window_items: int = 500
    search_budget_items: int = 2000
    search_months: int = 24

    async def search_messages(self, tenant_id: str, query: str, *, limit: int = 20,
                              cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """Search the tenant's search items (`SRCH#{t}#{yyyymm}`), newest month first, one window at
        a time: up to `search_window_items` items read newest first (eventually consistent Queries),
        ranked together with an in-memory FTS5 index (BM25) and returned best first; then the next,
        older window. A call reads at most `search_budget_items` items (whole windows): a page may
        then hold fewer than `limit` hits, and its cursor continues below. The cursor is a window's
        bounds and how many of its hits were returned (a page ending inside a window reads that
        window again), or where the next window starts; the search ends `search_months` months
        back (fewer with a hot window: `_months_searched`). Hits whose session no longer exists (a
        delete cut short) are dropped after one consistent BatchGetItem of the page's sessions,
        which also gives their images."""
        state = search_cursor_state(cursor, query)
        match = match_expression(query)
        limit = max(limit, 1)
        if state is None:
            newest = _month(int(self._clock() * 1000) + 86_400_000)  # a day ahead: writers' clocks differ
            state = {"old": _month_add(newest, 1 - self._months_searched()), "below": [newest, "~"]}
        oldest = _cursor_month(state.get("old"))
        positions: list[_Pos]
        window: tuple[_Pos, _Pos] | None
        if "below" in state:
            below: _Pos | None = _cursor_pos(state["below"])
            window, skip, last = None, 0, False
            positions = [_cursor_pos(state["below"])]
        else:
            hi, lo = _cursor_pos(state.get("hi")), _cursor_pos(state.get("lo"))
            if hi < lo:
                raise bad_cursor()
            below, window = None, (hi, lo)
            skip, last = cursor_int(state, "skip"), state.get("last") is True
            positions = [hi, lo]
        # every month a cursor names lies within the search's months: a forged one cannot make it read more
        if not all(0 <= _months_between(m, oldest) <= self._months_searched() for m, _sk in positions):
            raise bad_cursor()
        if match is None:
            return [], None
        found: list[tuple[Item, float, str]] = []
        read = 0
        while True:
            if window is None:
                assert below is not None
                if read >= self.search_budget_items:
                    return await self._search_hits(tenant_id, found), search_cursor(
                        {"old": oldest, "below": list(below)}, query)
                items, last = await self._search_window(tenant_id, below, oldest)
                if not items:
                    return await self._search_hits(tenant_id, found), None
                window = (_search_pos(items[0]), _search_pos(items[-1]))
            else:
                items = await self._search_range(tenant_id, *window)
            read += len(items)
            ranked = await asyncio.to_thread(rank_texts, [_search_text(i) for i in items], match)
            taken = ranked[skip:skip + limit - len(found)]
            found += [(items[n], score, snippet) for n, score, snippet in taken]
            if skip + len(taken) < len(ranked):  # the page is full inside this window
                return await self._search_hits(tenant_id, found), search_cursor(
                    {"old": oldest, "hi": list(window[0]), "lo": list(window[1]), "skip": skip + len(taken),
                     "last": last}, query)
            if last:
                return await self._search_hits(tenant_id, found), None
            below, window, skip = window[1], None, 0  # the next window starts below this one
            if len(found) == limit:
                return await self._search_hits(tenant_id, found), search_cursor(
                    {"old": oldest, "below": list(below)}, query)

    def _months_searched(self) -> int:
        """`search_months`, or fewer when history expires: the months the hot window (plus a few
        days of TTL lag) can touch, so a search that matches nothing reads 3 partitions, not 24."""
        if not self._history_ttl_s:
            return self.search_months
        return min(self.search_months, self._history_ttl_s // (28 * 86_400) + 2)

    async def _search_window(self, tenant_id: str, below: _Pos, oldest: int) -> tuple[list[Item], bool]:
        """Up to `search_window_items` search items below `below`, newest first, going back to the
        month `oldest`; and whether nothing older is left. Months are read 1, 2, 4, … at a time
        (concurrently), so a sparse history costs a few round trips, and a dense month no extra read."""
        want = max(self.search_window_items, 1)
        month, sk = below
        items: list[Item] = []
        batch = 1
        while month >= oldest:
            months = [m for m in (_month_add(month, -i) for i in range(batch)) if m >= oldest]
            pages = await asyncio.gather(*(self._search_month(tenant_id, m, sk if m == month else "~",
                                                              want - len(items)) for m in months))
            for page in pages:
                items += page[:want - len(items)]
                if len(items) >= want:
                    return items, False
            month, sk, batch = _month_add(months[-1], -1), "~", batch * 2
        return items, True

    async def _search_month(self, tenant_id: str, month: int, below: str, want: int) -> list[Item]:
        """Up to `want` search items of one month partition below the sort key `below`, newest first."""
        params: dict[str, Any] = {
            "TableName": self.table_name, "ScanIndexForward": False, "KeyConditionExpression": "PK = :pk AND SK < :sk",
            "ExpressionAttributeValues": {":pk": _s(_search_pk(tenant_id, month)), ":sk": _s(below)}}
        items: list[Item] = []
        while len(items) < want:
            resp = await self.client.query(**params, Limit=want - len(items))
            items += resp.get("Items", [])
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return items

    async def _search_range(self, tenant_id: str, hi: _Pos, lo: _Pos) -> list[Item]:
        """The search items from `hi` down to `lo` (both included): a window read before, again."""
        async def month_items(month: int) -> list[Item]:
            values: Item = {":pk": _s(_search_pk(tenant_id, month))}
            if month == hi[0] == lo[0]:
                condition = "PK = :pk AND SK BETWEEN :lo AND :hi"
                values[":lo"], values[":hi"] = _s(lo[1]), _s(hi[1])
            elif month == hi[0]:
                condition, values[":hi"] = "PK = :pk AND SK <= :hi", _s(hi[1])
            elif month == lo[0]:
                condition, values[":lo"] = "PK = :pk AND SK >= :lo", _s(lo[1])
            else:
                condition = "PK = :pk"
            return await self._query(KeyConditionExpression=condition, ExpressionAttributeValues=values,
                                     ScanIndexForward=False)

        months = [hi[0]]
        while months[-1] > lo[0]:
            months.append(_month_add(months[-1], -1))
        pages = await asyncio.gather(*(month_items(m) for m in months))
        return [item for page in pages for item in page]

    async def _search_hits(self, tenant_id: str, found: list[tuple[Item, float, str]]) -> list[SearchHit]:
        """The hits whose session still exists, with its image (one consistent BatchGetItem)."""
        ids = [_search_ids(item) for item, _score, _snippet in found]
        sessions = {i["session_id"]["S"]: i for i in await self._batch_get(
            [_key(_session_pk(tenant_id, sid), "SESS") for sid in dict.fromkeys(sid for _ts, sid, _mid in ids)])}
        return [SearchHit(sid, mid, item["role"]["S"], item["subtype"]["S"], created, snippet, score,
                          sessions[sid]["image_id"]["S"])
                for (item, score, snippet), (created, sid, mid) in zip(found, ids, strict=True) if sid in sessions]


def _months_between(later: int, earlier: int) -> int:
    return (later // 100 - earlier // 100) * 12 + later % 100 - earlier % 100

def _month_add(month: int, n: int) -> int:
    index = (month // 100) * 12 + month % 100 - 1 + n
    return (index // 12) * 100 + index % 12 + 1

def _cursor_month(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 197001 <= value <= 999912 \
            or not 1 <= value % 100 <= 12:
        raise bad_cursor()
    return value

def _cursor_pos(value: Any) -> _Pos:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str) and 0 < len(value[1]) <= 1024):
        raise bad_cursor()
    return _cursor_month(value[0]), value[1]


if TYPE_CHECKING:
    from agentvm.ports import SearchIndex

    def _implements_port(repo: DynamoSearch) -> SearchIndex:  # mypy checks the port's signatures
        return repo
