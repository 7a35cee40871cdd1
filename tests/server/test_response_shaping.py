"""Response shaping over real HTTP (`response_fields`, both `logit_bias` spellings) and the SSE
frame merging of a submission (a real asyncio queue fed as the engine thread feeds it)."""

from __future__ import annotations

import asyncio

import pytest

from app.decoding.builder import RowRequest
from app.sampling import SamplingParams
from app.server.core.service import Submission, merge
from app.server.engine_view import Delta, Event, Failed, Finished, Job, Metrics, Timings
from app.server.metrics import HttpMetrics, exposition
from tests.support.server import sse_frames

REQUEST = {"prompt": "def add(a, b):\n", "n_predict": 6, "temperature": 0, "seed": 3}
FIELDS = ["content", "timings/prompt_n", "generation_settings/speculative.n_max", "stop_type", "no_such_field"]


def test_response_fields_keep_the_named_paths_of_the_native_body(default_server) -> None:
    uncached = {**REQUEST, "cache_prompt": False}  # each prefills the whole prompt: the same prompt_n
    with default_server.client() as http:
        full = http.post("/completion", json=uncached).json()
        picked = http.post("/completion", json={**uncached, "response_fields": FIELDS}).json()
        with http.stream("POST", "/completion", json={**uncached, "response_fields": FIELDS, "stream": True}) as r:
            last = sse_frames(r)[-1]
    # A path reaches into nested objects by wire names; a path that names nothing is left out.
    expected = {
        "content": full["content"],
        "timings/prompt_n": full["timings"]["prompt_n"],
        "generation_settings/speculative.n_max": full["generation_settings"]["speculative.n_max"],
        "stop_type": "limit",
    }
    assert picked == expected
    assert last == expected | {"content": ""}  # the streamed text went out in the frames before


def first_token(http, **extra) -> tuple[int, list]:
    body = http.post("/completion", json={**REQUEST, "n_predict": 1, "return_tokens": True, **extra}).json()
    return body["tokens"][0], body["generation_settings"]["logit_bias"]


@pytest.mark.parametrize("spelling", ["object-id", "list-id", "object-text", "list-text"])
def test_both_logit_bias_spellings_force_a_token(default_server, spelling: str) -> None:
    text = " banana"
    with default_server.client() as http:
        natural, _ = first_token(http)
        ids = http.post("/tokenize", json={"content": text}).json()["tokens"]
        assert natural not in ids
        bias = {
            "object-id": {str(ids[0]): 100},
            "list-id": [[ids[0], 100]],
            "object-text": {text: 100},  # not ASCII digits: tokenized, every token gets the bias
            "list-text": [[text, 100]],  # in the list spelling only a number is an id
        }[spelling]
        forced, reported = first_token(http, logit_bias=bias)
    favoured = ids[:1] if spelling.endswith("-id") else ids
    assert forced in favoured
    assert sorted(reported, key=lambda e: e["token"]) == [{"bias": 100.0, "token": t} for t in sorted(set(favoured))]


@pytest.mark.parametrize("spelling", ["object", "list"])
def test_a_false_bias_bans_the_token_and_reports_it_as_null(default_server, spelling: str) -> None:
    with default_server.client() as http:
        natural, _ = first_token(http)
        bias = {str(natural): False} if spelling == "object" else [[natural, False]]
        banned, reported = first_token(http, logit_bias=bias)
    assert banned != natural
    assert reported == [{"bias": None, "token": natural}]  # -inf has no JSON spelling: null, as llama-server writes it


# --- SSE frame merging ------------------------------------------------------------------------


def timings(predicted_n: int) -> Timings:
    return Timings(
        cache_n=0,
        prompt_n=4,
        prompt_ms=1.0,
        prompt_per_token_ms=0.25,
        prompt_per_second=4000.0,
        predicted_n=predicted_n,
        predicted_ms=float(predicted_n),
        predicted_per_token_ms=1.0,
        predicted_per_second=1000.0,
    )


def finished(text: str, tokens: list[int]) -> Finished:
    return Finished(text, tokens, "eos", "", 4, timings(len(tokens)), None, None)


