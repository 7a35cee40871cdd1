"""The sampler knobs a request sets by name: one list, derived from `SamplingParams`, that the
wire fields and the profile's defaults both hold (app/server/core/requests.py)."""

from __future__ import annotations

from app.profiles.schema import SamplingDefaults
from app.sampling import SamplingParams
from app.server.core.requests import BUILT_APART, SAMPLING_FIELDS
from app.server.core.schemas import SamplingFields


def test_the_knob_lists_stay_equal() -> None:
    params = set(SamplingParams.__struct_fields__)
    assert set(SAMPLING_FIELDS) == params - BUILT_APART and params >= BUILT_APART
    assert set(SAMPLING_FIELDS) <= set(SamplingFields.__struct_fields__)  # a request may set each one
    assert set(SAMPLING_FIELDS) <= set(SamplingDefaults.__struct_fields__)  # and the profile defaults each one
    assert len(SAMPLING_FIELDS) == len(set(SAMPLING_FIELDS))
