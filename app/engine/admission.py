"""Which queued row the scheduler admits next: fair across requests.

A request of `n` choices (or several prompts) queues one row each. Admitted in arrival order,
one request's rows could hold every row while another request's first row waited for one of
them to finish (two clients of `n = 8` with an ambiguous grammar kept a canary waiting 5–9 s
against 0.2 s idle). So the next row admitted is the earliest queued row of the request that
holds the fewest rows (every waiting request's first row before any request's second), and a
request's extra rows never take the last `reserved_rows` free rows: those stay for requests
that hold none yet, queued now or arriving later.

The reserve is two shares of the rows (two in every eight; at least two, short of every row),
for two newcomers: a request arriving while another's extra rows filled every row up to the
reserve takes one of it with its first row, and a row is still free for the request after it.
One share was not enough: one client's `n = 8` took seven of eight rows, a second client's
first row took the eighth, and a canary arriving milliseconds after them waited 2–3 s for one of
their rows to end (issue 45's attack, whose canary was sometimes first and sometimes last). A
lone request of `n = max_rows` therefore runs most of its rows together (six of eight) and the
rest as rows free up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from app.engine.row import Job

RESERVED_SHARE = 8  # a share: one row in every eight (at least one)
RESERVED_SHARES = 2  # free shares kept for other requests' first rows: two newcomers find a row


def reserved_rows(max_rows: int) -> int:
    """Free rows a request's extra rows may not take (none with a single row: it must run)."""
    return min(max_rows - 1, RESERVED_SHARES * max(1, max_rows // RESERVED_SHARE))


def request_of(job: Job) -> str:
    return job.group or job.request_id


def next_index(queue: Sequence[Job], running: Iterable[Job], max_rows: int) -> int | None:
    """The queue index of the row to admit next, or None while none may be (no free row, or only
    extra rows waiting and the free rows reserved)."""
    held = Counter(request_of(job) for job in running)
    free = max_rows - sum(held.values())
    if not queue or free <= 0:
        return None
    index = min(range(len(queue)), key=lambda i: (held[request_of(queue[i])], i))
    if held[request_of(queue[index])] and free - 1 < reserved_rows(max_rows):
        return None
    return index
