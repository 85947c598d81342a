"""How `avm serve` serves the console: `/` leads to it, its files need no key while the API does, they
carry a strict Content-Security-Policy, nothing outside its folder is reachable, and the vendored
libraries are the published ones (checksums)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from tests.support.servers import REPO, create_key, serve

pytestmark = pytest.mark.e2e

CONSOLE = REPO / "local" / "avm" / "console"


def test_the_vendored_libraries_match_their_published_checksums() -> None:
    vendor = CONSOLE / "vendor"
    lines = (vendor / "SHA256SUMS").read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        digest, name = line.split()
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name


def test_every_script_the_page_loads_exists() -> None:
    index = (CONSOLE / "index.html").read_text()
    assert 'src="js/app.js"' in index and 'src="vendor/chart.umd.min.js"' in index
    for js in (CONSOLE / "js").glob("*.js"):
        for line in js.read_text().splitlines():
            if line.startswith("import ") and " from \"" in line:
                target = (js.parent / line.split(" from \"")[1].split("\"")[0]).resolve()
                assert target.is_file(), f"{js.name}: {line}"


def test_the_files_need_no_key_and_the_api_still_does(tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_key(data, "acme")
    with serve(data, env={"AVM_AUTH": "keys"}) as srv, httpx.Client(base_url=srv.http) as http:
        root = http.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/console/")
        assert http.get("/console").headers["location"] == "/console/"
        page = http.get("/console/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        script = http.get("/console/js/app.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert http.get("/health").json()["auth"] == "keys"
        # the API behind it still needs the key
        assert http.get("/v1/images").status_code == 401
        # nothing outside the console's folder, in the one error shape
        # (a literal /console/../app.py is /app.py to the client: an unknown path, which needs the key)
        for path in ("/console/%2e%2e/app.py", "/console/..%2fapp.py", "/console/nope.js"):
            missing = http.get(path)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found", path


def test_an_open_server_says_so_in_its_health(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as srv:
        health = httpx.get(f"{srv.http}/health").json()
        assert (health["status"], health["auth"]) == ("ok", "open")
