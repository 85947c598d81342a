"""Records the Store contract suites (`test_*_repository.py`, `test_session_log.py`, …) build."""

from __future__ import annotations

from agentvm.domain.models import Image, ResourceVersion, Session
from agentvm.ports import Store


def image(tenant: str, iid: str, container: str = "c1", created: int = 1) -> tuple[Image, Session]:
    return (Image(tenant, iid, container, f"sess_{iid}", f"name {iid}", created, created, None, "sys",
                  {"model": "m"}),
            Session(tenant, f"sess_{iid}", iid, container, created, created))


def vkey(version: str) -> str:
    """A key that sorts like the version (release versions only; the tests build their own)."""
    major, minor, patch = (int(p) for p in version.split("."))
    return f"{major:06d}.{minor:06d}.{patch:06d}~"


def res(tenant: str, rid: str, kind: str, name: str, version: str = "1.0.0", *, published: bool = False,
        description: str = "", tags: tuple[str, ...] = (), created: int = 1) -> ResourceVersion:
    return ResourceVersion(
        tenant_id=tenant, resource_id=rid, kind=kind, name=name, version=version, version_key=vkey(version),
        content={"text": f"{name}@{version}", "n": [1, 2.5, None, {"x": True}]}, content_hash=f"sha256:{version}",
        dependencies=("resource://tools/search@^1.0.0",), description=description, tags=tags, published=published,
        created_at=created)


async def versions(store: Store, tenant: str, rid: str) -> list[str]:
    return [v.version for v in await store.resource_versions(tenant, rid)]
