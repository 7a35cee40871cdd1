"""What other clients send by default, served: SillyTavern's text-completion body (an empty
`grammar` is no grammar), the llama.cpp web UI's short `samplers` list with penalties, DRY and XTC
turned on, a list naming stages of older llama-server builds (`tfs_z`, `typical_p`), a custom
order, and llama-server's `id_slot` hint; each streamed and not, on the shared (speculative) server.
"""

from __future__ import annotations

import msgspec
import pytest

# SillyTavern's llama.cpp text-completion body with its default settings (no grammar set: "")
SILLYTAVERN = {
    "prompt": "### Instruction:\nSay hello.\n### Response:\n", "model": "", "max_new_tokens": 8, "max_tokens": 8,
    "temperature": 0.7, "top_p": 0.5, "typical_p": 1, "typical": 1, "min_p": 0, "repetition_penalty": 1.2,
    "frequency_penalty": 0, "presence_penalty": 0, "top_k": 40, "skew": 0, "min_length": 0, "min_tokens": 0,
    "num_beams": 1, "length_penalty": 1, "early_stopping": False, "add_bos_token": True, "smoothing_factor": 0,
    "smoothing_curve": 1, "dry_allowed_length": 2, "dry_multiplier": 0, "dry_base": 1.75,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "dry_penalty_last_n": 0, "max_tokens_second": 0,
    "stopping_strings": ["\n### Instruction:"], "stop": ["\n### Instruction:"], "truncation_length": 8192,
    "ban_eos_token": False, "skip_special_tokens": True, "include_reasoning": True, "top_a": 0, "tfs": 1,
    "mirostat_mode": 0, "mirostat_tau": 5, "mirostat_eta": 0.1, "xtc_threshold": 0.1, "xtc_probability": 0,
    "nsigma": 0, "top_n_sigma": 0, "min_keep": 0, "api_type": "llamacpp", "n_predict": 8, "repeat_penalty": 1.2,
    "repeat_last_n": 0, "tfs_z": 1, "mirostat": 0, "ignore_eos": False, "rep_pen_slope": 1, "grammar": "",
    "cache_prompt": True, "seed": 7,
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "tfs_z", "typical_p", "top_p", "min_p", "xtc",
                 "temperature"],
}  # fmt: skip
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "seed": 7}
# the web UI's samplers setting, a user's short list, with the stages it leaves out turned on
SHORT_LIST = ["top_k", "typ_p", "top_p", "min_p", "temperature"]
BODIES = {
    "sillytavern": ("/completion", SILLYTAVERN),
    "sillytavern-openai": ("/v1/completions", SILLYTAVERN),
    "short-list-penalties": ("/v1/chat/completions", CHAT | {"samplers": SHORT_LIST, "repeat_penalty": 1.1}),
    "short-list-dry-xtc": (
        "/v1/chat/completions",
        CHAT | {"samplers": SHORT_LIST, "dry_multiplier": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.1},
    ),
    "short-string": (
        "/completion",
        {"prompt": "def f():", "n_predict": 6, "seed": 7, "samplers": "kypmt", "repeat_penalty": 1.3},
    ),
    "tfs_z": (
        "/completion",
        {"prompt": "def f():", "n_predict": 6, "seed": 7, "samplers": ["top_k", "tfs_z", "temperature"]},
    ),
    "custom-order": (
        "/v1/chat/completions",
        CHAT | {"samplers": ["temperature", "min_p", "top_k", "xtc", "penalties"], "xtc_probability": 0.3},
    ),
    "id_slot": ("/completion", {"prompt": "def f():", "n_predict": 6, "seed": 7, "id_slot": 0}),
}


def streamed_text(http, path: str, body: dict) -> str:
    with http.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200, response.read()
        frames = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [msgspec.json.decode(frame) for frame in frames if frame != "[DONE]"]
    if path == "/completion":
        return "".join(chunk["content"] for chunk in chunks)
    if path == "/v1/completions":
        return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def whole_text(path: str, answer: dict) -> str:
    if path == "/completion":
        return answer["content"]
    if path == "/v1/completions":
        return answer["choices"][0]["text"]
    return answer["choices"][0]["message"]["content"]


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_clients_default_body_is_served_streamed_and_not(default_server, name: str) -> None:
    """200 both ways, and the same text (the seed fixes both: the chain runs the same each time)."""
    path, body = BODIES[name]
    with default_server.client() as http:
        answer = http.post(path, json=body)
        assert answer.status_code == 200, answer.text
        assert streamed_text(http, path, body) == whole_text(path, answer.json())


def test_the_chain_a_request_names_is_reported(default_server) -> None:
    """generation_settings.samplers is the chain that ran, as llama-server reports it: the names it
    knows, in the request's order, the others left out."""
    body = {"prompt": "def f():", "n_predict": 1, "samplers": ["min_p", "tfs_z", "temperature", "top_k"]}
    answer = default_server.client().post("/completion", json=body).json()
    assert answer["generation_settings"]["samplers"] == ["min_p", "temperature", "top_k"]


def test_an_empty_grammar_is_no_grammar(default_server) -> None:
    """As llama-server, `grammar: ""` asks for nothing: the text is the unconstrained one."""
    body = {"prompt": "def f():", "n_predict": 8, "seed": 3, "temperature": 0}
    with default_server.client() as http:
        plain = http.post("/completion", json=body).json()["content"]
        empty = http.post("/completion", json=body | {"grammar": ""})
    assert empty.status_code == 200, empty.text
    assert empty.json()["content"] == plain


def test_an_empty_json_schema_beside_a_grammar_is_no_schema(default_server) -> None:
    """SillyTavern 2024 sends `json_schema: {}` beside `grammar: ""`: llama-server reads json_schema
    only without a grammar field, so the reply is the unconstrained text, not JSON."""
    body = {"prompt": "def f():", "n_predict": 8, "temperature": 0}
    with default_server.client() as http:
        plain = http.post("/completion", json=body).json()["content"]
        both = http.post("/completion", json=body | {"grammar": "", "json_schema": {}}).json()["content"]
        alone = http.post("/completion", json=body | {"json_schema": {}}).json()["content"]
    assert both == plain and not plain.lstrip().startswith(("{", "[", '"'))
    assert alone != plain  # alone, an empty schema still asks for JSON, as llama-server reads it


def test_a_new_turn_and_a_continued_one_together_are_a_400(default_server) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    body = {"messages": messages, "max_tokens": 2, "continue_final_message": True}
    with default_server.client() as http:
        refused = http.post("/v1/chat/completions", json=body | {"add_generation_prompt": True})
        continued = http.post("/v1/chat/completions", json=body)  # left out: a continued turn, served
        explicit = http.post("/v1/chat/completions", json=body | {"add_generation_prompt": False})
    assert refused.status_code == 400 and "add_generation_prompt" in refused.json()["error"]["message"]
    assert continued.status_code == 200 and explicit.status_code == 200


def test_a_schema_with_items_and_no_type_is_an_array(default_server) -> None:
    """llama.cpp's converter reads `items` without `type` as an array's schema."""
    schema = {"items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 3}
    body = {"prompt": "Numbers: ", "n_predict": 16, "temperature": 0, "json_schema": schema}
    answer = default_server.client().post("/completion", json=body).json()["content"]
    found = msgspec.json.decode(answer)
    assert isinstance(found, list) and 2 <= len(found) <= 3 and all(0 <= n <= 9 for n in found)
