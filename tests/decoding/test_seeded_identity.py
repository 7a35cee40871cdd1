"""Speculation that changes nothing but speed: a seeded sampler-match row emits target-only's tokens.

Every emitted token of a sampler-match row is a draw from the target's p at that position, and p
is bit-identical at every width and in every batch (the T = 0 guarantee rests on it). The target's
draws have a key stream of their own, consumed once per emitted position exactly as target-only
decoding consumes it, and a drafter never consumes it: coupled (the default under sampler-match),
its draws peek the target's keys of their positions; uncoupled, they come from a second stream
(app/sampling/streams.py). So with any drafter the row's tokens are target-only's, token for token.

Each drafter kind's engine is built the way the server builds it (its shipped profile, block
drafters under `drafter.block_rule = "lossless"`; coupled, and for the draft model and MTP also
with `speculative.coupled = false`) and run on the held-out prompts at T = 0.7: the first ALONE
of them alone for 256 tokens (one row per forward, each round's path once per token), then all
eight for 128 as a batch stepping together (the engine's tick, tests/support/batched.py) with other traffic
joining, leaving and sampling at T = 0. The alone rows were all eight until issue 44: the batch
runs the same rounds on every prompt, so three alone rows keep the solo path's 768 checked
positions per drafter at 3/8 of its cost. The uncoupled variants run the batch alone: what they change is
which stream a drafter's draws come from (app/sampling/streams.py), the same code in a lone row and
in a batch, and the coupled variant of the same drafter holds the lone rows' path. The batched
rows cover the sampler's stages (XTC, top-k, top-p, min-p, penalties, logit_bias, a JSON schema whose
grammar forces tokens) and several widths (speculative.n_max). Nothing here depends on the
device: the lead runs the same file on the GPU.
"""

from __future__ import annotations

import functools

import msgspec
import pytest

from app.acceptance import Rule
from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.generation import Generation
from app.drafters.kinds import DrafterKind
from app.engine.engine import Engine
from app.profiles import resolve
from app.profiles.schema import LOSSLESS_BLOCK_RULE, SpeculativeSettings
from app.sampling import SamplingParams
from app.sampling.grammar import Grammar
from ops.bench.prompts import HELD_OUT_CODE
from tests.support.batched import Arrival, run_batched, run_rows

# Ten engines, 11 rows of 256 tokens each; one worker runs them all, so the module's target-only
# reference is computed once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("seeded-identity")]

PROFILES = {  # drafter kind -> its shipped profile
    "draft-model": "default",
    "prompt-lookup": "prompt-lookup",
    "mtp": "mtp",
    "dflash": "dflash",
    "dspark": "dspark",
    "muse": "muse",
}
N_PREDICT = 256  # a lone row's tokens
# a batched row's: each of its rounds is checked as a lone row's is, and at 128 tokens a drafting
# row still has about 40 to 100 rounds with tens of rejected positions (each a place where a drafter that
# consumed the target's keys would show); at 256 (until issue 44) the batch was two thirds of the
# file's time
N_BATCHED = 128
ALONE = 3  # prompts run alone too
HOT = SamplingParams(temperature=0.7)  # the server's other defaults: top_k 40, top_p 0.95, min_p 0.05
RECORD = Grammar.json_schema(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
            "done": {"type": "boolean"},
        },
        "required": ["name", "tags", "done"],
        "additionalProperties": False,
    }
)
# The batch's identity rows: (sampler, grammar, speculative.n_max), one per held-out prompt: XTC, top-k,
# top-p, min-p, penalties, logit_bias, then a JSON schema (its grammar forces tokens) twice.
BATCHED = [
    (msgspec.structs.replace(HOT, xtc_probability=0.5, xtc_threshold=0.1), None, None),
    (msgspec.structs.replace(HOT, top_k=5, top_p=1.0, min_p=0.0), None, 1),
    (msgspec.structs.replace(HOT, top_k=0, top_p=0.8, min_p=0.0), None, 2),
    (msgspec.structs.replace(HOT, top_k=0, top_p=1.0, min_p=0.1), None, 3),
    (msgspec.structs.replace(HOT, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1), None, None),
    (msgspec.structs.replace(HOT, logit_bias={13: -2.0, 220: 1.5, 0: float("-inf")}), None, 2),
    (HOT, RECORD, None),
    (msgspec.structs.replace(HOT, temperature=1.0, repeat_penalty=1.1), RECORD, 1),
]


def alone_request(tokens: list[int], index: int) -> RowRequest:
    return RowRequest(tokens, HOT, max_tokens=N_PREDICT, seed=1000 + index, ignore_eos=True)


def batched_request(tokens: list[int], index: int) -> RowRequest:
    """Seeded as choice `index` of one request seeded 2000 would be (OpenAI's n: seed + j)."""
    sampling, grammar, n_max = BATCHED[index]
    return RowRequest(tokens, sampling, max_tokens=N_BATCHED, seed=2000 + index, ignore_eos=grammar is None,
                      grammar=grammar, n_max=n_max)  # fmt: skip


