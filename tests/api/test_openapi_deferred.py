"""FastAPI imported with its OpenAPI document models deferred (agentvm/api/fastapi_first.py): a cold
start builds none of them (nor any router: api/route_groups.py), the first `/openapi.json` builds them,
and the document is the one FastAPI writes when imported as usual. Fresh interpreters: this test
process has long imported FastAPI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.bench.cold_imports import FUNCTIONS, lambda_env

# Imports the http_api handler (optionally FastAPI first, the usual way), then writes its document.
_CHILD = textwrap.dedent("""
    import json, sys
    if sys.argv[2] == "fastapi-first":
        import fastapi
    sys.path.insert(0, sys.argv[1])
    import handler
    routers = sorted(m for m in sys.modules if m.startswith("agentvm.api.") and m.endswith("_http"))
    v1 = "pydantic.v1" in sys.modules
    from fastapi.openapi import models
    from pydantic import BaseModel
    built = lambda: sorted(n for n, v in vars(models).items()
                           if isinstance(v, type) and issubclass(v, BaseModel) and v.__pydantic_complete__)
    class After(BaseModel):  # a model of ours, made after the import: built at once as usual
        x: int
    report = {"built_at_import": built(), "default_left": dict(BaseModel.model_config),
              "after_built": After.__pydantic_complete__, "routers_at_import": routers, "v1_at_import": v1}
    report["document"] = handler._asgi.app.openapi()
    report["built_after_document"] = "OpenAPI" in built()
    print(json.dumps(report))
""")


def _run(mode: str) -> dict[str, object]:
    folder = FUNCTIONS / "http_api"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(folder), mode], cwd=folder,
                          env=lambda_env("http_api", folder), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def test_a_cold_start_builds_no_openapi_model_and_the_document_is_unchanged() -> None:
    cold, usual = _run("cold"), _run("fastapi-first")
    # only OAuthFlows, whose instance is a default argument in fastapi.security.oauth2 (the rebuild of
    # Schema, Operation and Encoding at the module's end is deferred too)
    assert cold["built_at_import"] == ["OAuthFlows"], cold["built_at_import"]
    assert len(usual["built_at_import"]) > 30  # type: ignore[arg-type]
    assert cold["default_left"] == usual["default_left"] == {}
    assert cold["after_built"] is True
    assert cold["built_after_document"] is True
    assert cold["document"] == usual["document"]
    paths = cold["document"]["paths"]  # type: ignore[index]
    assert "/v1/resources" in paths and "/health" in paths
    # no router is built at import (api/route_groups.py: the first request of a path builds its own),
    # so neither is pydantic.v1 loaded (FastAPI imports it to check a built route's types)
    assert cold["routers_at_import"] == usual["routers_at_import"] == [], cold["routers_at_import"]
    assert cold["v1_at_import"] is False
