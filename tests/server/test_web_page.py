"""The chat page at `/` in a real browser (headless Chromium over its DevTools pipe): it streams
an answer from /v1/chat/completions and shows what speculation did. MLXCEL_WRITE_SCREENSHOT=1
writes the screenshot to docs/web-page.png (committed) instead of the test's folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from litestar.testing import TestClient

from app.engine.engine import Engine
from app.profiles import resolve
from app.server.app import create_app
from tests.support import ROOT
from tests.support.browser import CHROMIUM, Browser
from tests.support.server import API_KEY

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: run .ci/ensure-chromium (make test does)")
QUESTION = "Write a function that adds two numbers"


@pytest.fixture
def browser(tmp_path: Path):
    opened = Browser(tmp_path / "chromium-profile")
    yield opened
    opened.close()


def send(browser: Browser, text: str) -> None:
    browser.evaluate(f"document.getElementById('prompt').value = {text!r}; document.getElementById('send').click()")


@needs_chromium
@pytest.mark.slow
def test_the_page_streams_an_answer_and_charts_the_rounds(default_server, browser: Browser, tmp_path: Path) -> None:
    browser.goto(f"{default_server.url}/")
    browser.wait_for("document.getElementById('model').textContent.includes('target')")
    send(browser, QUESTION)
    browser.wait_for("document.querySelector('.answer[data-done]')")
    shown = browser.evaluate("""(() => {
        const answer = document.querySelector('.answer');
        const charts = [...answer.querySelectorAll('figure.chart')].map(f =>
            [...f.querySelectorAll('rect.bar')].map(r => Number(r.dataset.value)));
        return {done: answer.dataset.done, text: answer.querySelector('.text').textContent,
                rule: answer.querySelector('.rule b').textContent, mode: answer.querySelector('.mode b').textContent,
                tps: Number(answer.querySelector('.tps b').textContent), charts};
    })()""")
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 128, "temperature": 0,
            "speculative_diagnostics": True}  # fmt: skip
    want = default_server.client().post("/v1/chat/completions", json=body)
    assert shown["done"] == "true" and shown["text"] == want.json()["choices"][0]["message"]["content"]
    assert shown["rule"] == want.headers["x-mlxcel-acceptance-rule"] == "greedy-argmax"
    assert shown["mode"] == "exact" and shown["tps"] > 0
    lengths, per_position = shown["charts"]
    spec = want.json()["timings"]["speculative"]
    assert len(lengths) == len(spec["accepted_lengths"]) == 5  # rounds that accepted 0..4 of the 4 drafts
    assert sum(lengths) == spec["rounds"] and len(per_position) == 4
    assert all(0 <= share <= 1 for share in per_position)
    shot = ROOT / "docs" / "web-page.png" if os.environ.get("MLXCEL_WRITE_SCREENSHOT") else tmp_path / "page.png"
    browser.screenshot(shot)
    assert shot.read_bytes().startswith(b"\x89PNG")


@needs_chromium
@pytest.mark.slow
def test_behind_a_key_the_page_asks_for_it(keyed_server, browser: Browser) -> None:
    browser.goto(f"{keyed_server.url}/")  # the page itself is public; what it calls is not
    assert browser.evaluate("document.getElementById('key-label').hidden") is True
    send(browser, "hi")
    browser.wait_for("document.querySelector('.answer[data-done]')")
    assert browser.evaluate("document.querySelector('.answer .text').textContent") == "Invalid API Key"
    assert browser.evaluate("document.getElementById('key-label').hidden") is False
    browser.evaluate(
        f"document.getElementById('key').value = {API_KEY!r}; document.getElementById('max-tokens').value = 4"
    )
    send(browser, "hi")
    browser.wait_for("document.querySelectorAll('.answer[data-done=\"true\"]').length === 1")
    assert browser.evaluate("document.querySelector('.answer[data-done=\"true\"] .rule b').textContent") == "none"


@pytest.mark.parametrize("on", [True, False])
def test_server_web_ui_turns_the_page_off(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setenv("MLXCEL_SERVER__WEB_UI", str(on).lower())
    client = TestClient(create_app(Engine(resolve("default").settings)))  # no lifespan: no model loads
    page = client.get("/")
    if on:
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/v1/chat/completions" in page.text and "<script src" not in page.text  # nothing fetched elsewhere
    else:
        assert page.status_code == 404 and page.json()["error"]["type"] == "not_found_error"
