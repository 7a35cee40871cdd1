"""Log-probabilities over real HTTP: OpenAI's `logprobs` (through the openai client) and
llama-server's `n_probs` / `post_sampling_probs`, target-only and under speculation.

The reference row is computed in process with the embedded target: one forward over the prompt
and the decided tokens, log-softmax of each decided position's logits.
"""

from __future__ import annotations

import math
from collections import defaultdict

import mlx.core as mx
import openai
import pytest

from app.execution.runner import ModelRunner
from tests.support.server import sse_frames

PROMPT = "def fibonacci(n):"
GREEDY = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "n_probs": 3, "return_tokens": True}
# A forward over many positions and single steps reduce in different orders on the CPU: rows agree
# to float32 rounding, not bit for bit (the server's own speculative and target-only rows do agree
# bit for bit, below).
REFERENCE_TOLERANCE = 2e-5  # measured: 6e-6


def reference_logprobs(target, prompt: list[int], tokens: list[int]) -> list[float]:
    """The target's log-softmax at each decided position, for the token decided there."""
    logits = ModelRunner(target.model).forward(prompt + tokens[:-1])[len(prompt) - 1 :].astype(mx.float32)
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.take_along_axis(rows, mx.array(tokens)[:, None], axis=-1)[:, 0].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_native_n_probs_are_the_targets_rows(default_server, embedded_target, temperature) -> None:
    """Under speculation, at T = 0 (argmax rule) and T > 0 (the profile's sampled rule) alike."""
    ask = GREEDY | {"temperature": temperature, "seed": 5}
    body = default_server.client().post("/completion", json=ask).json()
    entries = body["completion_probabilities"]
    assert [e["id"] for e in entries] == body["tokens"]
    for entry in entries:
        assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert entry["logprob"] <= 0.0
        top = entry["top_logprobs"]
        assert len(top) == 3 and all(set(t) == {"id", "token", "bytes", "logprob"} for t in top)
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert sum(math.exp(t["logprob"]) for t in top) <= 1.0 + 1e-6
        assert bytes(entry["bytes"]).decode("utf-8", errors="ignore") == entry["token"]
        if temperature == 0.0:
            assert top[0]["id"] == entry["id"]  # greedy: the decided token is the model's argmax
    prompt = embedded_target.tokenizer.encode(PROMPT)
    reference = reference_logprobs(embedded_target, prompt, body["tokens"])
    assert [e["logprob"] for e in entries] == pytest.approx(reference, abs=REFERENCE_TOLERANCE)


def test_speculative_rows_equal_target_only_rows_at_t0(default_server, target_only_server) -> None:
    """An accepted draft carries the target's row from the verify forward, not the drafter's."""
    speculative = default_server.client().post("/completion", json=GREEDY).json()
    alone = target_only_server.client().post("/completion", json=GREEDY).json()
    assert speculative["timings"]["draft_n_accepted"] > 0  # drafts were accepted in this run
    assert speculative["completion_probabilities"] == alone["completion_probabilities"]


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["mtp", "prompt-lookup"])
def test_other_drafters_rows_equal_target_only_rows_at_t0(profile_server, target_only_server, profile) -> None:
    """A block drafter (its target forward runs under its hook) and prompt lookup (no q rows)."""
    ask = GREEDY | {"n_predict": 24}
    speculative = profile_server(profile).client().post("/completion", json=ask).json()
    alone = target_only_server.client().post("/completion", json=ask).json()
    assert speculative["timings"]["draft_n_accepted"] > 0
    assert speculative["completion_probabilities"] == alone["completion_probabilities"]


def test_streamed_probabilities_equal_the_body(default_server) -> None:
    client = default_server.client()
    whole = client.post("/completion", json=GREEDY).json()
    with client.stream("POST", "/completion", json=GREEDY | {"stream": True}) as response:
        frames = sse_frames(response)
    streamed = [e for f in frames[:-1] for e in f.get("completion_probabilities", [])]
    assert streamed == whole["completion_probabilities"]
    assert "completion_probabilities" not in frames[-1]  # as llama-server: the last frame repeats none


def test_post_sampling_probs_are_the_samplers_row(target_only_server) -> None:
    client = target_only_server.client()
    sampled = {"n_probs": 40, "post_sampling_probs": True, "temperature": 0.7, "top_k": 40, "seed": 11}
    body = client.post("/completion", json=GREEDY | sampled).json()
    for entry in body["completion_probabilities"]:
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"}
        probs = [t["prob"] for t in entry["top_probs"]]
        assert 0.0 < entry["prob"] <= 1.0 and entry["id"] in [t["id"] for t in entry["top_probs"]]
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)  # every candidate the sampler kept
    greedy = client.post("/completion", json=GREEDY | {"post_sampling_probs": True}).json()
    assert all(e["prob"] == 1.0 and len(e["top_probs"]) == 1 for e in greedy["completion_probabilities"])


