"""llama-server's infill sampler stage (app/sampling/infill.py) on hand-made rows: ends win where
they hold enough of the mass, a prefix's probability joins the likelier of the two, the two
thresholds, and the end-of-text fallback."""

from __future__ import annotations

import numpy as np

from app.sampling.infill import InfillVocabulary, infill_row

# token: text; 0 is the end of text, 9 a FIM file separator (an end too)
PIECES = {0: b"", 1: b"ret", 2: b"return", 3: b" x", 4: b" y", 5: b"a", 6: b"b", 7: b"c", 8: b"d", 9: b""}
VOCABULARY = InfillVocabulary(tuple(PIECES[i] for i in range(10)), frozenset({0, 9}), 0)


def run(ids: list[int], probs: list[float]) -> dict[int, float]:
    out_ids, out = infill_row(np.array(ids), np.array(probs), VOCABULARY)
    return {int(t): round(float(p), 6) for t, p in zip(out_ids, out, strict=True) if p > 0}


def test_ends_win_where_they_hold_enough_of_the_mass() -> None:
    # 3 * 0.2 * 3 = 1.8 > 0.8: only the ends remain, renormalised
    assert run([1, 0, 9], [0.8, 0.15, 0.05]) == {0: 0.75, 9: 0.25}


def test_a_prefix_joins_the_likelier_token() -> None:
    """`ret` is a prefix of `return`: the likelier keeps both masses (not: each keeps its own)."""
    assert run([2, 1, 3, 0], [0.5, 0.3, 0.19, 0.01]) == {2: round(0.8 / 0.81, 6), 0: round(0.01 / 0.81, 6)}


def test_text_tokens_under_the_thresholds_drop() -> None:
    # 0.15 < 0.2 drops; of a, b (0.45, 0.4 of 0.85 + end's 0.0), both above 1/3: kept
    assert run([5, 6, 7, 0], [0.45, 0.4, 0.15, 0.0]) == {5: round(0.45 / 0.85, 6), 6: round(0.4 / 0.85, 6)}
    # second threshold: with three text tokens kept, each needs 1/4 of what is left (0.21 / 0.97 has not)
    assert run([5, 6, 7, 8], [0.55, 0.21, 0.21, 0.03]) == {5: 1.0}
    assert run([5, 6, 7], [0.5, 0.25, 0.25]) == {5: 0.5, 6: 0.25, 7: 0.25}  # 1/4 is not under 1/4


def test_no_text_token_left_is_the_end_of_text_alone() -> None:
    assert run([5, 6, 7, 8, 3, 4], [0.18, 0.18, 0.17, 0.17, 0.15, 0.15]) == {0: 1.0}
