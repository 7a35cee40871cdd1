"""The loop plan: one function decides the rule; every reader reports what the loops run."""

from __future__ import annotations

import os
import re
from typing import get_args

import msgspec
import pytest

from app.decoding.builder import RowRequest
from app.decoding.plan import SamplerClass, plan_from_settings
from app.drafters.kinds import DrafterKind
from app.engine.engine import Engine
from app.profiles import resolve, shipped_profiles
from app.profiles.schema import STOCHASTIC_ACCEPT_ENV, DrafterKindName
from app.sampling import SamplingParams
from app.server.native.props import drafter_info
from tests.support import ROOT

APP = ROOT / "app"
SAMPLERS = {SamplerClass.ARGMAX: 0.0, SamplerClass.SAMPLED: 0.7}
# Process setup before any library reads them (app/__init__.py, the BLAS preload): not settings.
ENV_WRITES_ALLOWED = {"app/__init__.py", "app/runtime/blas.py"}


@pytest.mark.parametrize("name", shipped_profiles())
def test_the_plan_states_the_rule_each_request_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STOCHASTIC_ACCEPT_ENV, raising=False)
    engine = Engine(resolve(name).settings)
    engine.host.load()
    tokens = list(engine.host.target.tokenizer.encode("def add(a, b):\n"))
    info = drafter_info(engine.settings, engine.plan)
    assert info.rule_at_temperature_0 == engine.plan.rules[SamplerClass.ARGMAX]
    assert info.rule_at_temperature_above_0 == engine.plan.rules[SamplerClass.SAMPLED]
    for sampler, temperature in SAMPLERS.items():
        request = RowRequest(tokens, SamplingParams(temperature=temperature), max_tokens=8, seed=3)
        generation = engine.host.builder.build(request)
        generation.prefill()
        while not generation.finished:
            generation.step()
        ran = generation.speculation.rule
        assert ran == engine.plan.rule(request.sampling) == engine.plan.rules[sampler], sampler
        assert generation.speculation.coupled is engine.plan.couplings[sampler], sampler
    assert info.coupled_at_temperature_above_0 is engine.plan.couplings[SamplerClass.SAMPLED]


def test_the_plan_couples_the_drafts_of_sampler_match_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Coupled drafts where the target's own draw decides every token (sampler-match); not under the
    stochastic rule (its uniforms must not see the drafts), argmax rules or prompt lookup (which
    draws nothing); and nowhere with speculative.coupled = false."""
    monkeypatch.delenv(STOCHASTIC_ACCEPT_ENV, raising=False)

    def coupled(name: str, **drafter: str) -> bool:
        settings = resolve(name).settings
        settings = msgspec.structs.replace(settings, drafter=msgspec.structs.replace(settings.drafter, **drafter))
        plan = plan_from_settings(settings, environ={})
        assert plan.couplings[SamplerClass.ARGMAX] is False
        return plan.couplings[SamplerClass.SAMPLED]

    assert coupled("default") and coupled("mtp", block_rule="lossless") and coupled("muse", block_rule="lossless")
    assert not any(coupled(name) for name in ("target-only", "stochastic", "prompt-lookup", "mtp", "muse"))
    monkeypatch.setenv("MLXCEL_SPECULATIVE__COUPLED", "false")
    resolved = resolve("default")
    assert resolved.sources["speculative.coupled"] == "env" and not coupled("default")


def test_block_profiles_serve_argmax_against_argmax_at_temperature_0() -> None:
    """/props used to say greedy-argmax here while the block loops ran argmax-against-argmax."""
    for name in ("mtp", "dflash", "dspark", "muse"):
        assert plan_from_settings(resolve(name).settings).rules[SamplerClass.ARGMAX] == "argmax-against-argmax"


@pytest.mark.parametrize("temperature", SAMPLERS.values())
def test_props_and_the_request_event_agree(default_server, temperature: float) -> None:
    with default_server.client() as http:
        props = http.get("/props").json()["mlxcel"]
        response = http.post("/completion", json={"prompt": "def f(x):\n", "n_predict": 16, "temperature": temperature,
                                                  "seed": 5})  # fmt: skip
    event = default_server.wait_for_event("speculative_request", response.headers["x-request-id"])
    key = "rule_at_temperature_0" if temperature == 0 else "rule_at_temperature_above_0"
    assert event["rule"] == props[key]
    assert event["coupled"] is (temperature > 0 and props["coupled_at_temperature_above_0"])
    started = default_server.events("acceptance_rule_active")[0]
    assert started["rule_at_temperature_0"] == props["rule_at_temperature_0"]
    assert started["rule"] == props["rule_at_temperature_above_0"]
    assert started["coupled"] is props["coupled_at_temperature_above_0"] is True


def test_no_code_writes_the_process_environment() -> None:
    writes = re.compile(r"os\.environ\[[^\]]*\]\s*=|os\.environ\.(update|setdefault|pop|clear)\(|putenv|unsetenv")
    found = [
        f"{path.relative_to(APP.parent)}:{n}"
        for path in APP.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if writes.search(line) and str(path.relative_to(APP.parent)) not in ENV_WRITES_ALLOWED
    ]
    assert found == []


def test_building_a_server_leaves_os_environ_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STOCHASTIC_ACCEPT_ENV, raising=False)
    before = dict(os.environ)
    engine = Engine(resolve("stochastic").settings)  # its [env] table sets the stochastic switch
    engine.host.load()
    assert engine.plan.switches.stochastic_accept
    assert dict(os.environ) == before


@pytest.mark.parametrize(("table", "process", "expected"), [("0", "1", False), ("1", "0", True), (None, "1", True)])
def test_the_profile_env_table_wins_over_the_process_environment(table, process, expected) -> None:
    settings = resolve("default").settings
    env = {} if table is None else {STOCHASTIC_ACCEPT_ENV: table}
    settings = msgspec.structs.replace(settings, env=env)
    plan = plan_from_settings(settings, environ={STOCHASTIC_ACCEPT_ENV: process})
    assert plan.switches.stochastic_accept is expected
    assert plan.rules[SamplerClass.SAMPLED] == ("stochastic" if expected else "sampler-match")


def test_the_profile_schema_and_the_drafters_name_the_same_kinds() -> None:
    assert list(get_args(DrafterKindName)) == [kind.value for kind in DrafterKind]
