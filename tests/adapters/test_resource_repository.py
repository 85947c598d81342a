"""The `ResourceRepository` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

import pytest

from agentvm.errors import Conflict, InvalidRequest, NotFound
from agentvm.ports import Store
from tests.adapters.store_records import res, versions


async def test_resource_versions_are_kept_and_ordered_by_version_key(store: Store) -> None:
    first = res("t1", "r1", "prompt", "sales-assistant", "1.0.0", description="Sells", tags=("sales", "en"))
    await store.create_resource(first)
    for version in ("1.10.0", "1.2.0", "0.9.0"):
        await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", version, created=2))
    assert await versions(store, "t1", "r1") == ["1.10.0", "1.2.0", "1.0.0", "0.9.0"]
    stored = await store.resource_versions("t1", "r1")
    assert stored[-2] == first  # every field round-trips (content's floats and nulls included)
    assert [v.version for v in await store.find_resource("t1", "prompt", "sales-assistant")] == \
        ["1.10.0", "1.2.0", "1.0.0", "0.9.0"]
    assert await store.resource_versions("t1", "nope") == []
    assert await store.find_resource("t1", "tool", "sales-assistant") == []


async def test_resource_names_and_versions_are_unique(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "sales-assistant"))
    with pytest.raises(Conflict, match="Resource already exists: prompt/sales-assistant"):
        await store.create_resource(res("t1", "r2", "prompt", "sales-assistant"))
    await store.create_resource(res("t1", "r3", "tool", "sales-assistant"))  # another kind
    await store.create_resource(res("t2", "r4", "prompt", "sales-assistant"))  # another tenant
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.2.0"))
    with pytest.raises(Conflict, match=r"Version 1\.2\.0 of prompt/sales-assistant already exists"):
        await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.2.0", created=9))
    assert await versions(store, "t1", "r1") == ["1.2.0", "1.0.0"]
    assert (await store.resource_versions("t1", "r1"))[0].created_at == 1  # the first write stays
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t1", "missing", "prompt", "other"))


async def test_another_tenant_can_add_to_and_read_only_what_is_published(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "private"))
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t2", "r1", "prompt", "private", "2.0.0"))
    assert await versions(store, "t1", "r1") == ["1.0.0"]
    assert await store.resource_versions("t2", "r1") == []
    assert await store.find_resource("t2", "prompt", "private") == []
    assert await store.list_resources("t2") == ([], None)

    await store.create_resource(res("t1", "r2", "prompt", "public", published=True))
    await store.add_resource_version(res("t1", "r2", "prompt", "public", "1.1.0", published=True))
    assert await versions(store, "t2", "r2") == ["1.1.0", "1.0.0"]
    found = await store.find_resource("t2", "prompt", "public")
    assert [(v.tenant_id, v.version, v.published) for v in found] == [("t1", "1.1.0", True), ("t1", "1.0.0", True)]
    page, _ = await store.list_resources("t2")
    assert [(v.tenant_id, v.name, v.version) for v in page] == [("t1", "public", "1.1.0")]
    with pytest.raises(NotFound):  # published is readable, not writable
        await store.add_resource_version(res("t2", "r2", "prompt", "public", "2.0.0"))

    # a version that is not published withdraws the resource from other tenants
    await store.add_resource_version(res("t1", "r2", "prompt", "public", "1.2.0"))
    assert await store.resource_versions("t2", "r2") == []
    assert await store.find_resource("t2", "prompt", "public") == []
    assert await store.list_resources("t2") == ([], None)
    assert [v.published for v in await store.resource_versions("t1", "r2")] == [False, False, False]


async def test_a_published_name_is_unique_across_tenants(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "shared", published=True))
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.create_resource(res("t2", "r2", "prompt", "shared", published=True))
    assert await store.find_resource("t2", "prompt", "shared") != []  # t1's, still
    await store.create_resource(res("t2", "r2", "prompt", "shared"))  # private: fine
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.add_resource_version(res("t2", "r2", "prompt", "shared", "2.0.0", published=True))
    assert await versions(store, "t2", "r2") == ["1.0.0"]
    await store.create_resource(res("t2", "r3", "tool", "shared", published=True))  # another kind
    # once t1 withdraws it, t2 may publish that name
    await store.add_resource_version(res("t1", "r1", "prompt", "shared", "1.1.0"))
    await store.add_resource_version(res("t2", "r2", "prompt", "shared", "2.0.0", published=True))
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.add_resource_version(res("t1", "r1", "prompt", "shared", "1.2.0", published=True))
    assert await versions(store, "t3", "r2") == ["2.0.0", "1.0.0"]


async def test_find_resource_prefers_the_tenants_own_resource(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "helper", "3.0.0", published=True))
    await store.create_resource(res("t2", "r2", "prompt", "helper", "1.0.0"))
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t2", "prompt", "helper")] == \
        [("t2", "1.0.0")]
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t3", "prompt", "helper")] == \
        [("t1", "3.0.0")]
    assert [(v.tenant_id, v.version) for v in await store.resource_versions("t2", "r1")] == [("t1", "3.0.0")]


async def list_all(store: Store, tenant: str, *, kind: str | None = None, name: str | None = None,
                   tag: str | None = None, query: str | None = None) -> list[tuple[str, str, str]]:
    """One page with everything (kind, name, owner) that matches."""
    page, cursor = await store.list_resources(tenant, kind=kind, name=name, tag=tag, query=query)
    assert cursor is None
    return [(v.kind, v.name, v.tenant_id) for v in page]


async def test_list_resources_filters_and_shows_the_latest_version(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "sales-assistant", tags=("sales",),
                                    description="Helps the Sales team"))
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.1.0", tags=("sales", "crm"),
                                         description="Helps the Sales team"))
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.0.1"))  # a late patch
    await store.create_resource(res("t1", "r2", "prompt", "sales-coach", tags=("coaching",)))
    await store.create_resource(res("t1", "r3", "tool", "sales-lookup", description="CRM lookup"))
    await store.create_resource(res("t2", "r4", "prompt", "support", published=True, tags=("crm",)))
    await store.create_resource(res("t2", "r5", "prompt", "secret", tags=("crm",)))  # private: never listed

    page, cursor = await store.list_resources("t1")
    assert cursor is None
    assert [(v.kind, v.name, v.version) for v in page] == [
        ("prompt", "sales-assistant", "1.1.0"), ("prompt", "sales-coach", "1.0.0"), ("prompt", "support", "1.0.0"),
        ("tool", "sales-lookup", "1.0.0")]
    assert page[0].tags == ("sales", "crm") and page[0].content == {"text": "sales-assistant@1.1.0",
                                                                    "n": [1, 2.5, None, {"x": True}]}
    assert await list_all(store, "t1", kind="tool") == [("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", kind="prompt", name="sales-") == [
        ("prompt", "sales-assistant", "t1"), ("prompt", "sales-coach", "t1")]
    assert await list_all(store, "t1", name="sales-") == [
        ("prompt", "sales-assistant", "t1"), ("prompt", "sales-coach", "t1"), ("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", name="Sales") == []  # a prefix is exact
    assert await list_all(store, "t1", tag="crm") == [("prompt", "sales-assistant", "t1"), ("prompt", "support", "t2")]
    assert await list_all(store, "t1", tag="cr") == []  # a tag is exact
    assert await list_all(store, "t1", query="crm") == [  # name, description or tags, any case
        ("prompt", "sales-assistant", "t1"), ("prompt", "support", "t2"), ("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", query="SALES TEAM") == [("prompt", "sales-assistant", "t1")]
    assert await list_all(store, "t1", query="COACH") == [("prompt", "sales-coach", "t1")]
    assert await list_all(store, "t1", kind="prompt", tag="crm", query="support") == [("prompt", "support", "t2")]
    assert await list_all(store, "t2") == [("prompt", "secret", "t2"), ("prompt", "support", "t2")]
    assert await list_all(store, "t3") == [("prompt", "support", "t2")]


async def test_list_resources_pages_are_disjoint_and_complete(store: Store) -> None:
    # own and published resources interleave, one name exists twice (own and another tenant's)
    await store.create_resource(res("t1", "r1", "prompt", "b"))
    await store.create_resource(res("t2", "r2", "prompt", "b", published=True))
    await store.create_resource(res("t2", "r3", "prompt", "a", published=True))
    await store.create_resource(res("t1", "r4", "prompt", "c", published=True))
    await store.create_resource(res("t1", "r5", "agent", "z"))
    await store.create_resource(res("t2", "r6", "prompt", "d"))  # private to t2
    pages: list[list[tuple[str, str, str]]] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_resources("t1", limit=2, cursor=cursor)
        pages.append([(v.kind, v.name, v.tenant_id) for v in page])
        if cursor is None:
            break
    assert pages == [[("agent", "z", "t1"), ("prompt", "a", "t2")],
                     [("prompt", "b", "t1"), ("prompt", "b", "t2")],
                     [("prompt", "c", "t1")]]
    # with filters: the cursor continues the filtered listing
    first, cursor = await store.list_resources("t1", kind="prompt", limit=1)
    assert [v.name for v in first] == ["a"] and cursor is not None
    rest, end = await store.list_resources("t1", kind="prompt", limit=10, cursor=cursor)
    assert [(v.name, v.tenant_id) for v in rest] == [("b", "t1"), ("b", "t2"), ("c", "t1")] and end is None


async def test_delete_resource_removes_every_version_and_frees_the_names(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "gone", published=True))
    await store.add_resource_version(res("t1", "r1", "prompt", "gone", "1.1.0", published=True))
    await store.create_resource(res("t1", "r2", "prompt", "kept"))
    assert await store.delete_resource("t2", "r1") is False  # another tenant's: nothing happens
    assert await versions(store, "t1", "r1") == ["1.1.0", "1.0.0"]
    assert await store.delete_resource("t1", "r1") is True
    assert await store.delete_resource("t1", "r1") is False
    assert await store.resource_versions("t1", "r1") == [] and await store.resource_versions("t2", "r1") == []
    assert await store.find_resource("t1", "prompt", "gone") == []
    assert await list_all(store, "t1") == [("prompt", "kept", "t1")]
    assert await list_all(store, "t2") == []
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t1", "r1", "prompt", "gone", "2.0.0"))
    # both names are free again: the tenant's, and the published one for every tenant
    await store.create_resource(res("t2", "r3", "prompt", "gone", published=True))
    await store.create_resource(res("t1", "r4", "prompt", "gone", "5.0.0"))
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t1", "prompt", "gone")] == [("t1", "5.0.0")]


async def test_list_resources_orders_by_kind_name_and_owner_whatever_the_characters(store: Store) -> None:
    names = ["a", "a b", "a!", "a#", "a$", "a%", "a%23", "a-b", "ab", "a\u00e9", "\u00e9", "b"]
    for n, name in enumerate(names):
        await store.create_resource(res("t1", f"r{n}", "prompt", name))
    await store.create_resource(res("t#2", "x1", "prompt", "a", published=True))
    await store.create_resource(res("t 2", "x2", "prompt", "a b", published=True))
    expected = sorted([("prompt", name, "t1") for name in names] + [("prompt", "a", "t#2"), ("prompt", "a b", "t 2")])
    assert await list_all(store, "t1") == expected
    listed: list[tuple[str, str, str]] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_resources("t1", limit=3, cursor=cursor)
        listed += [(v.kind, v.name, v.tenant_id) for v in page]
        if cursor is None:
            break
    assert listed == expected
    assert await list_all(store, "t1", kind="prompt", name="a%") == [("prompt", "a%", "t1"), ("prompt", "a%23", "t1")]
    assert await list_all(store, "t1", kind="prompt", name="a#") == [("prompt", "a#", "t1")]


@pytest.mark.parametrize("cursor", ["", "%%%", "bm9wZQ=x"])


async def test_a_bad_list_cursor_is_an_invalid_request(store: Store, cursor: str) -> None:
    with pytest.raises(InvalidRequest, match="Invalid cursor"):
        await store.list_resources("t1", cursor=cursor)
