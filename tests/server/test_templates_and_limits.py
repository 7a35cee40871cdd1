"""Chat templates are sandboxed and bounded, requests cannot bring their own, stop strings are
bounded and held back over SSE (in process: tests/decoding/test_stop_strings.py), and growing
per-request work stays off the event loop."""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path

import jinja2
import pytest

from app.loading import EMBEDDED_TARGET
from app.loading.chat_template import Limits, TemplateLimitError, compile_template, render
from app.profiles import ProfileError, check_models, resolve
from tests.support.cli import mlxcel
from tests.support.server import serve, sse_frames

LIMITS = Limits(timeout_s=0.3, max_chars=1024 * 1024)
NESTED_LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
CODE = "def merge_sorted(left, right):\n    result = []\n"


def render_source(source: str, limits: Limits = LIMITS, **variables) -> str:
    return render(compile_template(source), limits, {"messages": [], **variables})


# --- the sandbox, in process -------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        NESTED_LOOPS,
        "{% for c in 'x' * 1000000 %}{% for d in 'y' * 1000000 %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    ],
)
def test_a_long_render_stops_at_the_deadline(source: str) -> None:
    started = time.monotonic()
    with pytest.raises(TemplateLimitError, match=r"server\.template_timeout_s") as caught:
        render_source(source)
    assert caught.value.key == "server.template_timeout_s"
    assert time.monotonic() - started < LIMITS.timeout_s + 1.5  # slack for a loaded machine


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 300000000 }}",
        "{% set s = 'x' * 300000000 %}",
        "{{ 'x' | center(300000000) }}",
        "{{ 'x'.ljust(300000000) }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{{ 99999 ** 99999 }}",
        "{% for i in range(1000) %}{{ 'x' * 10000 }}{% endfor %}",
    ],
)
def test_huge_values_are_refused_before_they_are_made(source: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(TemplateLimitError, match=r"server\.template_max_chars") as caught:
            render_source(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.key == "server.template_max_chars"
    assert peak < 8 * LIMITS.max_chars  # a few copies of the cap, not the 300 MB asked for


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_python_internals_are_out_of_reach(source: str) -> None:
    try:
        out = render_source(source)
    except jinja2.exceptions.SecurityError:
        return
    except jinja2.exceptions.UndefinedError:
        return
    assert "class" not in out and "module" not in out


def test_the_model_template_renders_as_transformers_renders_it(embedded_target) -> None:
    tokenizer = embedded_target.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a sort."}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ours = render(
        compile_template(tokenizer.chat_template), LIMITS, {"messages": messages, "add_generation_prompt": True}
    )
    assert ours == expected


# --- the server ---------------------------------------------------------------------------------


def chat(http, **extra) -> object:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0} | extra
    return http.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize(
    "key",
    ["chat_template", "return_tensors", "tokenize", "return_dict", "add_generation_prompt", "messages", "eos_token"],
)
def test_template_controls_in_a_request_are_refused(default_server, key: str) -> None:
    value = {"chat_template": "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
             "return_tensors": "np"}.get(key, False)  # fmt: skip
    with default_server.client() as http:
        response = chat(http, chat_template_kwargs={key: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert f"chat_template_kwargs.{key}" in error["message"] and error["type"] == "invalid_request_error"


def test_template_variables_in_a_request_are_passed_on(default_server) -> None:
    with default_server.client() as http:
        assert chat(http, chat_template_kwargs={"enable_thinking": False, "custom": {"a": [1]}}).status_code == 200
        response = chat(http, chat_template_kwargs={"enable_thinking": "no"})
        assert response.status_code == 400 and "enable_thinking" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("stop", "limit"),
    [([f"s{i}" for i in range(17)], "server.max_stop_strings"), (["x" * 257], "server.max_stop_len")],
)
def test_stop_strings_beyond_the_limits_are_refused(default_server, stop: list[str], limit: str) -> None:
    with default_server.client() as http:
        response = http.post("/completion", json={"prompt": CODE, "n_predict": 4, "stop": stop})
    assert response.status_code == 400 and limit in response.json()["error"]["message"]


def test_a_streamed_completion_never_leaks_part_of_a_stop_string(default_server) -> None:
    body = {"prompt": CODE, "n_predict": 40, "temperature": 0, "return_tokens": True}
    with default_server.client() as http:
        free = http.post("/completion", json=body).json()
        text = free["content"]
        stop = text[12:22]
        assert text.find(stop) == 12
        with http.stream("POST", "/completion", json=body | {"stream": True, "stop": [stop]}) as response:
            frames = list(sse_frames(response))
    chunks = [frame["content"] for frame in frames]
    assert "".join(chunks) == text[:12]
    assert frames[-1]["stop_type"] == "word" and frames[-1]["stopping_word"] == stop


@pytest.mark.parametrize(("stop", "stop_type"), [("rge_sort(left, ri", "word"), ("merge_sort(right", "limit")])
def test_streamed_text_equals_the_non_streamed_text_with_a_stop_string(default_server, stop, stop_type) -> None:
    """Held-back text goes out once the match completes (cut) or fails (released), never twice."""
    body = {"prompt": CODE, "n_predict": 40, "temperature": 0, "stop": [stop]}
    with default_server.client() as http:
        whole = http.post("/completion", json=body).json()
        with http.stream("POST", "/completion", json=body | {"stream": True}) as response:
            frames = list(sse_frames(response))
    assert whole["stop_type"] == frames[-1]["stop_type"] == stop_type
    assert "".join(frame["content"] for frame in frames) == whole["content"]
    assert "merge_sort(left" in whole["content"] if stop_type == "limit" else whole["content"].endswith("me")


def test_health_answers_while_a_megabyte_is_tokenized_with_pieces(default_server) -> None:
    content = "def f(x):\n    return x\n" * 43000  # about 1 MB
    took: list[float] = []

    def tokenize() -> None:
        with default_server.client() as http:
            started = time.monotonic()
            response = http.post("/tokenize", json={"content": content, "with_pieces": True})
            took.append(time.monotonic() - started)
            assert response.status_code == 200

    worker = threading.Thread(target=tokenize)
    latencies = []
    with default_server.client() as http:
        worker.start()
        time.sleep(0.2)
        while worker.is_alive():
            started = time.monotonic()
            assert http.get("/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
    worker.join()
    assert took and took[0] > 1.0 and len(latencies) >= 5
    assert max(latencies) < min(0.5, took[0] / 4), (max(latencies), took[0])


# --- the operator's template ----------------------------------------------------------------


def profile_with_template(tmp_path: Path, template: str | None, extra: str = "") -> Path:
    if template is not None:
        (tmp_path / "chat.jinja").write_text(template)
    path = tmp_path / "templated.toml"
    path.write_text(
        f'target = "{EMBEDDED_TARGET}"\n[drafter]\nkind = "none"\n[server]\nchat_template_file = "chat.jinja"\n{extra}'
    )
    return path


@pytest.mark.parametrize(
    ("template", "message"),
    [(None, "server.chat_template_file: cannot read"), ("{% for x in %}", "server.chat_template_file: ")],
)
def test_a_missing_or_broken_operator_template_is_a_profile_error(tmp_path: Path, template, message: str) -> None:
    path = profile_with_template(tmp_path, template)
    with pytest.raises(ProfileError, match=message):
        check_models(resolve(str(path)).settings)
    result = mlxcel("profiles", "check", str(path))
    assert result.returncode == 2 and message in result.stderr and str(tmp_path / "chat.jinja") in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_operator_template_is_used_and_bounded(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if messages[0].content == 'spin' %}" + NESTED_LOOPS + "{% endif %}ASSISTANT:"
    )
    path = profile_with_template(tmp_path, template, "template_timeout_s = 0.5\n")
    with serve(tmp_path, "--profile", str(path)) as server, server.client() as http:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        assert http.post("/apply-template", json=body).json()["prompt"] == "[user] hi\nASSISTANT:"
        spin = {"messages": [{"role": "user", "content": "spin"}], "max_tokens": 2}
        outcome: list = []

        def spin_request() -> None:
            with server.client() as own:
                outcome.append(own.post("/v1/chat/completions", json=spin))

        worker = threading.Thread(target=spin_request)
        worker.start()
        time.sleep(0.1)
        started = time.monotonic()
        assert http.get("/health").status_code == 200
        assert time.monotonic() - started < 0.25  # the render runs on a thread, not the event loop
        worker.join()
        assert outcome[0].status_code == 400
        assert "server.template_timeout_s" in outcome[0].json()["error"]["message"]
