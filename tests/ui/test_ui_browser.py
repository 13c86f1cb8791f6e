"""The live view in a real browser: Debian's chromium, headless, driven by Playwright.

Each test loads the page during a real session (the proxy with ``--ui`` between the demo's
scripted client and agent, with the bundled rules) and asserts what a person sees. One browser
for the module. Where ``ACP_PROXY_REQUIRE_BROWSER=1`` (CI, which installs chromium) a missing
browser fails instead of skipping. A screenshot of the page is kept in
``build/test-artifacts/live-view.png``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from ui_session import ROOT, LiveSession, live_session

from acp_proxy.demo import _child_env
from acp_proxy.demo.session import run_session

CHROMIUM = os.environ.get("ACP_PROXY_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "test-artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing(why: str) -> None:
    if os.environ.get("ACP_PROXY_REQUIRE_BROWSER") == "1":  # .ci/run installed it
        pytest.fail(f"ACP_PROXY_REQUIRE_BROWSER=1, but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        _missing(f"no browser at {CHROMIUM} (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1400, "height": 820},
            accept_downloads=False,
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def agent_frames() -> int:
    """How many frames the scripted agent writes for one session (run without the proxy)."""
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", "0"]
    return len(run_session(agent, _child_env(), 30.0).received)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveSession]:
    with live_session() as session:
        yield session


@pytest.fixture
def page(browser: Any, live: LiveSession) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(live.url)
    yield page
    page.close()
    assert errors == []


def _count(page: Any) -> int:
    return int(page.inner_text("#count"))


def _until(page: Any, check: Any, timeout_s: float = 10.0) -> None:
    """Poll ``check(page)`` (the page's own CSP forbids the eval Playwright's
    wait_for_function uses)."""
    deadline = time.monotonic() + timeout_s
    while not check(page):
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(50)


def _number(page: Any, element: str) -> int:
    return int(page.inner_text(f"#{element}") or 0)


def _wait_count(page: Any, expected: int) -> None:
    _until(page, lambda p: _number(p, "count") >= expected)


def test_the_timeline_shows_every_frame_and_joins_requests(
    page: Any, live: LiveSession, agent_frames: int
) -> None:
    # Three requests from the client, and every frame the agent wrote.
    _wait_count(page, 3 + agent_frames)
    assert _count(page) == 3 + agent_frames
    # The initialize request and its response: joined, with the latency on both rows.
    request = page.locator(".row", has_text="initialize").first
    assert "ms" in request.locator(".joined").inner_text()
    request.click()
    detail = page.inner_text("#detail")
    assert "answered by #" in detail
    response = page.locator(".row", has_text="↳ initialize").first
    assert response.get_attribute("class").find("partner") >= 0
    response.click()
    assert "response to #" in page.inner_text("#detail")
    assert "(initialize) after" in page.inner_text("#detail")


def test_a_rewritten_frame_shows_received_sent_and_the_difference(page: Any) -> None:
    page.wait_for_selector(".mark.changed")
    page.locator(".row", has=page.locator(".mark.changed")).first.click()
    detail = page.locator("#detail")
    assert "rules:edge-route" in detail.inner_text()
    removed = detail.locator(".diff .del").all_inner_texts()
    added = detail.locator(".diff .add").all_inner_texts()
    assert any('"zed.dev/debugMode": true' in line for line in removed)
    assert any('"example.dev/route": "edge"' in line for line in added)
    assert any('"zed.dev/debugMode": null' in line for line in added)
    received = orjson.loads(detail.locator(".raw-received").inner_text())
    assert received["params"]["update"]["_meta"]["zed.dev/debugMode"] is True


def test_the_entity_panel_marks_injected_keys_and_clears(page: Any) -> None:
    page.wait_for_selector(".mark.changed")
    page.click("#tab-entities")
    call = page.locator(".entity[data-id='call_001']")
    call.wait_for()
    # Stored now (after the agent's clear, the proxy's follow-up holds its two keys).
    route = call.locator("table.meta tr[data-key='example.dev/route']")
    assert "injected" in (route.get_attribute("class") or "")
    assert "rules:edge-route" in route.inner_text()
    assert call.locator("table.meta tr").count() == 2
    # The clear, shown as a clear, written by the agent.
    clear = call.locator("table.hist tr.clear")
    assert clear.count() == 1
    assert "clear: all metadata removed" in clear.inner_text()
    assert "agent" in clear.locator(".by").inner_text()
    # A key of the agent's own stays unmarked.
    shell = page.locator(".entity[data-id='term_001'] table.meta tr[data-key='acme.dev/shell']")
    assert "injected" not in (shell.get_attribute("class") or "")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(".row", has_text="tool_call_update").first.click()
    page.screenshot(path=str(ARTIFACTS / "live-view.png"))


def test_filters_narrow_the_list(page: Any, agent_frames: int) -> None:
    _wait_count(page, 3 + agent_frames)
    # Unfiltered, every frame is shown; the rows that are not frames (the session start, the
    # version) count in neither number, so "shown" is never above "frames".
    _until(page, lambda p: _number(p, "shown") == _count(p))
    before = int(page.inner_text("#shown"))
    page.fill("#f-update", "tool_call*")
    _until(page, lambda p: _number(p, "shown") < before)
    names = page.locator(".row:visible .name").all_inner_texts()
    assert names and all(n.startswith("tool_call_update") for n in names)
    assert int(page.inner_text("#shown")) == len(names) == 4
    page.fill("#f-update", "")
    page.select_option("#f-dir", "client_to_agent")
    _until(page, lambda p: _number(p, "shown") == 3)


def test_pause_counts_what_arrives_and_resume_shows_it(page: Any, live: LiveSession) -> None:
    _wait_count(page, 3)
    frames = _count(page)
    shown = int(page.inner_text("#shown"))
    page.click("#pause")
    live.prompt(100 + frames)
    _until(page, lambda p: p.inner_text("#pending").startswith("+"))
    assert int(page.inner_text("#shown")) == shown  # the list held still
    page.click("#pause")
    _until(page, lambda p: _number(p, "shown") > shown)
    assert page.inner_text("#pending") == ""


def test_the_export_matches_the_servers(page: Any, live: LiveSession, browser: Any) -> None:
    _wait_count(page, 3)
    zed = orjson.loads(page.evaluate("window.acpView.zedExport()"))
    base = live.url.split("?")[0].rstrip("/")
    token = live.url.split("token=")[1]
    response = browser.request.get(f"{base}/export?conn=1&format=zed&token={token}")
    assert response.status == 200
    assert zed == orjson.loads(response.body())
    assert zed[0] == {
        "_direction": "outgoing",
        "_type": "request",
        "id": 0,
        "method": "initialize",
        "params": zed[0]["params"],
    }
    assert zed[1]["_type"] == "response" and zed[1]["method"] == "initialize"
    record = page.evaluate("window.acpView.recordExport()").splitlines()
    assert orjson.loads(record[0])["acp-proxy-record"] == 1


def test_a_hundred_thousand_frames_keep_the_dom_bounded(browser: Any, tmp_path: Path) -> None:
    from ui_records import big_record, serve_record

    path = big_record(tmp_path / "big.jsonl", 100_000)
    with serve_record(path) as url:
        page = browser.new_page()
        page.goto(url)
        _until(page, lambda p: _number(p, "count") == 100_000, timeout_s=60.0)
        assert page.locator(".row").count() < 200
        page.fill("#f-text", "frame-77777")
        _until(page, lambda p: _number(p, "shown") == 1)
        page.locator(".row:visible").first.click()
        assert "frame-77777" in page.inner_text("#detail")
        page.close()


def test_a_paused_clients_merges_are_marked_on_the_timeline(browser: Any) -> None:
    from ui_coalescing import paused_client

    with paused_client() as session:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(session.url)
        # Found by the words their rows show (the list is virtualised: a merge written while
        # the client was paused may be thousands of rows above the newest).
        page.fill("#f-text", "updates merged into")
        page.wait_for_selector(".mark.coalesced")
        assert (
            page.locator(".row:visible").count()
            == page.locator(".row:visible .mark.coalesced").count()
        )
        row = page.locator(".row", has=page.locator(".mark.coalesced")).first
        assert "t-coalesced" in (row.get_attribute("class") or "")
        assert row.locator(".kind").inner_text() == "coalesced"
        assert row.locator(".dir").inner_text() == "←"
        name = row.locator(".name").inner_text()
        assert " agent_message_chunk updates merged into 1 frame (" in name
        assert "bytes sent; the client read slowly" in name
        # The update and entity filters keep the merges of that kind and entity; another
        # kind hides them.
        page.fill("#f-update", "agent_message_chunk")
        page.fill("#f-entity", "m1")
        _until(page, lambda p: p.locator(".row:visible .mark.coalesced").count() > 0)
        page.fill("#f-update", "tool_call_update")
        _until(page, lambda p: p.locator(".row:visible").count() == 0)
        page.fill("#f-update", "agent_message_chunk")
        _until(page, lambda p: p.locator(".row:visible .mark.coalesced").count() > 0)
        # A method filter keeps them when it matches session/update.
        page.fill("#f-method", "session/prompt")
        _until(page, lambda p: p.locator(".row:visible").count() == 0)
        page.fill("#f-method", "session/*")
        _until(page, lambda p: p.locator(".row:visible .mark.coalesced").count() > 0)

        def detail_shows_a_merge(p: Any) -> bool:
            # (the list is virtualised: a row element may show another event after a render)
            p.locator(".row:visible", has=p.locator(".mark.coalesced")).first.click()
            return '"event": "coalesced"' in p.inner_text("#detail")

        _until(page, detail_shows_a_merge)
        page.close()
        assert errors == []
