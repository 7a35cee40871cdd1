"""The engine's events (logger `mlxcel.engine`): its models loading and warming, and what became of
requests it could not serve as asked."""

from __future__ import annotations

import structlog

_log = structlog.get_logger("mlxcel.engine")


def model_loading(*, role: str, path: str) -> None:
    _log.info("model_loading", role=role, path=path)


def model_loaded(*, role: str, path: str, seconds: float) -> None:
    _log.info("model_loaded", role=role, path=path, seconds=round(seconds, 3))


def models_loaded(*, target: str, seconds: float) -> None:
    _log.info("models_loaded", target=target, seconds=round(seconds, 3))


def chat_template_ignores_tools(*, template: str) -> None:
    """The chat template in use drops a request's tools: the model never sees them."""
    _log.warning("chat_template_ignores_tools", template=template)


def model_ignores_tools(*, probe: str) -> None:
    """The template shows the model a request's tools, but the model answered the load-time probe
    (a request only a call answers well, tool `probe`) in text: `auto` will rarely answer a call."""
    _log.warning("model_ignores_tools", probe=probe)


def model_warming(*, batch_sizes: list[int], widths: list[int]) -> None:
    _log.info("model_warming", batch_sizes=batch_sizes, widths=widths)


def model_warmed(*, rows: int, seconds: float) -> None:
    _log.info("model_warmed", rows=rows, seconds=round(seconds, 3))


def drafter_unavailable(*, request_id: str, reason: str) -> None:
    """The block drafter could not be loaded; the request got 503."""
    _log.warning("drafter_unavailable", request_id=request_id, reason=reason)


def request_bound_reached(*, request_id: str, reason: str) -> None:
    """A row stopped at its request's bound (the client got 400 with `reason`)."""
    _log.warning("request_bound_reached", request_id=request_id, reason=reason)


def request_cancelled(*, request_id: str, decided: int) -> None:
    _log.info("request_cancelled", request_id=request_id, decided=decided)


def row_grammar_failed(*, request_id: str, stage: str, reason: str) -> None:
    _log.warning("row_grammar_failed", request_id=request_id, stage=stage, reason=reason)


def row_failed(*, request_id: str, stage: str, error_id: str, error_type: str, exception: BaseException) -> None:
    """A row raised; `error_id` is in its client's error message, the traceback (`exception`) here."""
    _log.error(
        "row_failed", request_id=request_id, stage=stage, error_id=error_id, error_type=error_type, exc_info=exception
    )


def sink_failed(*, request_id: str, exception: BaseException) -> None:
    """Handing a row's event to its HTTP handler raised."""
    _log.error("sink_failed", request_id=request_id, exc_info=exception)


def engine_failed(*, error_id: str, error_type: str, exception: BaseException) -> None:
    _log.error("engine_failed", error_id=error_id, error_type=error_type, exc_info=exception)
