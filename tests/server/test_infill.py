"""Fill-in-the-middle (app/server/core/infill.py): llama-server's /infill and `suffix` on
/v1/completions, on a tiny model trained to fill in (tests/support/fim_model.py) served with prompt
lookup, through llama.vscode's and Continue's own request bodies; a 400 naming the missing tokens
where the model has none (the embedded pair); and the code-completion limits llama.vscode sends
(`n_indent`, `t_max_predict_ms`) and its `infill` sampler stage, on the shared server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlx_lm.utils import load_tokenizer

from app.server.core.infill import plain_tokens
from tests.support.fim_model import GAPS, SHAPES, build_fim_model, fim_tokenizer
from tests.support.server import serve, sse_frames

ADD, MULTIPLY, AREA = GAPS
REFUSAL = (
    "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
    "middle token is missing. The tokenizer has none of the fill-in-the-middle tokens looked for"
)


def infill_body(gap, **extra) -> dict:
    body = {"input_prefix": gap.prefix, "input_suffix": gap.suffix, "prompt": gap.prompt, "input_extra": gap.extra}
    return body | {"temperature": 0, "n_predict": 24} | extra


def llama_vscode(gap) -> dict:
    """llama.vscode's /infill body with its default settings (src/llama-server.ts createRequestPayload):
    its chunks carry a `time` key, which llama-server ignores."""
    chunks = [chunk | {"time": 1733500000000} for chunk in gap.extra]
    return {
        "input_prefix": gap.prefix,
        "input_suffix": gap.suffix,
        "input_extra": chunks,
        "prompt": gap.prompt,
        "n_predict": 128,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "n_indent": 4,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }


def continue_fim(gap) -> dict:
    """Continue's FIM body for an OpenAI-compatible completions endpoint (core/llm/llms/LlamaStack.ts
    `_streamFim`), with its Qwen-coder template's stop tokens (core/autocomplete/templating)."""
    stop = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>"]
    stop += ["<|file_sep|>", "<|im_start|>", "<|im_end|>"]
    body = {"model": "qwen2.5-coder", "prompt": gap.prefix, "suffix": gap.suffix, "max_tokens": 64}
    return body | {"temperature": 0.01, "stop": stop, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The FIM model, speculating with prompt lookup (which drafts from the suffix and the other files)."""
    root = tmp_path_factory.mktemp("fim")
    model = build_fim_model(root / "model")
    with serve(root, "-m", str(model), "--draft-kind", "prompt-lookup") as running:
        yield running


@pytest.mark.slow
def test_infill_fills_in_the_middle_the_suffix_and_the_other_files_ask_for(server) -> None:
    with server.client() as http:
        answers = [http.post("/infill", json=infill_body(gap)).json() for gap in GAPS]
    assert [answer["content"] for answer in answers] == [gap.middle for gap in GAPS]
    assert ADD.prefix == MULTIPLY.prefix  # only the suffix tells the two apart
    assert {answer["stop_type"] for answer in answers} == {"eos"}
    assert "<|fim_middle|>" in answers[0]["prompt"] and "<|file_sep|>shapes.py\n" in answers[2]["prompt"]


@pytest.mark.slow
def test_infill_is_speculated_and_prompt_lookup_drafts_from_the_other_files(server) -> None:
    """The other file's `area(width, height)` is in the prompt's tokens: prompt lookup proposes it
    and the target accepts; the text is the target's own (speculative.n_max 0)."""
    with server.client() as http:
        drafted = http.post("/infill", json=infill_body(AREA)).json()
        alone = http.post("/infill", json=infill_body(AREA, **{"speculative.n_max": 0})).json()
    assert drafted["content"] == alone["content"] == AREA.middle
    assert drafted["timings"]["draft_kind"] == "prompt-lookup"
    assert drafted["timings"]["draft_n_accepted"] > 0
    assert "draft_n" not in alone["timings"]


@pytest.mark.slow
def test_infill_streams_as_completion_does(server) -> None:
    with server.client() as http, http.stream("POST", "/infill", json=infill_body(AREA, stream=True)) as response:
        assert response.status_code == 200
        frames = sse_frames(response)
    assert "".join(frame["content"] for frame in frames) == AREA.middle
    assert frames[-1]["stop"] is True and frames[-1]["stop_type"] == "eos"


@pytest.mark.slow
def test_llama_vscodes_bodies_are_served(server) -> None:
    """Its completion (the infill sampler stage, n_indent, both time limits) and the body it sends
    to warm the cache with the ring's chunks (n_predict 0, an empty chain)."""
    warm = {"input_prefix": "", "input_suffix": "", "input_extra": [SHAPES | {"time": 1}], "prompt": ""}
    warm |= {"n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
    with server.client() as http:
        warmed = http.post("/infill", json=warm)
        answers = [http.post("/infill", json=llama_vscode(gap)).json() for gap in GAPS]
    assert warmed.status_code == 200 and warmed.json()["content"] == ""
    assert [answer["content"] for answer in answers] == [gap.middle for gap in GAPS]
    assert answers[0]["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]


def continue_ollama_fim(gap) -> dict:
    """Continue's autocomplete body for an Ollama provider (core/llm/llms/Ollama.ts `_streamFim`):
    a raw generate with the suffix, its options and keep_alive."""
    options = {"temperature": 0.01, "num_predict": 64, "stop": ["<|endoftext|>", "<|fim_prefix|>", "<|file_sep|>"]}
    body = {"model": "qwen2.5-coder:1.5b", "prompt": gap.prefix, "suffix": gap.suffix, "raw": True}
    return body | {"options": options, "keep_alive": 1800, "stream": True}


def sse_text(response) -> str:
    frames = sse_frames(response)
    return "".join(f["choices"][0]["text"] for f in frames[:-1] if f["choices"])


def ndjson_text(response) -> str:
    lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1]["done"] is True
    return "".join(line["response"] for line in lines)


# Continue's FIM clients: the route, its body, its stream's text, its whole answer's text, and what
# else the whole request sends (Ollama's `system`, which the FIM layout leaves unused)
FIM_CLIENTS = {
    "openai": ("/v1/completions", continue_fim, sse_text, lambda body: body["choices"][0]["text"], {}),
    "ollama": ("/api/generate", continue_ollama_fim, ndjson_text, lambda body: body["response"], {"system": "unused"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("client", FIM_CLIENTS)
def test_continues_fim_bodies_fill_in_through_the_suffix(server, client: str) -> None:
    """Continue's FIM body for an OpenAI-compatible provider (`suffix` on /v1/completions) and for
    Ollama (`suffix` on /api/generate, laid out alike): each gap filled, streamed and not."""
    path, body_of, streamed_text, whole_text, extra = FIM_CLIENTS[client]
    with server.client() as http:
        texts = []
        for gap in (ADD, MULTIPLY):
            with http.stream("POST", path, json=body_of(gap)) as response:
                assert response.status_code == 200
                texts.append(streamed_text(response))
        whole = http.post(path, json=body_of(ADD) | {"stream": False} | extra)
    assert texts == [ADD.middle, MULTIPLY.middle]
    assert whole.status_code == 200 and whole_text(whole.json()) == ADD.middle


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_suffix": "}"}, '"input_prefix" is required'),
        ({"input_prefix": "{"}, '"input_suffix" is required'),
        ({"input_prefix": "{", "input_suffix": "}", "prompt": 5}, '"prompt" must be a string'),
        ({"input_prefix": "{", "input_suffix": "}", "input_extra": {}}, '"input_extra" must be an array'),
        ({"input_prefix": "{", "input_suffix": "}", "input_extra": [{}]}, 'must contain a "text" field'),
        ({"input_prefix": "{", "input_suffix": "}", "input_extra": [{"filename": "ok"}]}, 'a "text" field'),
        ({"input_prefix": "{", "input_suffix": "}", "input_extra": [{"filename": 1, "text": "a"}]}, '"filename"'),
    ],
)
def test_a_malformed_infill_body_answers_llama_servers_400(server, body: dict, message: str) -> None:
    response = server.client().post("/infill", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_a_model_without_fim_tokens_answers_400_naming_them(default_server) -> None:
    """The embedded pair's tokenizer has none: /infill and `suffix` say which tokens are missing."""
    with default_server.client() as http:
        infill = http.post("/infill", json=infill_body(ADD))
        suffixed = http.post("/v1/completions", json={"prompt": "def f(", "suffix": ")\n", "max_tokens": 4})
        plain = http.post("/v1/completions", json={"prompt": "def f(", "suffix": "", "max_tokens": 1})
    for response in (infill, suffixed):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith(REFUSAL)
        assert "<|fim_prefix|>" in error["message"] and "▁<PRE>" in error["message"]
    assert plain.status_code == 200  # an empty suffix asks for no middle


def indent_cut(text: str, n_indent: int) -> str:
    """llama-server's rule, written out: the first line after a new line whose first character
    other than a space or tab is fewer than n_indent columns in ends the text before it."""
    lines = text.split("\n")
    kept = [lines[0]]
    for line in lines[1:]:
        body = line.lstrip(" \t")
        if body and len(line) - len(body) < n_indent:
            kept.append(line[: len(line) - len(body)])
            return "\n".join(kept)
        kept.append(line)
    return text


def test_n_indent_ends_the_text_at_the_first_line_indented_less(default_server) -> None:
    body = {"prompt": "class Stack:\n    def push(self, item):\n", "n_predict": 96, "temperature": 0}
    with default_server.client() as http:
        whole = http.post("/completion", json=body).json()["content"]
        cut = http.post("/completion", json=body | {"n_indent": 8}).json()
    assert indent_cut(whole, 8) != whole, whole  # the model writes a line indented less within 96 tokens
    assert cut["content"] == indent_cut(whole, 8)
    assert cut["stop_type"] == "limit"


def test_t_max_predict_ms_ends_the_text_at_a_new_line(default_server) -> None:
    """Past the limit, a step that brings a new line is the last: the text is a prefix of the
    unlimited one, ended by that step (a time limit, so which new line is not asserted)."""
    body = {"prompt": "def fibonacci(n):\n", "n_predict": 48, "temperature": 0}
    with default_server.client() as http:
        whole = http.post("/completion", json=body).json()
        limited = http.post("/completion", json=body | {"t_max_predict_ms": 1}).json()
    text = limited["content"]
    assert whole["content"].startswith(text)
    assert text == whole["content"] or "\n" in text[text.rfind("\n") - 8 :]
    assert limited["tokens_predicted"] <= whole["tokens_predicted"]


def test_the_infill_sampler_stage_runs_on_any_model(default_server) -> None:
    """llama.vscode's chain: a seeded request gives the same text streamed and not, and the chain is reported."""
    body = {"prompt": "def f(x):", "n_predict": 8, "seed": 5, "samplers": ["top_k", "top_p", "infill"], "top_k": 40}
    with default_server.client() as http:
        whole = http.post("/completion", json=body).json()
        with http.stream("POST", "/completion", json=body | {"stream": True}) as response:
            streamed = "".join(frame["content"] for frame in sse_frames(response))
    assert whole["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]
    assert streamed == whole["content"]


def test_the_fim_model_tokenizer_keeps_fim_spellings_in_code_as_text(tmp_path: Path) -> None:
    """A `<|fim_middle|>` written in the code is text, not the control token (llama-server reads the
    prefix, suffix and files without special tokens)."""
    tokenizer = load_tokenizer(fim_tokenizer(tmp_path / "tokenizer"))
    middle = tokenizer._tokenizer.convert_tokens_to_ids("<|fim_middle|>")
    assert middle in tokenizer.encode("x<|fim_middle|>y", add_special_tokens=False)
    assert middle not in plain_tokens(tokenizer, "x<|fim_middle|>y")
