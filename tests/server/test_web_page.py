"""The chat page at `/` in a real browser (headless Chromium over its DevTools pipe): Enter sends,
it streams an answer from /v1/chat/completions and shows what speculation did (the accepted drafts
tinted in the text, the speed-up against the target alone, what "biased" means), Stop ends an
answer, and the page has its icon; answers render as Markdown (never as HTML), copy, a system
prompt goes first, New chat forgets the conversation, max tokens takes whole numbers only and a
refused request is said in the page's words. MLXCEL_WRITE_SCREENSHOT=1 writes the screenshot to
docs/web-page.png (committed) instead of the test's folder."""

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


def type_and_press_enter(browser: Browser, text: str) -> None:
    browser.evaluate(f"const p = document.getElementById('prompt'); p.value = {text!r}; p.focus()")
    browser.press("Enter", 13)


@needs_chromium
@pytest.mark.slow
def test_the_page_streams_an_answer_and_charts_the_rounds(default_server, browser: Browser, tmp_path: Path) -> None:
    browser.goto(f"{default_server.url}/")
    browser.wait_for("document.getElementById('model').textContent.includes('target')")
    type_and_press_enter(browser, QUESTION)  # Enter sends
    browser.wait_for("document.querySelector('.answer[data-measured]')")
    shown = browser.evaluate("""(() => {
        const answer = document.querySelector('.answer');
        const charts = [...answer.querySelectorAll('figure.chart')].map(f =>
            [...f.querySelectorAll('rect.bar')].map(r => Number(r.dataset.value)));
        const facts = Object.fromEntries([...answer.querySelectorAll('.facts > span')].map(s =>
            [s.firstChild.textContent.trim(), s.querySelector('b').textContent]));
        return {done: answer.dataset.done, text: answer.querySelector('.text').textContent,
                rule: answer.querySelector('.rule b').textContent, mode: answer.querySelector('.mode b').textContent,
                tps: Number(answer.querySelector('.tps b').textContent), charts, facts,
                tinted: answer.querySelectorAll('.text .drafted').length,
                ratio: Number(answer.querySelector('.speedup').dataset.ratio),
                speedup: answer.querySelector('.speedup').textContent,
                legend: document.getElementById('legend').textContent,
                prompt: document.getElementById('prompt').value};
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
    # the charts count the page's own rounds: the same text, but a second request's rounds may
    # differ, each row's width following the server's measured prices (app/decoding/width.py)
    assert sum(lengths) == int(shown["facts"]["rounds"]) > 0 and len(per_position) == 4
    assert all(0 <= share <= 1 for share in per_position)
    assert shown["prompt"] == ""  # sent, not a new line
    # every accepted draft tinted, one per token frame: as many as the answer accepted
    assert shown["tinted"] == int(shown["facts"]["drafted / accepted"].split(" / ")[1]) > 0
    assert spec["accepted"] > 0
    assert shown["ratio"] > 0 and "× (target alone " in shown["speedup"]
    assert "biased" in shown["legend"] and "greedy path" in shown["legend"]
    icon = browser.evaluate("fetch('/favicon.ico').then(r => r.status + ' ' + r.headers.get('content-type'))")
    assert icon == "200 image/svg+xml"
    assert browser.evaluate("document.querySelector('link[rel=icon]').getAttribute('href')") == "/favicon.ico"
    shot = ROOT / "docs" / "web-page.png" if os.environ.get("MLXCEL_WRITE_SCREENSHOT") else tmp_path / "page.png"
    browser.screenshot(shot)
    assert shot.read_bytes().startswith(b"\x89PNG")


@needs_chromium
@pytest.mark.slow
def test_stop_ends_an_answer_and_its_row(default_server, browser: Browser) -> None:
    """Stop aborts the stream; the server ends the row of a client that left, and the page keeps
    what came and takes the next question."""
    browser.goto(f"{default_server.url}/")
    browser.evaluate("document.getElementById('max-tokens').value = 3000")
    send(browser, QUESTION)
    browser.wait_for("document.querySelector('.answer .text').textContent.length > 20")
    assert browser.evaluate("document.getElementById('stop').hidden") is False
    browser.evaluate("document.getElementById('stop').click()")
    browser.wait_for("document.querySelector('.answer[data-done=\"stopped\"]')")
    assert browser.evaluate("document.getElementById('stop').hidden") is True
    default_server.wait_idle(30)  # the row went with its client
    browser.evaluate("document.getElementById('max-tokens').value = 4")
    send(browser, "hi")
    browser.wait_for("document.querySelectorAll('.answer[data-done=\"true\"]').length === 1")


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


MARKDOWN = (
    "# Title\n\nSome **bold** and `code` <img src=x onerror=\"document.title='owned'\">\n\n"
    "```python\nprint('<b>hi</b>')\n```\n- one\n- two\n\n1. first\n\n> quoted"
)


@needs_chromium
@pytest.mark.slow
def test_markdown_renders_as_text_nodes_with_the_drafts_tinted(default_server, browser: Browser) -> None:
    """The page's renderer on a hostile answer: blocks and inline styles become elements, the
    answer's HTML stays text (no element made, nothing run), and the characters of accepted
    drafts (here `bold`) are tinted inside the rendering."""
    browser.goto(f"{default_server.url}/")
    source = MARKDOWN
    start = source.index("bold")
    shown = browser.evaluate(f"""(() => {{
        const source = {source!r};
        const drafted = [...source].map((_, i) => i >= {start} && i < {start + 4});
        const root = renderMarkdown(source, drafted);
        document.body.appendChild(root);
        return {{heading: root.querySelector('h3').textContent, strong: root.querySelector('p strong').textContent,
                 code: root.querySelector('p code').textContent, images: root.querySelectorAll('img').length,
                 block: root.querySelector('pre code').textContent,
                 language: root.querySelector('pre code').dataset.language,
                 items: [...root.querySelectorAll('ul li')].map(li => li.textContent),
                 ordered: root.querySelectorAll('ol li').length, quote: root.querySelector('blockquote').textContent,
                 tinted: [...root.querySelectorAll('.drafted')].map(s => s.textContent),
                 html: root.querySelector('p').textContent, copies: root.querySelectorAll('.code button.copy').length,
                 title: document.title}};
    }})()""")
    assert shown["heading"] == "Title" and shown["strong"] == "bold" and shown["code"] == "code"
    assert shown["images"] == 0 and "<img src=x" in shown["html"] and shown["title"] == "mlxcel"
    assert shown["block"] == "print('<b>hi</b>')" and shown["language"] == "python" and shown["copies"] == 1
    assert shown["items"] == ["one", "two"] and shown["ordered"] == 1 and shown["quote"] == "quoted"
    assert shown["tinted"] == ["bold"]


@needs_chromium
@pytest.mark.slow
def test_system_prompt_copy_new_chat_and_the_settings_checks(default_server, browser: Browser) -> None:
    url = default_server.url
    browser.goto(f"{url}/")
    browser.send("Browser.grantPermissions", permissions=["clipboardReadWrite", "clipboardSanitizedWrite"], origin=url)
    browser.send("Emulation.setFocusEmulationEnabled", session=True, enabled=True)  # the clipboard needs a focused page
    browser.evaluate("""window.sent = []; const f = window.fetch;
        window.fetch = (u, o) => {
            if (o && o.body && u === '/v1/chat/completions') window.sent.push(JSON.parse(o.body));
            return f(u, o);
        }""")
    browser.evaluate("document.getElementById('system').value = 'Answer in Python.'")
    browser.evaluate("document.getElementById('max-tokens').value = '2.5'")
    send(browser, QUESTION)  # a decimal is refused by the page, in its words, and nothing is sent
    assert browser.evaluate("document.getElementById('settings-error').textContent") == (
        "max tokens must be a whole number, 1 or more"
    )
    nothing_sent = "[document.querySelectorAll('.turn').length, document.getElementById('prompt').value]"
    assert browser.evaluate(nothing_sent) == [0, QUESTION]
    browser.evaluate("document.getElementById('max-tokens').value = '16'")
    browser.evaluate("document.getElementById('send').click()")
    browser.wait_for("document.querySelector('.answer[data-measured]') && !document.getElementById('send').disabled")
    shown = browser.evaluate("""(() => {
        const answer = document.querySelector('.answer');
        return {error: document.getElementById('settings-error').textContent,
                raw: answer.querySelector('.text').textContent, rawHidden: answer.querySelector('.text').hidden,
                rendered: answer.querySelector('.markdown').textContent,
                first: window.sent[0].messages, max: window.sent[0].max_tokens};
    })()""")
    assert shown["error"] == "" and shown["max"] == 16
    assert shown["first"] == [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": QUESTION}]
    assert shown["rawHidden"] is True and shown["raw"].strip()
    words = shown["raw"].replace("`", "").replace("*", "").replace("#", "").split()
    assert all(word in shown["rendered"] for word in words)  # the rendering keeps the answer's words
    browser.evaluate("document.querySelector('.answer .tools button.copy').click()")
    browser.wait_for("document.querySelector('.answer .tools button.copy').textContent !== 'Copy'")
    assert browser.evaluate("document.querySelector('.answer .tools button.copy').textContent") == "Copied"
    assert browser.evaluate("navigator.clipboard.readText()") == shown["raw"]
    browser.evaluate("document.querySelector('.answer .tools button.raw').click()")
    views = "[document.querySelector('.answer .text').hidden, document.querySelector('.markdown').hidden]"
    assert browser.evaluate(views) == [False, True]  # Raw shows the tinted text instead
    browser.evaluate("document.getElementById('new-chat').click()")
    assert browser.evaluate("document.querySelectorAll('.turn').length") == 0
    browser.evaluate("document.getElementById('temperature').value = '1e39'")  # finite here, not in float32
    send(browser, "hi")
    browser.wait_for("document.querySelector('.answer[data-done]')")
    refused = browser.evaluate("""(() => ({text: document.querySelector('.answer .text').textContent,
        said: document.querySelector('.answer .server-said').textContent,
        sent: window.sent[window.sent.length - 1].messages}))()""")
    assert refused["sent"] == [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": "hi"}]
    assert refused["text"].startswith("The server did not accept this request")
    assert "must be within" not in refused["text"]  # the server's own words only under "the server said"
    assert "temperature must be within" in refused["said"]


@pytest.mark.parametrize("on", [True, False])
def test_server_web_ui_turns_the_page_off(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setenv("MLXCEL_SERVER__WEB_UI", str(on).lower())
    client = TestClient(create_app(Engine(resolve("default").settings)))  # no lifespan: no model loads
    page = client.get("/")
    if on:
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/v1/chat/completions" in page.text and "<script src" not in page.text  # nothing fetched elsewhere
        icon = client.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg ")
    else:
        assert page.status_code == 404 and page.json()["error"]["type"] == "not_found_error"
        assert client.get("/favicon.ico").status_code == 404
