"""Over HTTP: a seeded sampled reply of a drafting profile is the target-only profile's reply.

The request the issue was filed with (`seed` 42, T = 1.0) on the embedded default profile (the
classic draft model, sampler-match, coupled drafts) and on `target-only`; `n > 1` choices are seeded seed + j on
both, so each equals its own target-only reply. The full matrix of drafter kinds, widths, batches
and sampler stages is tests/decoding/test_seeded_identity.py.
"""

from __future__ import annotations

from tests.support.server import RunningServer

JOKE = {"prompt": "Write a very long joke.", "seed": 42, "temperature": 1.0, "n_predict": 64, "ignore_eos": True}


def test_a_seeded_reply_is_the_target_only_reply(default_server: RunningServer, target_only_server: RunningServer):
    body = JOKE | {"speculative_diagnostics": True}
    with default_server.client() as drafting, target_only_server.client() as alone:
        drafted, reference = drafting.post("/completion", json=body).json(), alone.post("/completion", json=body).json()
    assert drafted["content"] == reference["content"]
    assert drafted["generation_settings"]["seed"] == reference["generation_settings"]["seed"] == 42
    speculative = drafted["timings"]["speculative"]
    assert (speculative["rule"], speculative["identity"], speculative["coupled"]) == ("sampler-match", "token", True)
    assert (
        speculative["rounds"] > 0 and speculative["positions_tested"] > speculative["accepted"]
    )  # it drafted, and missed


def test_each_of_n_choices_is_its_target_only_reply(default_server: RunningServer, target_only_server: RunningServer):
    body = {"prompt": "def rolling_mean(values, window):\n", "n": 3, "seed": 7, "temperature": 0.7,
            "max_tokens": 48, "ignore_eos": True}  # fmt: skip
    with default_server.client() as drafting, target_only_server.client() as alone:
        drafted = [c["text"] for c in drafting.post("/v1/completions", json=body).json()["choices"]]
        reference = [c["text"] for c in alone.post("/v1/completions", json=body).json()["choices"]]
        single = {"prompt": body["prompt"], "seed": 9, "temperature": 0.7, "n_predict": 48, "ignore_eos": True}
        third = alone.post("/completion", json=single).json()["content"]
    assert drafted == reference and len(set(drafted)) == 3
    assert drafted[2] == third  # choice j is the request seeded seed + j
