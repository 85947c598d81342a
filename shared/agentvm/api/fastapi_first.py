"""Imports FastAPI with the validators of its OpenAPI document models deferred (a cold-start saving).

`import fastapi` builds the ~50 pydantic models of `fastapi.openapi.models` (the OpenAPI document's
schema, `Schema`, `Operation`, `Components`, …): about a third of FastAPI's import, ~40 ms of CPU,
8 % of `http_api`'s cold import (docs/benchmarks.md, "Handler cold imports"). A request never uses
them: they validate the document `/openapi.json` answers, and a security scheme's description. So
FastAPI is imported here with pydantic's `defer_build` as the default of every model class created
during that import (and `model_rebuild` deferred too, see `_deferred_rebuild`), both restored at once:
each of those models then builds its validator the first time it is used (the first `/openapi.json`),
and the document is the same.

`agentvm.api.http_app` imports this module before anything else of FastAPI; when FastAPI is already
loaded (a test process, `avm serve` after its CLI), importing it changes nothing. The default is set
on `BaseModel.model_config`, which every model class's config is merged from at class creation; a
model class created by another thread during that window would be deferred too, which only moves
its build to its first use (the composition roots import this on their one thread).
"""

from __future__ import annotations

import sys
from typing import Any

from pydantic import BaseModel


def import_fastapi() -> None:
    """Import FastAPI (once), its OpenAPI document models built on first use."""
    if "fastapi" in sys.modules:
        return
    config = BaseModel.model_config
    before = config.get("defer_build")
    config["defer_build"] = True
    BaseModel.model_rebuild = classmethod(_deferred_rebuild)  # type: ignore[assignment,method-assign]
    try:
        import fastapi  # noqa: F401
    finally:
        BaseModel.model_rebuild = _REBUILD  # type: ignore[method-assign]
        if before is None:
            config.pop("defer_build", None)
        else:
            config["defer_build"] = before


def _deferred_rebuild(cls: type[Any], /, **kwargs: Any) -> bool | None:
    """`model_rebuild` while FastAPI is imported. `fastapi.openapi.models` ends by rebuilding the models
    that reference each other (`Schema`, `Operation`, `Encoding`), which would build their validators
    now: such an explicit call is deferred (their first use builds them, resolving the references in
    the module then). Pydantic's own call, when a deferred model is first used, rebuilds at once."""
    if "_parent_namespace_depth" not in kwargs:
        return None
    kwargs["_parent_namespace_depth"] += 1  # this frame is one more between the caller and pydantic
    return _REBUILD.__get__(None, cls)(**kwargs)  # type: ignore[no-any-return]


_REBUILD = BaseModel.__dict__["model_rebuild"]


import_fastapi()
