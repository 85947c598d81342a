"""Headless Chromium for the console tests (Debian's `chromium`, driven by Playwright for Python),
with every console message and page error of a page collected."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import REPO

ARTIFACTS = REPO / ".artifacts" / "console"  # screenshots of each page, kept after the run
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed: `make test` installs Debian's chromium with apt-get as root")
    return found


@dataclass
class Watched:
    """A page and what its console said (errors and warnings) and which page errors it threw."""

    page: Any
    problems: list[str] = field(default_factory=list)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser: Any, *, width: int = 1200, height: int = 900) -> Watched:
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    watched = Watched(context.new_page())
    watched.page.set_default_timeout(15_000)
    watched.page.on("console", lambda m: watched.problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
    watched.page.on("pageerror", lambda e: watched.problems.append(f"page error: {e}"))
    return watched
