"""The web console in real headless Chromium against a real `avm serve` (issue 21): sign in, create an
image, a streamed reply that survives a reload, interrupt, search, the turn's cost on the usage page,
keys created and revoked; keyboard only and a phone-sized screen. Screenshots: .artifacts/console/."""

from __future__ import annotations

import functools
import http.server
import re
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.browser import Watched, open_page
from tests.support.servers import REPO, create_key, serve

pytestmark = pytest.mark.e2e

SCRIPT = """
rules:
  - match: "^slow"
    responses:
      - text: ["**Slow** ", "story ", "one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ",
               "nine ", "ten ", "the end."]
        delay_ms: 300
        usage: {input_tokens: 1200, output_tokens: 300}
  - match: "^long"
    responses:
      - text: ["Long ", "answer ", "a ", "b ", "c ", "d ", "e ", "f ", "g ", "h ", "i ", "j ", "k ", "l ", "m "]
        delay_ms: 500
  - match: "^tool"
    responses:
      - text: ["Let me check."]
        tool_calls:
          - {id: toolu_01, name: Bash, input: {command: ls -1}, result: "a.txt\\nb.txt"}
      - text: ["Two files: `a.txt` and `b.txt`."]
"""
CONSOLE = REPO / "local" / "avm" / "console"
SLOW_REPLY = "Slow story one two three four five six seven eight nine ten the end."
UNAUTHORIZED = re.compile(r"console error: Failed to load resource: the server responded with a status of 401")


def script(tmp_path: Path) -> str:
    path = tmp_path / "script.yaml"
    path.write_text(SCRIPT)
    return str(path)


def texts(w: Watched, testid: str) -> list[str]:
    return [t.strip() for t in w.page.get_by_test_id(testid).all_inner_texts()]


def wait_turns(w: Watched, count: int) -> None:
    w.page.get_by_test_id("turn-cost").nth(count - 1).wait_for()


def send(w: Watched, text: str) -> None:
    w.page.get_by_test_id("message-input").fill(text)
    w.page.get_by_test_id("send-button").click()