def streamed(queued: list[Event], per_round: bool = True) -> list[Event]:
    """What Submission.stream yields when `queued` all arrived before the handler's next turn
    (`per_round`: server.stream_frames "round")."""

    async def run() -> list[Event]:
        events: asyncio.Queue[Event] = asyncio.Queue()
        for event in queued:
            events.put_nowait(event)
        job = Job(RowRequest([1, 2, 3], SamplingParams(), max_tokens=8), "rid", "/completion", events.put_nowait)

        async def receive() -> dict:
            return {"type": "http.request"}

        return [event async for event in Submission(job, events, receive, per_round).stream()]

    return asyncio.run(run())


def test_each_token_is_a_frame_of_its_own_by_default() -> None:
    """llama-server streams one token per frame even while drafting: a round's delta is cut at
    its tokens (each with its piece of the text and its own timings count), and nothing queued
    is joined."""
    round_of_three = Delta(text="f x", tokens=[11, 12, 13], timings=timings(4), pieces=["f", " ", "x"])
    done = finished("def x", [10, 11, 12, 13])
    frames = streamed([Delta(text="de", tokens=[10], timings=timings(1), pieces=["de"]), round_of_three, done], False)
    assert [(d.tokens, d.text) for d in frames[:-1]] == [([10], "de"), ([11], "f"), ([12], " "), ([13], "x")]
    assert [d.timings.predicted_n for d in frames[:-1]] == [1, 2, 3, 4] and frames[-1] == done


def test_updates_queued_between_turns_go_out_as_one_frame() -> None:
    updates = [
        Delta(text="de", tokens=[10], timings=timings(1)),
        Delta(text="f ", tokens=[11, 12], timings=timings(3)),
        Delta(text="x", tokens=[13], timings=timings(4)),
    ]
    done = finished("def x", [10, 11, 12, 13])
    assert streamed([*updates, done]) == [Delta(text="def x", tokens=[10, 11, 12, 13], timings=timings(4)), done]


def test_a_failure_after_queued_updates_ends_the_stream_in_its_own_frame() -> None:
    failure = Failed("the model is not available (draining)", 503, "unavailable_error")
    late = Delta(text="never sent", tokens=[99], timings=None)
    assert streamed(
        [Delta(text="a", tokens=[1], timings=None), Delta(text="b", tokens=[2], timings=None), failure, late]
    ) == [
        Delta(text="ab", tokens=[1, 2], timings=None),
        failure,
    ]


def test_merge_keeps_the_later_timings() -> None:
    assert merge(
        Delta(text="a", tokens=[1], timings=timings(1)), Delta(text="b", tokens=[2], timings=timings(2))
    ).timings == timings(2)


# --- /metrics ---------------------------------------------------------------------------------


def test_metrics_exposition_keeps_llama_server_names_types_and_labels() -> None:
    metrics = Metrics(prompt_tokens_total=12, prompt_seconds_total=0.5, spec_accepted_per_position=[7, 3])
    metrics.prompt_cache_bytes = 4096
    lines = exposition(metrics, HttpMetrics()).decode().splitlines()
    assert "# TYPE llamacpp:prompt_tokens_total counter" in lines
    assert "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed." in lines
    assert "# TYPE llamacpp:prompt_tokens_seconds gauge" in lines
    samples = dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))
    assert float(samples["llamacpp:prompt_tokens_total"]) == 12
    assert float(samples["llamacpp:prompt_tokens_seconds"]) == 24  # tokens per second of prompt time
    assert float(samples["llamacpp:predicted_tokens_seconds"]) == 0  # no time yet: 0, not a division error
    per_position = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    assert [float(samples[f'{per_position}{{position="{i}"}}']) for i in (0, 1)] == [7, 3]
    types = [line.split()[2:] for line in lines if line.startswith("# TYPE llamacpp:")]
    assert "# TYPE llamacpp:prompt_cache_bytes gauge" in lines and float(samples["llamacpp:prompt_cache_bytes"]) == 4096
    assert len(types) == 16 and all(kind in (["counter"], ["gauge"]) for _, *kind in types)
