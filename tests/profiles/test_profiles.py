"""Deployment profiles: shipped ones check and serve; precedence; each failure names file, key, fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.loading import EMBEDDED_TARGET
from app.profiles import ProfileError, check_models, resolve, shipped_profiles
from ops.models.tiny import build_block_drafter_checkpoint, build_tiny_model
from tests.support.checkpoints import DSPARK
from tests.support.cli import mlxcel, write
from tests.support.server import free_port, serve

SHIPPED = ["default", "target-only", "prompt-lookup", "stochastic", "mtp", "dflash", "dspark", "muse"]
COPY_HEAVY = "x = [1, 2, 3]\ny = [4, 5, 6]\nx = [1, 2, 3]\ny = [4, 5, 6]\nx = [1, 2, 3]\n"
EXPECTED = {  # drafter kind, rule at T > 0, draft_kind in a response's timings
    "default": ("draft-model", "sampler-match", "draft-model"),
    "target-only": ("none", None, None),
    "prompt-lookup": ("prompt-lookup", "sampler-match", "prompt-lookup"),
    "stochastic": ("draft-model", "stochastic", "draft-model"),
    "mtp": ("mtp", "argmax-against-argmax", "mtp"),
    "dflash": ("dflash", "argmax-against-argmax", "dflash"),
    "dspark": ("dflash", None, "dflash"),  # greedy-only: requests that sample are declined
    "muse": ("dflash", "argmax-against-argmax", "dflash"),
}


def test_shipped_profiles_are_the_documented_ones() -> None:
    assert set(SHIPPED) <= set(shipped_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_passes_check(name: str) -> None:
    result = mlxcel("profiles", "check", name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: {name}")


def test_all_shipped_profiles_check_together_on_their_own_ports() -> None:
    assert mlxcel("profiles", "check").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_serving_a_profile_builds_exactly_its_loop(profile_server, name: str) -> None:
    kind, rule, draft_kind = EXPECTED[name]
    server = profile_server(name)
    with server.client() as http:
        props = http.get("/props").json()["mlxcel"]
        assert props["profile"] == name and props["drafter"]["kind"] == kind
        assert props["rule_at_temperature_above_0"] == rule
        (event,) = server.events("acceptance_rule_active")
        assert (event["profile"], event["drafter_kind"], event["rule"]) == (name, kind, rule)
        assert event["profile_file"].endswith(f"profiles/{name}.toml")
        body = http.post("/completion", json={"prompt": COPY_HEAVY, "n_predict": 24, "temperature": 0}).json()
        assert body["timings"].get("draft_kind") == draft_kind


def test_precedence_is_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "p", 'target = "@TARGET@"\n[server]\nport = 8100\nhost = "127.0.0.1"\n')
    assert resolve(str(path)).settings.server.port == 8100
    monkeypatch.setenv("MLXCEL_SERVER__PORT", "8200")
    monkeypatch.setenv("MLXCEL_DRAFTER__KIND", "prompt-lookup")
    resolved = resolve(str(path))
    assert (resolved.settings.server.port, resolved.settings.drafter.kind) == (8200, "prompt-lookup")
    assert resolved.sources["server.port"] == "env" and resolved.sources["server.host"] == "file"
    resolved = resolve(str(path), {"port": 8300, "draft_max": 6})
    assert (resolved.settings.server.port, resolved.settings.drafter.num_draft_tokens) == (8300, 6)
    assert resolved.sources["server.port"] == "flag" and resolved.sources["sampling.top_k"] == "default"
    monkeypatch.setenv("MLXCEL_PROFILE", str(path))
    assert resolve().settings.source == str(path)


def test_llama_server_flags_set_their_keys_and_the_no_op_ones_parse(tmp_path: Path) -> None:
    from app.cli import build_parser
    from app.profiles.loader import flags_of

    line = "serve --seed 7 --temp 0.2 -n 32 -np 3 --alias m -c 4096 -t 8 --draft-min 2 --no-slots --metrics --jinja"
    args = build_parser(["serve"]).parse_args(line.split())
    path = write(tmp_path, "p", 'target = "@TARGET@"\n[sampling]\nseed = 1\ntemperature = 0.5\n')
    resolved = resolve(str(path), flags_of(args))
    settings = resolved.settings
    assert (settings.sampling.seed, settings.sampling.temperature, settings.sampling.n_predict) == (7, 0.2, 32)
    assert (settings.server.max_rows, settings.server.model_alias) == (3, "m")
    assert all(resolved.sources[key] == "flag" for key in ("sampling.seed", "server.max_rows", "server.model_alias"))
    bad = mlxcel("serve", "--profile", str(path), "-np", "0")
    assert bad.returncode == 2 and "flag --parallel:" in bad.stderr  # named as the other flags are


def test_show_prints_each_value_with_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    result = mlxcel("profiles", "show", "default", env={"MLXCEL_SERVER__MAX_ROWS": "3"})
    lines = {line.split("=")[0].strip(): line for line in result.stdout.splitlines() if "=" in line}
    assert lines["drafter.kind"].endswith("# file")
    assert lines["server.max_rows"].split("#")[0].strip().endswith("3") and lines["server.max_rows"].endswith("# env")
    assert lines["sampling.top_k"].endswith("# default")


FAILURES = [
    ('target = "@TARGET@"\n[drafter]\nknd = "none"\n', "drafter.knd: unknown key (did you mean 'kind'?)"),
    ('target = "@TARGET@"\nsampeling = 1\n', "sampeling: unknown key (did you mean 'sampling'?)"),
    ('target = "@TARGET@"\n[server]\nport = "eighty"\n', "server.port: expected `int`, got `str`"),
    ('target = "@TARGET@"\n[server]\nport = 70000\n', "server.port: expected `int` <= 65535"),
    ('target = "@TARGET@"\n[governor]\nfloor = 0.5\n', "governor.floor: expected `float` > 1.0"),
    ('target = "@TARGET@"\n[speculative]\ncoupled = "yes"\n', "speculative.coupled: expected `bool`, got `str`"),
    (
        'target = "@TARGET@"\n[drafter]\nkind = "eagle"\n',
        "drafter.kind: invalid enum value 'eagle' (allowed: none, draft-model, prompt-lookup, mtp, dflash)",
    ),
    ('target = "/nowhere/model"\n', "target: model path does not exist: /nowhere/model"),
    ('target = "@TARGET@"\n[drafter]\nkind = "draft-model"\n', "drafter.model: required for drafter.kind"),
    ('target = "@TARGET@"\n[env]\nMLXCEL_STOCHASTIC = "1"\n', "env.MLXCEL_STOCHASTIC: not an acceptance-rule override"),
    # a request's unknown stage is skipped, as llama-server skips it; a profile's is a typo to report
    ('target = "@TARGET@"\n[sampling]\nsamplers = ["top_k", "tfs_z"]\n', "sampling.samplers[1]: invalid enum value"),
]


@pytest.mark.parametrize(("text", "message"), FAILURES)
def test_bad_profiles_stop_startup_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad", text)
    for command in (("profiles", "check", str(path)), ("serve", "--profile", str(path))):
        result = mlxcel(*command)
        assert result.returncode == 2
        assert str(path) in result.stderr and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1  # one message, nothing half-started


def test_a_drafter_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    drafter = build_tiny_model(tmp_path / "other-vocab", perturb_vocab=True)
    path = write(tmp_path, "p", f'target = "@TARGET@"\n[drafter]\nkind = "draft-model"\nmodel = "{drafter}"\n')
    with pytest.raises(
        ProfileError,
        match=rf"drafter.model: {re.escape(str(drafter))} cannot draft for the target .*: "
        r"its vocabulary differs from the target's .* share a tokenizer",
    ):
        check_models(resolve(str(path)).settings)


def test_a_greedy_only_drafter_with_a_sampling_default_is_refused(tmp_path: Path) -> None:
    dspark = build_block_drafter_checkpoint(tmp_path / "dspark", DSPARK)
    text = f'target = "@TARGET@"\n[drafter]\nkind = "dflash"\nmodel = "{dspark}"\n[sampling]\ntemperature = 0.7\n'
    with pytest.raises(ProfileError, match=r"sampling.temperature: the DSpark drafter is greedy-only.*temperature = 0"):
        check_models(resolve(str(write(tmp_path, "p", text))).settings)
    check_models(resolve(str(write(tmp_path, "q", text.replace("0.7", "0.0")))).settings)
    lossless = text.replace("[sampling]", 'block_rule = "lossless"\n[sampling]')
    check_models(resolve(str(write(tmp_path, "r", lossless))).settings)  # lossless rules: DSpark samples too
    unknown = write(tmp_path, "s", lossless.replace('"lossless"', '"exact"'))
    refusal = f"{unknown}: drafter.block_rule: invalid enum value 'exact' (allowed: argmax-against-argmax, lossless)"
    with pytest.raises(ProfileError, match=re.escape(refusal)):
        resolve(str(unknown))


TENSOR = '[target]\nmodel = "@TARGET@"\nparallel = "tensor"\nworld_size = 2\n'
TENSOR_FAILURES = [
    (TENSOR.replace("world_size = 2", "world_size = 1"), "target.world_size: tensor parallel needs world_size >= 2"),
    (
        TENSOR.replace('parallel = "tensor"', 'parallel = "none"'),
        'target.world_size: 2 ranks, but target.parallel is "none"',
    ),
    (
        TENSOR.replace('"tensor"', '"pipeline"'),
        "target.parallel: invalid enum value 'pipeline' (allowed: none, tensor)",
    ),
    (
        TENSOR.replace("world_size = 2", "world_size = 3"),
        "target.world_size: the target's num_attention_heads (4) does not",
    ),
]


def test_tensor_parallel_keys_resolve_and_bad_ones_name_file_and_key(tmp_path: Path) -> None:
    settings = resolve(str(write(tmp_path, "tensor", TENSOR))).settings
    assert (settings.target.model, settings.target.parallel, settings.target.world_size) == (
        str(EMBEDDED_TARGET), "tensor", 2,
    )  # fmt: skip
    check_models(settings)
    for i, (text, message) in enumerate(TENSOR_FAILURES):
        path = write(tmp_path, f"bad{i}", text)
        with pytest.raises(ProfileError, match=re.escape(f"{path}: {message}")):
            check_models(resolve(str(path)).settings)


@pytest.mark.slow
def test_two_profiles_on_one_port(tmp_path: Path) -> None:
    port = free_port()
    a = write(tmp_path, "a", f'target = "@TARGET@"\n[server]\nport = {port}\n')
    b = write(tmp_path, "b", f'target = "@TARGET@"\n[drafter]\nkind = "prompt-lookup"\n[server]\nport = {port}\n')
    checked = mlxcel("profiles", "check", str(a), str(b))
    assert checked.returncode == 2 and f"{b}: server.port:" in checked.stderr and str(a) in checked.stderr
    with serve(tmp_path, "--profile", str(a)) as running:
        taken = running.url.rsplit(":", 1)[1]
        second = mlxcel("serve", "--profile", str(b), "--port", taken)
        assert second.returncode == 2
        assert f"flag --port: port {taken} on 127.0.0.1 is already in use" in second.stderr  # the flag set it
        assert f"pid {running.process.pid} (" in second.stderr  # who holds it
        # a profile of the port the server holds (as its own profile is): checking it before a
        # reload passes, with a warning naming the holder; --strict makes it the error `serve` meets
        held = write(tmp_path, "held", f'target = "@TARGET@"\n[server]\nport = {taken}\n')
        check = mlxcel("profiles", "check", str(held))
        assert check.returncode == 0 and check.stdout.startswith("ok: held ")
        assert check.stderr.startswith(f"warning: {held}: server.port: port {taken} on 127.0.0.1 is already in use")
        assert f"pid {running.process.pid} (" in check.stderr
        strict = mlxcel("profiles", "check", "--strict", str(held))
        assert strict.returncode == 2
        assert f"{held}: server.port: port {taken} on 127.0.0.1 is already in use" in strict.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "rule"), [("stochastic", "stochastic"), ("default", "sampler-match")])
def test_the_profile_env_table_switches_the_rule(profile_server, profile: str, rule: str) -> None:
    """The shipped stochastic profile is the default one plus an [env] table that switches the rule."""
    server = profile_server(profile)
    with server.client() as http:
        (startup,) = server.events("acceptance_rule_active")
        assert startup["rule"] == rule
        response = http.post(
            "/completion", json={"prompt": "def f(x):\n", "n_predict": 24, "temperature": 0.7, "seed": 1}
        )
        event = server.wait_for_event("speculative_request", response.headers["x-request-id"])
        assert event["rule"] == rule
        assert json.loads(json.dumps(startup["env_overrides"])) == (
            {"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "1"} if profile == "stochastic" else {}
        )
