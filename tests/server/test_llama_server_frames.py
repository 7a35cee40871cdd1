"""Stream frames and errors as llama-server sends them (cases of llama.cpp's own server suite,
written as our tests): one token per frame even while drafting, live counters on native frames,
the context-overflow error's type and counts. The default profile drafts with a draft model, so
its rounds hold several tokens."""

from __future__ import annotations

import openai

from tests.support.server import sse_frames

PROMPT = "def fibonacci(n):"


def test_a_drafted_stream_sends_one_token_per_frame_with_live_counts(default_server) -> None:
    body = {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "n_probs": 2, "return_tokens": True}
    with default_server.client() as http:
        whole = http.post("/completion", json=body).json()
        assert whole["timings"]["draft_n_accepted"] > 0  # rounds accepted drafts: several tokens each
        with http.stream("POST", "/completion", json=body | {"stream": True}) as response:
            *partial, last = sse_frames(response)
    assert [len(frame["tokens"]) for frame in partial] == [1] * len(partial)  # llama-server's shape
    assert [len(frame["completion_probabilities"]) for frame in partial] == [1] * len(partial)
    assert [frame["tokens_predicted"] for frame in partial] == list(range(1, len(partial) + 1))
    assert all(frame["tokens_evaluated"] == whole["tokens_evaluated"] for frame in partial)
    assert [frame["tokens"][0] for frame in partial] == whole["tokens"]
    assert "".join(frame["content"] for frame in partial) == whole["content"]
    assert [p["id"] for frame in partial for p in frame["completion_probabilities"]] == whole["tokens"]
    assert last["stop"] is True and last["tokens_predicted"] == len(partial)


def test_openai_chunks_carry_one_token_each(default_server) -> None:
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused")
    fields = {"model": "target", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 1}
    whole = client.completions.create(**fields).choices[0]
    chunks = [chunk for chunk in client.completions.create(**fields, stream=True) if chunk.choices[0].logprobs]
    assert [len(chunk.choices[0].logprobs.tokens) for chunk in chunks] == [1] * len(whole.logprobs.tokens)
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.text


def test_a_prompt_over_the_context_answers_exceed_context_size_error(default_server) -> None:
    with default_server.client() as http:
        n_ctx = http.get("/props").json()["default_generation_settings"]["n_ctx"]
        prompt = [5] * n_ctx  # token ids: exactly the context, leaving no room to generate
        for route, body in (
            ("/completion", {"prompt": prompt, "n_predict": 2}),
            ("/v1/completions", {"prompt": prompt, "max_tokens": 2, "stream": True}),
        ):
            answer = http.post(route, json=body)
            assert answer.status_code == 400, route
            error = answer.json()["error"]
            assert error["type"] == "exceed_context_size_error"
            assert (error["n_prompt_tokens"], error["n_ctx"]) == (n_ctx, n_ctx)
        fits = http.post("/completion", json={"prompt": prompt[:-1], "n_predict": 2})
    assert fits.status_code == 200 and fits.json()["tokens_predicted"] == 1  # the one position left
