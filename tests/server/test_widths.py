"""One row, one width: /props, /slots, the response's generation_settings and the events report
the width cap the row's width policy resolved (app/decoding/width.py row_n_max); /slots shows the
width of the row's latest step, which is one its rounds ran at (the event's `widths`) or 0 (a
plain step, the event's `plain_steps`); /metrics counts the widths its rounds ran at."""

from __future__ import annotations

import threading

import pytest

PROMPT = "def merge_sorted(left, right):\n"


@pytest.mark.parametrize(("requested", "request_id"), [(None, "width-default"), (2, "width-2"), (99, "width-99")])
def test_props_slots_response_and_event_report_the_same_width(default_server, requested, request_id) -> None:
    body = {"prompt": PROMPT, "n_predict": 160, "temperature": 0, "ignore_eos": True}
    if requested is not None:
        body["speculative.n_max"] = requested
    seen: list[int] = []
    current: list[int] = []  # draft.width of the row's slot: its latest step's width
    done = threading.Event()
    answer: dict = {}

    def post() -> None:
        with default_server.client() as http:
            answer.update(http.post("/completion", json=body, headers={"X-Request-ID": request_id}).json())
        done.set()

    with default_server.client() as http:
        default_n_max = http.get("/props").json()["default_generation_settings"]["speculative.n_max"]
        thread = threading.Thread(target=post)
        thread.start()
        while not done.is_set():  # the row's slot while it decodes
            slots = http.get("/slots").json()
            mine = [s for s in slots if s["id_task"] == request_id]
            seen += [s["params"]["speculative.n_max"] for s in mine]
            current += [s["draft"]["width"] for s in mine if s.get("draft") and s["draft"]["width"] is not None]
        thread.join()
    expected = default_n_max if requested is None else min(requested, default_n_max)
    assert default_n_max == 4  # the default profile's draft model
    assert seen and set(seen) == {expected}
    assert answer["generation_settings"]["speculative.n_max"] == expected
    event = default_server.wait_for_event("speculative_request", request_id)
    assert event["n_max"] == expected
    assert event["widths"] and max(int(w) for w in event["widths"]) <= expected
    assert sum(event["widths"].values()) == event["rounds"] == answer["timings"]["draft_rounds"]
    ran = {int(w) for w in event["widths"]} | ({0} if event["plain_steps"] else set())
    assert current and set(current) <= ran and max(current) <= expected
    assert event["plain_steps"] + event["rounds"] <= event["predicted_n"]


def test_metrics_export_the_widths_rounds_ran_at(default_server) -> None:
    with default_server.client() as http:
        http.post("/completion", json={"prompt": PROMPT, "n_predict": 24, "temperature": 0, "speculative.n_max": 3})
        text = http.get("/metrics").text
    buckets = [line for line in text.splitlines() if line.startswith("mlxcel_spec_decode_width_bucket")]
    assert buckets and buckets[-1].startswith('mlxcel_spec_decode_width_bucket{le="+Inf"}')
    assert float(buckets[-1].split()[-1]) > 0
    assert any(line.startswith("mlxcel_spec_decode_plain_steps_total ") for line in text.splitlines())
