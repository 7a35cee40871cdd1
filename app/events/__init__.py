"""Every structlog event a log pipeline may rely on, one function per event, in one package.

The event names and keys are a contract (docs/log-events.md, which tests/project/test_log_events.py
holds to this package): add keys, never rename them. Each function is named as its event and
takes the event's keys as typed keyword-only arguments (a `**fields` of a TypedDict where two
events share keys); a `level` argument, where an event has one, is the line's level. Modules are
grouped by the logger the events go through (`mlxcel.<module>`, `mlxcel.events` for the
speculation events), and import nothing of the app: every layer may emit.
"""

from __future__ import annotations

from typing import Literal

Level = Literal["debug", "info", "warning", "error"]
