"""Acceptance rules (pure functions), rule selection, and acceptance counters."""

from app.acceptance.rules import (
    Verdict,
    argmax_against_argmax,
    greedy_argmax,
    modified_rejection,
    sampler_match,
    sum_coupled,
    sum_min,
    sum_prod,
)
from app.acceptance.selection import Rule, describe, select_rule
from app.acceptance.stats import AcceptanceStats, diagnostic_line, summary_line

__all__ = [
    "AcceptanceStats",
    "Rule",
    "Verdict",
    "argmax_against_argmax",
    "describe",
    "diagnostic_line",
    "greedy_argmax",
    "modified_rejection",
    "sampler_match",
    "select_rule",
    "sum_coupled",
    "sum_min",
    "sum_prod",
    "summary_line",
]