def other_traffic(tokens: list[list[int]]) -> list[tuple[RowRequest, int, int | None]]:
    """Rows the identity rows share their ticks with, as (request, tick it joins, tick it leaves):
    a greedy one, one that opts out of drafting, an unseeded one that leaves mid-way (a cancelled
    request)."""
    greedy = RowRequest(tokens[0], SamplingParams(temperature=0.0), max_tokens=120, ignore_eos=True)
    opted_out = RowRequest(tokens[1], HOT, max_tokens=90, seed=7, ignore_eos=True, n_max=0)
    cancelled = RowRequest(tokens[2], HOT, max_tokens=N_BATCHED, ignore_eos=True)
    return [(greedy, 0, None), (opted_out, 5, None), (cancelled, 2, 30)]


def run(generation: Generation) -> Generation:
    generation.prefill()
    while not generation.finished:
        generation.step()
    return generation


def builder(profile: str, coupled: bool = True) -> LoopBuilder:
    """The profile's loop builder as the server makes it; block drafters under the lossless rule."""
    settings = resolve(profile).settings
    settings = msgspec.structs.replace(settings, speculative=SpeculativeSettings(coupled=coupled))
    if DrafterKind(settings.drafter.kind).is_block_loop:
        drafter = msgspec.structs.replace(settings.drafter, block_rule=LOSSLESS_BLOCK_RULE)
        settings = msgspec.structs.replace(settings, drafter=drafter)
    engine = Engine(settings)
    engine.host.load()
    return engine.host.builder


@functools.cache
def reference() -> LoopBuilder:
    return builder("target-only")


@functools.cache
def held_out_prompts() -> list[list[int]]:
    return [list(reference().target.tokenizer.encode(prompt)) for prompt in HELD_OUT_CODE]  # one tokenizer for all


@functools.cache
def target_only_outputs() -> dict[str, list[list[int]]]:
    """Target-only outputs of both request sets (target-only rows are batch-invariant, so they are
    run together: tests/engine/test_batched_rows.py holds that to each row's solo output). Cached
    for the worker, not in a module fixture: xdist may run another module's test between two of
    this group's, which would tear a module fixture down and recompute it (18 s each time)."""
    outputs, prompts = {}, held_out_prompts()
    for name, make, count in (("alone", alone_request, ALONE), ("batched", batched_request, len(prompts))):
        rows = run_rows([reference().build(make(tokens, i)) for i, tokens in enumerate(prompts[:count])])
        outputs[name] = [row.emitted for row in rows]
    assert all(len(tokens) == N_PREDICT for tokens in outputs["alone"])
    return outputs


@pytest.fixture
def prompts() -> list[list[int]]:
    return held_out_prompts()


@pytest.fixture
def target_only() -> dict[str, list[list[int]]]:
    return target_only_outputs()


def first_difference(got: list[int], want: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)


@pytest.mark.parametrize(
    ("kind", "coupled"),
    [(kind, True) for kind in sorted(PROFILES)] + [("draft-model", False), ("mtp", False)],
    ids=[*sorted(PROFILES), "draft-model-uncoupled", "mtp-uncoupled"],
)
def test_seeded_sampler_match_emits_target_only_tokens(kind: str, coupled: bool, prompts, target_only) -> None:
    loops = builder(PROFILES[kind], coupled)
    for i, tokens in enumerate(prompts[: ALONE if coupled else 0]):
        row = run(loops.build(alone_request(tokens, i)))
        speculation = row.speculation
        assert speculation.rule is Rule.SAMPLER_MATCH and row.stats.ran, (kind, i, [n.event for n in row.stats.notes])
        assert speculation.rule.identity == "token"
        assert speculation.coupled is (coupled and kind != "prompt-lookup")  # prompt lookup draws nothing
        assert row.emitted == target_only["alone"][i], (kind, i, first_difference(row.emitted, target_only["alone"][i]))

    identity = [Arrival(loops.build(batched_request(tokens, i)), joins=i % 3) for i, tokens in enumerate(prompts)]
    traffic = [Arrival(loops.build(request), joins, leaves) for request, joins, leaves in other_traffic(prompts)]
    widest = run_batched(identity + traffic)
    assert widest >= len(prompts)
    for i, arrival in enumerate(identity):
        row, want = arrival.generation, target_only["batched"][i]
        assert row.speculation.rule is Rule.SAMPLER_MATCH, (kind, i)
        assert row.speculation.coupled is (coupled and kind != "prompt-lookup"), (kind, i)
        assert row.emitted == want, (kind, i, BATCHED[i], first_difference(row.emitted, want))
    assert sum(arrival.generation.stats.acceptance.rounds for arrival in identity) > 0
