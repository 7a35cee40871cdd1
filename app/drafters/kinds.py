"""Drafter kinds, and resolving one from an explicit flag or a drafter's config.json."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.loading import Checkpoint, CheckpointKind


class DrafterKind(StrEnum):
    """The names `--draft-kind`, profiles and `timings.draft_kind` use."""

    NONE = "none"
    DRAFT_MODEL = "draft-model"
    PROMPT_LOOKUP = "prompt-lookup"
    MTP = "mtp"
    DFLASH = "dflash"

    @property
    def needs_model(self) -> bool:
        """Drafts with a checkpoint (drafter.model), rather than from the prompt or not at all."""
        return self not in (DrafterKind.NONE, DrafterKind.PROMPT_LOOKUP)

    @property
    def is_block_loop(self) -> bool:
        return self in (DrafterKind.MTP, DrafterKind.DFLASH)


DETECTED = {
    CheckpointKind.STANDALONE: DrafterKind.DRAFT_MODEL,
    CheckpointKind.DFLASH: DrafterKind.DFLASH,
    CheckpointKind.DSPARK: DrafterKind.DFLASH,
    CheckpointKind.MUSE: DrafterKind.DFLASH,
    CheckpointKind.MTP: DrafterKind.MTP,
}


@dataclass(frozen=True)
class Resolution:
    """The drafter kind a run drafts with, and where it came from (what `mlxcel generate` prints)."""

    kind: DrafterKind
    explicit: bool  # named (a profile, --draft-kind), not read from the drafter's config.json
    detail: str  # what the drafter checkpoint is

    def lines(self) -> list[str]:
        source = "explicit" if self.explicit else "auto-detected from config.json"
        out = [f"Resolved drafter kind: {self.kind} ({self.detail}, {source})"]
        if not self.explicit:
            loop = (
                "the classic speculative generator"
                if self.kind is DrafterKind.DRAFT_MODEL
                else f"the {self.kind} round loop"
            )
            out.append(f"Drafter kind was auto-detected only; running {loop}.")
        return out


def describe_checkpoint(checkpoint: Checkpoint) -> str:
    config = checkpoint.config
    if checkpoint.kind is CheckpointKind.STANDALONE:
        return f"{config.get('model_type')} model, {config.get('num_hidden_layers', '?')} layers"
    block = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    return f"{checkpoint.kind} checkpoint, block_size = {block if block else 'default'}"


def resolve_drafter_kind(explicit: str | None, checkpoint: Checkpoint | None) -> Resolution:
    """The kind named, else the one `checkpoint`'s config.json describes (none without one)."""
    detail = describe_checkpoint(checkpoint) if checkpoint is not None else "no drafter checkpoint"
    if explicit is not None:
        return Resolution(DrafterKind(explicit), True, detail)
    return Resolution(DETECTED[checkpoint.kind] if checkpoint is not None else DrafterKind.NONE, False, detail)
