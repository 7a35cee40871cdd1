"""The order the scheduler admits queued rows in (app/engine/admission.py): fair across requests."""

from __future__ import annotations

from app.decoding.builder import RowRequest
from app.engine.admission import next_index, reserved_rows
from app.engine.row import Job
from app.sampling import SamplingParams


def rows(request: str, n: int) -> list[Job]:
    """A request's `n` rows as start_rows queues them (row i > 0 logs as f"{request}-{i}")."""
    ids = [request] + [f"{request}-{i}" for i in range(1, n)]
    return [
        Job(RowRequest([1], SamplingParams(), max_tokens=8), rid, "/completion", print, group=request) for rid in ids
    ]


def admitted(queue: list[Job], max_rows: int, running: list[Job] | None = None) -> list[str]:
    """The rows admitted, in order, until none may be; the engine's loop without the engine."""
    queue, running, order = list(queue), list(running or []), []
    while (index := next_index(queue, running, max_rows)) is not None:
        running.append(queue.pop(index))
        order.append(running[-1].request_id)
    return order


def test_every_requests_first_row_goes_before_any_requests_second() -> None:
    queue = rows("a", 8) + rows("b", 8) + rows("canary", 1)
    order = admitted(queue, max_rows=8)
    assert order[:3] == ["a", "b", "canary"]
    assert order[3:] == ["a-1", "b-1", "a-2"]  # then the extra rows take turns
    assert len(order) == 8 - reserved_rows(8)  # the last two free rows stay for later requests' first


def test_a_request_that_arrives_later_finds_a_free_row() -> None:
    """The audit: two clients' n = 8 held all eight rows, and the canary waited for one to finish."""
    running = [rows("a", 8)[0], *rows("b", 8)[:1]]
    first = admitted(rows("a", 8)[1:] + rows("b", 8)[1:], max_rows=8, running=running)
    held = running + [job for job in rows("a", 8) + rows("b", 8) if job.request_id in first]
    assert len(held) == 6
    assert admitted(rows("canary", 1), max_rows=8, running=held) == ["canary"]
    assert admitted(rows("c", 2), max_rows=8, running=held) == ["c"]  # its first row; its second waits


def test_a_request_after_two_that_arrived_one_after_the_other_finds_a_free_row() -> None:
    """The flaky attack test: a's n = 8 came alone and its extra rows filled up to the reserve, b's
    first row took one reserved row, and the canary, milliseconds later, found none (one reserved
    row of eight: it waited 2-3 s for one of a's rows to end). Two reserved rows leave it one."""
    held = [job for job in rows("a", 8) if job.request_id in admitted(rows("a", 8), max_rows=8)]
    assert len(held) == 8 - reserved_rows(8) == 6
    held += [job for job in rows("b", 8) if job.request_id in admitted(rows("b", 8), max_rows=8, running=held)]
    assert [job.request_id for job in held[6:]] == ["b"]  # its first row; its extra rows wait
    assert admitted(rows("canary", 1), max_rows=8, running=held) == ["canary"]


def test_a_lone_request_runs_its_rows_and_a_one_row_server_still_runs_them() -> None:
    assert admitted(rows("a", 8), max_rows=8) == ["a", *(f"a-{i}" for i in range(1, 6))]
    assert admitted(rows("a", 2), max_rows=1) == ["a"]
    assert admitted(rows("a", 2)[1:], max_rows=1) == ["a-1"]  # once its first row finished
    assert reserved_rows(1) == 0 and reserved_rows(2) == 1 and reserved_rows(3) == 2
    assert reserved_rows(8) == 2 and reserved_rows(64) == 16