def test_openai_chat_logprobs_streamed_and_not(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    ask = {
        "model": "target",
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == whole.choices[0].message.content
    assert all(e.logprob <= 0.0 and len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in content)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    plain = client.chat.completions.create(**(ask | {"logprobs": False, "top_logprobs": None}))
    assert plain.choices[0].logprobs is None


def test_openai_completion_logprobs(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    result = client.completions.create(model="target", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    logprobs = result.choices[0].logprobs
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert logprob <= 0.0 and top[token] == logprob and len(top) <= 3
    chunks = list(
        client.completions.create(model="target", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2, stream=True)
    )
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert [o for part in parts for o in part.text_offset] == logprobs.text_offset  # offsets run on across chunks
    assert [lp for part in parts for lp in part.token_logprobs] == logprobs.token_logprobs


@pytest.mark.parametrize(
    ("route", "fields", "message"),
    [
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs requires logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs must be within"),
        ("/v1/completions", {"logprobs": 6}, "logprobs must be within [0, 5]"),
        ("/completion", {"n_probs": -1}, "n_probs must be within [0, 1000]"),
        ("/completion", {"n_probs": 1001}, "n_probs must be within [0, 1000]"),
        ("/completion", {"post_sampling_probs": True}, "post_sampling_probs needs n_probs"),
        ("/v1/completions", {"echo": True, "n_probs": 2}, "echo with logprobs is not supported"),
    ],
)
def test_bad_logprob_fields_answer_400(target_only_server, route, fields, message) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "hi"}
    response = target_only_server.client().post(route, json=body | {"max_tokens": 2} | fields)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_every_choice_of_a_prompt_list_has_its_own_logprobs(default_server) -> None:
    """Prompts × n with logprobs: each choice's entries are its own tokens, its `text_offset` runs
    in its own text from 0, and a stream's chunks carry only their choice's entries."""
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    ask = {"model": "target", "prompt": [PROMPT, "class Stack:\n"], "n": 2, "max_tokens": 6, "logprobs": 2}
    ask |= {"temperature": 0.7, "seed": 21}
    whole = client.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    for choice in whole.choices:
        logprobs = choice.logprobs
        assert "".join(logprobs.tokens) == choice.text
        assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    streamed = defaultdict(list)
    for chunk in client.completions.create(**ask, stream=True):
        choice = chunk.choices[0]
        if choice.logprobs is not None:
            assert "".join(choice.logprobs.tokens) == choice.text  # only this chunk's own tokens
            streamed[choice.index].append(choice.logprobs)
    for index, choice in enumerate(whole.choices):
        parts = streamed[index]
        assert [o for part in parts for o in part.text_offset] == choice.logprobs.text_offset
        assert [lp for part in parts for lp in part.token_logprobs] == choice.logprobs.token_logprobs

    with pytest.raises(openai.BadRequestError, match="echo with logprobs is not supported"):
        client.completions.create(**(ask | {"echo": True}))


def test_logprobs_under_a_grammar(default_server, embedded_target) -> None:
    """The default row stays the model's unmasked one for every token, forced ones included (no
    jump-forward when log-probabilities are asked); post_sampling_probs is the masked row."""
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    ask = GREEDY | {"json_schema": schema, "n_predict": 20}
    body = default_server.client().post("/completion", json=ask).json()
    entries = body["completion_probabilities"]
    assert body["content"] in ('{"a":"x"}', '{"a":"y"}') and [e["id"] for e in entries] == body["tokens"]
    reference = reference_logprobs(embedded_target, embedded_target.tokenizer.encode(PROMPT), body["tokens"])
    assert [e["logprob"] for e in entries] == pytest.approx(reference, abs=REFERENCE_TOLERANCE)
    sampled = {"post_sampling_probs": True, "temperature": 0.7, "seed": 2, "n_probs": 5}
    masked = default_server.client().post("/completion", json=ask | sampled).json()
    assert masked["content"] in ('{"a":"x"}', '{"a":"y"}')
    for entry in masked["completion_probabilities"]:
        assert 0.0 < entry["prob"] <= 1.0
        assert sum(t["prob"] for t in entry["top_probs"]) <= 1.0 + 1e-6
    forced = [e for e in masked["completion_probabilities"] if e["token"] in ('{"', "{", '"a', '":"', '"}')]
    assert forced and all(e["prob"] == pytest.approx(1.0) for e in forced)  # the mask allows only it
