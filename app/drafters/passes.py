"""A drafter's work in a tick: its passes, how they grow with the rows' widths, and the calls that
many rows' passes share.

Every drafter kind drafts with passes the engine's tick serves for all rows together
(app/execution/steps.py `run_together`, each row's share a `DraftPass`), before any target forward:

- a draft model: one forward per draft position, each over the rows drafting that far (the j-th
  step of every row in one `forward(rows)`, app/drafters/draft_model.py);
- an MTP head: one head call per draft position (the first also takes the context rows the row
  owes), every row's in one call (app/drafters/block_rows.py `MtpPass`);
- a DFlash-family drafter: one block forward per round with the context rows owed, every row's
  in one call (`DFlashPass`);
- prompt lookup: none (a lookup in the row's own index).

`DrafterPasses` says which of these shapes a row's drafter has and whose measured costs price
them (app/execution/cost.py `DRAFTING`), for the tick's width choice (app/decoding/goodput.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.nn as nn


class PassShape(StrEnum):
    CHAIN = "chain"  # one pass per draft position, over the rows drafting that far (draft model, MTP)
    BLOCK = "block"  # one pass over every drafting row's block (DFlash family)
    NONE = "none"  # nothing forwarded (prompt lookup)


@dataclass(frozen=True)
class DrafterPasses:
    """How a row's drafter spends a tick: the shape of its passes, and the module whose measured
    pass costs price them (None: nothing to price)."""

    shape: PassShape = PassShape.NONE
    module: nn.Module | None = None


NO_PASSES = DrafterPasses()
