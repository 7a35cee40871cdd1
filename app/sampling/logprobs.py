"""Per-token log-probabilities, computed only for a request that asks (`logprobs`, `n_probs`).

Two distributions can be reported (docs/server.md, "Log-probabilities"):
- the model's: the log-softmax of the target's raw logits at the position, before the sampler
  (no bias, no penalty, no temperature); what llama-server reports for `n_probs` and OpenAI for
  `logprobs`. Acceptance rules cannot change it: the verify forward's row at a decided position
  is the row target-only decoding computes there.
- the sampler's (`post_sampling_probs`): the final row `p` after the whole sampler chain.

Every function takes the rows of one step (a verify round's decided positions) and evaluates
them once, so a round costs one `mx.eval` however many tokens it decided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from app.runtime.bounds import RequestBoundError
from app.sampling.distribution import Distribution
from app.sampling.pipeline import SamplerPipeline

MAX_TOP = 20  # alternatives per token, OpenAI's top_logprobs limit
LOWEST = -3.4028234663852886e38  # float32's lowest: log(0) in JSON, which has no -inf (llama-server's choice)


@dataclass(frozen=True)
class ProbsRequest:
    """What a request asked for: `top` alternatives per token, from the model's or the sampler's row.

    `max_entries`: the row's share of `server.max_logprob_entries` (None: unbounded, offline
    callers). An entry is one token's own log-probability or one of its alternatives, so a token
    costs `top + 1` of them; each is an object in the answer.
    """

    top: int = 0
    post_sampling: bool = False
    max_entries: int | None = None

    def entries(self, tokens: int) -> int:
        """The entries `tokens` decided tokens report."""
        return tokens * (self.top + 1)

    def check_room(self, tokens: int) -> None:
        """Refuse to report `tokens` tokens in all when they pass the row's share: checked before
        computing them, so a row over its bound stops instead of accumulating them."""
        if self.max_entries is not None and self.entries(tokens) > self.max_entries:
            raise RequestBoundError(
                f"log-probabilities: {tokens} tokens x {self.top + 1} entries pass this row's share "
                f"({self.max_entries} entries) of server.max_logprob_entries; ask for fewer tokens "
                "(n_predict / max_tokens), fewer alternatives (n_probs / top_logprobs / logprobs) or fewer rows"
            )


@dataclass(frozen=True)
class TokenLogprob:
    """One decided token's log-probability and the `top` most likely tokens with theirs."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), most likely first


def token_logprobs(
    request: ProbsRequest,
    sampler: SamplerPipeline,
    logits: mx.array,
    tokens: Sequence[int],
    p: Distribution | None,
    contexts: Sequence[Sequence[int]] | None,
) -> list[TokenLogprob]:
    """The entries of `tokens`, decided at the rows `logits [R, V]` (p: the sampler's rows there,
    None where the rule built none; contexts: the rows' penalty windows)."""
    if not request.post_sampling:
        logits = logits.astype(mx.float32)
        return _ranked(logits - mx.logsumexp(logits, axis=-1, keepdims=True), None, tokens, request.top)
    if p is None and not sampler.is_greedy:
        # An argmax rule at T > 0 built no p: the sampler's row, without XTC (its coin is a key
        # draw the rule never made, and drawing it here would shift the row's key stream).
        p = sampler.distribution(logits, contexts)
    if p is None:  # greedy: the sampler's final row is one-hot on the argmax, the decided token
        return [TokenLogprob(t, 0.0, ((t, 0.0),) if request.top else ()) for t in tokens]
    return _ranked(mx.log(p.probs), p.ids, tokens, request.top)


def _ranked(logprobs: mx.array, ids: mx.array | None, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Chosen-token and top-`top` entries of log rows `[R, C]` over `ids` (None: the whole vocabulary)."""
    chosen_ids = mx.array(list(tokens))[:, None]
    if ids is None:
        chosen = mx.take_along_axis(logprobs, chosen_ids, axis=-1)[:, 0]
    else:
        chosen = mx.max(mx.where(ids == chosen_ids, logprobs, -mx.inf), axis=-1)
    top = min(top, logprobs.shape[-1])
    if top:
        best = mx.argpartition(-logprobs, kth=top - 1, axis=-1)[:, :top]
        values = mx.take_along_axis(logprobs, best, axis=-1)
        order = mx.argsort(-values, axis=-1)
        values = mx.take_along_axis(values, order, axis=-1)
        best = mx.take_along_axis(best if ids is None else mx.take_along_axis(ids, best, axis=-1), order, axis=-1)
    else:
        best = values = mx.zeros((len(tokens), 0))
    mx.eval(chosen, best, values)
    return [
        TokenLogprob(
            token,
            max(logprob, LOWEST),
            # a candidate the sampler filtered out has probability 0: it is not an alternative
            tuple(
                (i, max(v, LOWEST)) for i, v in zip(row_ids, row_values, strict=True) if ids is None or v > -math.inf
            ),
        )
        for token, logprob, row_ids, row_values in zip(
            tokens, chosen.tolist(), best.tolist(), values.tolist(), strict=True
        )
    ]
