"""What every API's answers share: the model's name and paths as they are shown, the acceptance
rule header, whether a drafted stream followed the argmax, and llama-server's prefill progress.

Every answer is a msgspec Struct (each API's `shapes.py`): Litestar encodes them and derives the
OpenAPI schema from them. Key order follows the declaration. A field that is sometimes absent
defaults to UNSET (left out of the JSON); one that is sometimes null is typed `| None` and always
written.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from msgspec import UNSET, UnsetType

from app.profiles.schema import Settings
from app.server.engine_view import Finished, Progress


def model_alias(settings: Settings) -> str:
    return settings.server.model_alias or Path(settings.target.model).name


def shown_path(settings: Settings, path: str) -> str:
    """A filesystem path as /props and /v1/models show it: its last part (the model's directory
    name, the profile's file name) unless `server.props_show_paths`, because anyone who may read
    them learns the machine's layout (user names, mount points) otherwise."""
    return path if settings.server.props_show_paths else Path(path).name


RULE_HEADER = "x-mlxcel-acceptance-rule"


def rule_header(rules: list[str | None]) -> dict[str, str]:
    """The acceptance rule the request's rows ran, as their loops reported it (`none`: no
    drafter); rows that ran different rules are each named once, in row order."""
    return {RULE_HEADER: ", ".join(dict.fromkeys(rule or "none" for rule in rules))}


def speculative_biased(results: list[Finished]) -> bool | UnsetType:
    """Whether a row's stream followed the target's argmax although the request sampled
    (argmax-against-argmax at T > 0); absent where no drafter ran."""
    drafted = [result for result in results if result.rule is not None]
    return any(result.biased for result in drafted) if drafted else UNSET


class PromptProgress(msgspec.Struct, kw_only=True):
    """llama-server's `prompt_progress` (return_progress): prompt tokens in all, restored from the
    prompt cache, in the cache so far (those included), and milliseconds since the prefill began."""

    total: int
    cache: int
    processed: int
    time_ms: int


def prompt_progress(progress: Progress) -> PromptProgress:
    return PromptProgress(
        total=progress.total, cache=progress.cache, processed=progress.processed, time_ms=progress.time_ms
    )
