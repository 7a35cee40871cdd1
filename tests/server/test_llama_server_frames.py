"""Stream frames and errors as llama-server sends them (cases of llama.cpp's own server suite,
written as our tests): one token per frame even while drafting, live counters on native frames,
the context-overflow error's type and counts. The default profile drafts with a draft model, so
its rounds hold several tokens."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from app.execution.runner import PREFILL_CHUNK
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from tests.support.caching import restored
from tests.support.derived_models import with_context
from tests.support.server import serve, sse_frames

PROMPT = "def fibonacci(n):"
SHORT_CONTEXT = 512


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


@pytest.mark.slow
def test_a_prompt_over_the_context_answers_exceed_context_size_error(tmp_path: Path) -> None:
    """On the default pair with the target's context cut to SHORT_CONTEXT (its own server): the
    prompt that fits leaves one position, and the 4,096 of the shipped config cost 20 s of prefill."""
    target = with_context(EMBEDDED_TARGET, tmp_path / "short-context", SHORT_CONTEXT)
    with serve(tmp_path, "-m", str(target), "-md", str(EMBEDDED_DRAFTER)) as server, server.client() as http:
        n_ctx = http.get("/props").json()["default_generation_settings"]["n_ctx"]
        assert n_ctx == SHORT_CONTEXT
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
        fits = http.post("/completion", json={"prompt": prompt[:-1], "n_predict": 2, "temperature": 0})
    assert fits.status_code == 200 and fits.json()["tokens_predicted"] == 1  # the one position left


def long_prompt(seed: int, n: int = 3 * PREFILL_CHUNK + 40) -> list[int]:
    """n token ids of their own (seed), so no other test's prompt-cache entry serves them: over
    three prefill chunks."""
    return [(seed * 7919 + i * 131) % 3900 + 20 for i in range(n)]


def progress_of(frames: list) -> list[dict]:
    return [frame["prompt_progress"] for frame in frames if isinstance(frame, dict) and "prompt_progress" in frame]


def test_return_progress_streams_a_prompt_progress_frame_per_prefill_chunk(default_server) -> None:
    """As llama-server: a frame at the start (processed = the cached tokens), then one per chunk
    the prefill feeds, all before the first token; no content, no tokens, the row's counts. The
    tokens that follow are the stream's without progress."""
    prompt = long_prompt(1)
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "stream": True, "cache_prompt": False}
    with default_server.client() as http:
        with http.stream("POST", "/completion", json=body | {"return_progress": True}) as response:
            frames = sse_frames(response)
        with http.stream("POST", "/completion", json=body) as response:
            plain = sse_frames(response)
    progress = progress_of(frames)
    chunk_ends = [*range(0, len(prompt), PREFILL_CHUNK), len(prompt)]
    assert [p["processed"] for p in progress] == chunk_ends  # 0, 128, 256, 384, 424
    assert {(p["total"], p["cache"]) for p in progress} == {(len(prompt), 0)}
    assert progress[0]["time_ms"] == 0
    assert [p["time_ms"] for p in progress] == sorted(p["time_ms"] for p in progress)
    leading = frames[: len(progress)]
    assert all("prompt_progress" in frame and frame["content"] == "" and frame["tokens"] == [] for frame in leading)
    assert all((frame["tokens_predicted"], frame["tokens_evaluated"]) == (0, len(prompt)) for frame in leading)
    assert progress_of(plain) == []
    assert frames[len(progress) :][:-1] == plain[:-1]  # the same token frames
    assert frames[-1]["content"] == plain[-1]["content"]


def test_progress_counts_the_tokens_the_prompt_cache_restored(default_server) -> None:
    """`cache` is the prompt tokens restored from the prompt cache: the prefill starts there."""
    prompt = long_prompt(2)
    body = {"prompt": prompt, "n_predict": 2, "temperature": 0, "stream": True, "return_progress": True}
    with default_server.client() as http:
        for _ in range(2):  # the first fills the cache, the second restores its whole grains
            with http.stream("POST", "/completion", json=body) as response:
                frames = sse_frames(response)
    progress = progress_of(frames)
    cached = restored(len(prompt), len(prompt))
    assert frames[-1]["timings"]["cache_n"] == cached
    assert [p["processed"] for p in progress] == [cached, len(prompt)]
    assert {p["cache"] for p in progress} == {cached}


def test_chat_progress_chunks_carry_the_role_delta_and_prompt_progress(default_server) -> None:
    """llama-server's chat progress chunk: `delta` {role: assistant, content: null}, no finish
    reason, `prompt_progress` beside `choices`; the last one counts the whole prompt. The same on
    /v1/completions with an empty text."""
    words = " ".join(f"w{i}" for i in range(3 * PREFILL_CHUNK))
    body = {"messages": [{"role": "user", "content": f"progress {words}"}], "max_tokens": 4, "temperature": 0}
    body |= {"stream": True, "return_progress": True, "cache_prompt": False, "stream_options": {"include_usage": True}}
    with default_server.client() as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            frames = sse_frames(response)
        text = {"prompt": long_prompt(3), "max_tokens": 2, "stream": True, "return_progress": True}
        with http.stream("POST", "/v1/completions", json=text | {"cache_prompt": False}) as response:
            text_frames = sse_frames(response)
    chunks = [frame for frame in frames if isinstance(frame, dict) and "prompt_progress" in frame]
    assert len(chunks) > 3  # the initial frame and one per chunk of a prompt over three chunks
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    choices = [choice for c in chunks for choice in c["choices"]]
    assert len(choices) == len(chunks)
    assert all(c["delta"] == {"role": "assistant", "content": None} and c["finish_reason"] is None for c in choices)
    last = chunks[-1]["prompt_progress"]
    assert last["processed"] == last["total"] == frames[-2]["usage"]["prompt_tokens"]
    text_progress = [frame for frame in text_frames if isinstance(frame, dict) and "prompt_progress" in frame]
    assert [f["prompt_progress"]["processed"] for f in text_progress][-1] == len(long_prompt(3))
    assert all(f["choices"][0]["text"] == "" and f["choices"][0]["finish_reason"] is None for f in text_progress)


def test_return_progress_does_not_change_an_unstreamed_answer(default_server) -> None:
    """llama-server sends progress on streams only: an unstreamed body is the same with or without it."""
    body = {"prompt": long_prompt(4, 20), "n_predict": 6, "temperature": 0, "cache_prompt": False}
    with default_server.client() as http:
        plain = http.post("/completion", json=body).json()
        asked = http.post("/completion", json=body | {"return_progress": True}).json()
    assert "prompt_progress" not in asked and asked["content"] == plain["content"]