def test_a_tenant_chats_searches_sees_its_cost_and_manages_keys(tmp_path: Path, browser: Any) -> None:
    data = tmp_path / "data"
    token = create_key(data, "acme", "user", "admin")
    with serve(data, "--script", script(tmp_path), env={"AVM_AUTH": "keys"}) as srv:
        w = open_page(browser)
        page = w.page
        page.goto(f"{srv.http}/")
        assert page.url == f"{srv.http}/console/"

        # sign in: a wrong key is refused with the server's words, the right one opens the chat page
        page.get_by_test_id("api-key").fill("avm_not_a_key")
        page.get_by_test_id("sign-in").click()
        page.get_by_test_id("sign-in-error").filter(has_text="API key").wait_for()
        w.shot("sign-in")
        assert all(UNAUTHORIZED.match(p) for p in w.problems), w.problems  # that refused call, nothing else
        w.problems.clear()
        page.get_by_test_id("api-key").fill(token)
        page.get_by_test_id("sign-in").click()
        page.get_by_test_id("new-chat").wait_for()
        page.locator("#status").filter(has_text="WebSocket connected").wait_for()

        # an image from the form (priced as Haiku: the scripted driver answers in the image's model)
        page.get_by_test_id("new-image").click()
        page.get_by_test_id("image-name").fill("Storyteller")
        page.get_by_test_id("image-model").fill("claude-haiku-4-5")
        page.get_by_test_id("create-image").click()
        page.get_by_role("heading", name="Storyteller").wait_for()

        # a tool call is shown with its arguments and result
        send(w, "tool please")
        wait_turns(w, 1)
        assert texts(w, "assistant-message") == ["Let me check.", "Two files: a.txt and b.txt."]
        # the arguments and the result sit in a collapsed <details>: read from the DOM
        assert page.get_by_test_id("tool-args").first.text_content() == '{\n  "command": "ls -1"\n}'
        assert page.get_by_test_id("tool-result").first.text_content() == "a.txt\nb.txt"

        # a streamed reply, reloaded in the middle, continues where it was and is shown once
        send(w, "slow story please <b>as typed</b>")
        page.get_by_test_id("assistant-message").nth(2).filter(has_text="story").wait_for()
        partial = texts(w, "assistant-message")[2]
        assert SLOW_REPLY.startswith(partial) and partial != SLOW_REPLY, partial
        page.reload()
        wait_turns(w, 2)
        assert texts(w, "assistant-message")[2:] == [SLOW_REPLY]
        assert page.locator("[data-testid=assistant-message] strong").first.inner_text() == "Slow"  # Markdown
        w.shot("chat")

        # interrupt a long reply: the turn ends interrupted, its cost line says so
        send(w, "long answer please")
        page.get_by_test_id("assistant-message").nth(3).filter(has_text="answer").wait_for()
        page.get_by_test_id("interrupt-button").click()
        wait_turns(w, 3)
        assert texts(w, "turn-cost")[2].endswith("interrupted"), texts(w, "turn-cost")
        assert page.get_by_test_id("interrupt-button").is_hidden()

        billed = [Decimal(page.get_by_test_id("turn-cost").nth(i).get_attribute("data-billed") or "0")
                  for i in range(3)]
        assert billed[1] > 0  # 1,200 + 300 tokens at Haiku's prices × 1.05

        # search finds the message, the match highlighted
        page.get_by_test_id("nav-sessions").click()
        page.get_by_test_id("session-list").wait_for()
        page.get_by_test_id("search-input").fill("story")
        page.get_by_test_id("search-button").click()
        page.get_by_test_id("search-hit").first.wait_for()
        assert "story" in [m.lower() for m in page.locator("[data-testid=search-hit] mark").all_inner_texts()]
        # markup a user typed is shown as typed, never rendered
        hit = page.get_by_test_id("search-hit").filter(has_text="please")
        assert "<b>as typed</b>" in hit.inner_text() and hit.locator("b").count() == 0
        w.shot("sessions")

        # export the session as an archive, import it back: a new session with the same conversation
        with page.expect_download() as exported:
            page.get_by_role("button", name="Export").first.click()
        archive = tmp_path / exported.value.suggested_filename
        exported.value.save_as(archive)
        assert archive.name.endswith(".session.json")
        page.get_by_test_id("import-file").set_input_files(str(archive))
        page.get_by_test_id("import-button").click()
        page.get_by_test_id("turn-cost").nth(2).wait_for()
        assert texts(w, "user-message") == ["tool please", "slow story please <b>as typed</b>", "long answer please"]
        assert "/chat/" in page.url and archive.name.split(".")[0] not in page.url  # a new session id

        # resources: register a prompt, view it, publish a second version
        page.get_by_test_id("nav-resources").click()
        page.get_by_test_id("definition-list").wait_for()
        page.get_by_test_id("resource-kind").select_option("prompt")
        page.get_by_test_id("resource-name").fill("greeter")
        page.get_by_test_id("resource-version").fill("1.0.0")
        page.get_by_test_id("resource-content").fill('{"text": "You greet people."}')
        page.get_by_test_id("register-resource").click()
        page.get_by_role("button", name="greeter").click()
        assert page.get_by_test_id("resource-view").inner_text() == '{\n  "text": "You greet people."\n}'
        page.get_by_test_id("new-version").fill("1.1.0")
        page.get_by_test_id("new-version-content").fill('{"text": "You greet people warmly."}')
        page.get_by_test_id("publish-version").click()
        page.get_by_test_id("resource-view").filter(has_text="warmly").wait_for()
        # the versions, newest first, the new one shown
        assert page.get_by_test_id("resource-version-pick").locator("option").all_inner_texts() == ["1.1.0", "1.0.0"]
        assert page.get_by_test_id("resource-version-pick").input_value() == "1.1.0"
        w.shot("resources")

        # the usage page's total is what the turns cost, and what the API says
        page.get_by_test_id("nav-usage").click()
        total = page.get_by_test_id("usage-total")
        total.wait_for()
        shown = Decimal(total.get_attribute("data-billed") or "")
        usage = httpx.get(f"{srv.http}/v1/usage", headers={"Authorization": f"Bearer {token}"}).json()
        assert shown == Decimal(usage["total"]["billedCost"]) == sum(billed)
        assert shown > 0
        page.wait_for_function("() => window.Chart && Chart.getChart(document.querySelector('canvas'))")
        w.shot("usage")
        with page.expect_download() as focus:
            page.get_by_test_id("export-focus").click()
        csv = Path(focus.value.path()).read_text()
        assert focus.value.suggested_filename.startswith("agentvm-usage-") and "claude-haiku-4-5" in csv

        # a key: created (the token shown once, and it works), then revoked (and refused)
        page.get_by_test_id("nav-admin").click()
        page.get_by_test_id("key-name").fill("ci")
        page.get_by_test_id("create-key").click()
        new_token = page.get_by_test_id("new-key-token").inner_text()
        ok = httpx.get(f"{srv.http}/v1/images", headers={"Authorization": f"Bearer {new_token}"})
        assert ok.status_code == 200
        row = page.get_by_test_id("key-row").filter(has_text="ci")
        page.once("dialog", lambda d: d.accept())
        row.get_by_test_id("revoke-key").click()
        page.get_by_test_id("key-row").filter(has_text="ci").get_by_test_id("key-status").filter(
            has_text="revoked").wait_for()
        refused = httpx.get(f"{srv.http}/v1/images", headers={"Authorization": f"Bearer {new_token}"})
        assert refused.status_code == 401
        w.shot("admin")
        assert w.problems == []


