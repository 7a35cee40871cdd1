"""`mlxcel generate`'s own event (logger `mlxcel.generate`); its other events are the server's."""

from __future__ import annotations

from typing import Unpack

import structlog

from app.events.speculation import Speculated

_log = structlog.get_logger("mlxcel.generate")


def speculative_decode_finished(*, profile: str, **fields: Unpack[Speculated]) -> None:
    """The run ended after at least one verify round: `speculative_request`'s keys but the request's."""
    _log.info("speculative_decode_finished", profile=profile, **fields)
