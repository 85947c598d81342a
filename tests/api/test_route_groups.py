"""Routers built when a request first needs them (agentvm/api/route_groups.py): a request builds the
groups its path is under and no other, once; routes match in the order the groups were added whatever
order they were built in; a route outside its group's prefixes is refused when built."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from agentvm.api.route_groups import BuildRoutes, RouteGroups


def _router(paths: Sequence[str], answer: str) -> APIRouter:
    router = APIRouter()
    for path in paths:
        async def endpoint(answer: str = answer) -> dict[str, str]:
            return {"group": answer}

        router.add_api_route(path, endpoint, methods=["GET"])
    return router


def _app(groups_spec: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> tuple[FastAPI, RouteGroups, list[str]]:
    app = FastAPI()
    groups = RouteGroups(app)
    built: list[str] = []
    for name, (prefixes, paths) in groups_spec.items():
        def build(name: str = name, paths: tuple[str, ...] = paths) -> list[APIRouter]:
            built.append(name)
            return [_router(paths, name)]

        groups.add(prefixes, build)
    app.add_middleware(BuildRoutes, groups=groups)
    return app, groups, built


async def _get(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        return await http.get(path)


SPEC = {"items": (("/v1/items",), ("/v1/items", "/v1/items/{item_id}")),
        "users": (("/v1/users", "/v1/people"), ("/v1/users/{user_id}", "/v1/people")),
        "root": (("/",), ("/",))}


async def test_a_request_builds_the_group_its_path_is_under_and_no_other_once() -> None:
    app, groups, built = _app(SPEC)
    assert built == [] and groups.routes == []
    assert (await _get(app, "/v1/users/u1")).json() == {"group": "users"}
    assert built == ["users"]
    assert [r.path for r in groups.routes] == ["/v1/users/{user_id}", "/v1/people"]  # type: ignore[attr-defined]
    assert (await _get(app, "/v1/people")).json() == {"group": "users"}
    assert (await _get(app, "/v1/itemsx")).status_code == 404  # a prefix is a path segment, not a string
    assert (await _get(app, "/nowhere")).status_code == 404  # "/" names the root alone
    assert built == ["users"]
    assert (await _get(app, "/v1/items/7")).json() == {"group": "items"}
    assert (await _get(app, "/")).json() == {"group": "root"}
    assert built == ["users", "items", "root"]


async def test_routes_match_in_the_order_the_groups_were_added() -> None:
    app, groups, built = _app(SPEC)
    await _get(app, "/")
    await _get(app, "/v1/people")
    await _get(app, "/v1/items")
    assert built == ["root", "users", "items"]
    assert [r.path for r in groups.routes] == [  # type: ignore[attr-defined]
        "/v1/items", "/v1/items/{item_id}", "/v1/users/{user_id}", "/v1/people", "/"]
    included = [getattr(entry, "original_router", None) for entry in app.router.routes]
    names = [router.routes[0].endpoint.__defaults__[0] for router in included if router is not None]
    assert names == ["items", "users", "root"]


async def test_the_document_builds_every_group() -> None:
    app, groups, built = _app(SPEC)
    groups.build_all()
    assert built == ["items", "users", "root"]
    assert set(app.openapi()["paths"]) == {"/v1/items", "/v1/items/{item_id}", "/v1/users/{user_id}", "/v1/people", "/"}


async def test_a_route_outside_its_group_is_refused_when_built() -> None:
    _, groups, _ = _app({"items": (("/v1/items",), ("/v1/items", "/v1/other"))})
    with pytest.raises(ValueError, match=r"route /v1/other is outside its group's prefixes \['/v1/items'\]"):
        groups.build_all()


@pytest.mark.parametrize("prefixes", [(), ("v1/items",), ("/v1/items/",)])
def test_a_prefix_is_an_absolute_path_without_a_trailing_slash(prefixes: tuple[str, ...]) -> None:
    groups = RouteGroups(FastAPI())
    with pytest.raises(ValueError, match="route group prefixes must be absolute paths without a trailing /"):
        groups.add(prefixes, list)