def test_keyboard_only_on_a_phone_sized_screen(tmp_path: Path, browser: Any) -> None:
    with serve(tmp_path / "data") as srv:  # loopback, no keys: the open mode needs no sign-in
        w = open_page(browser, width=390, height=844)
        page = w.page
        page.goto(f"{srv.http}/")
        page.get_by_test_id("new-chat").wait_for()
        for _ in range(30):  # Tab from the top of the page to the New chat button
            if page.evaluate("document.activeElement && document.activeElement.dataset.testid") == "new-chat":
                break
            page.keyboard.press("Tab")
        else:
            pytest.fail("New chat cannot be reached with the Tab key")
        page.keyboard.press("Enter")
        # the new conversation takes the keyboard: typing goes into the message field
        page.wait_for_function(
            "() => document.activeElement && document.activeElement.dataset.testid === 'message-input'")
        page.keyboard.type("hello from the keyboard")
        page.keyboard.press("Enter")
        wait_turns(w, 1)
        assert texts(w, "assistant-message") == ["You said: hello from the keyboard"]
        # every field has a label, and nothing is wider than the screen
        unlabeled = page.evaluate("""() => [...document.querySelectorAll('input, textarea, select')]
            .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.outerHTML)""")
        assert unlabeled == []
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        w.shot("phone-chat")
        assert w.problems == []


def test_the_files_on_another_host_work_against_a_deployment(tmp_path: Path, browser: Any) -> None:
    """The console as static files on another origin (as against a cloud stack): it asks for a key and
    the server's URLs, and the server allows that origin (CORS)."""
    data = tmp_path / "data"
    token = create_key(data, "acme", "user", "admin")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(CONSOLE))
    static = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=static.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{static.server_address[1]}"
    try:
        with serve(data, env={"AVM_AUTH": "keys", "AVM_CORS_ORIGINS": origin}) as srv:
            w = open_page(browser)
            page = w.page
            page.goto(f"{origin}/index.html")
            page.get_by_test_id("api-key").fill(token)
            page.get_by_text("Server (a cloud deployment").click()
            page.get_by_test_id("api-url").fill(srv.http)
            page.get_by_test_id("ws-url").fill(srv.url)
            page.get_by_test_id("sign-in").click()
            page.get_by_test_id("new-chat").click()
            send(w, "hello across origins")
            wait_turns(w, 1)
            assert texts(w, "assistant-message") == ["You said: hello across origins"]
            assert w.problems == []
    finally:
        static.shutdown()
