"""A named profile served on another target (`--profile NAME -m DIR`) keeps its drafter, or stops
at startup naming both when its drafter cannot pair with DIR; a bench arm whose server serves
another drafter than its profile's, or whose drafter cannot pair, is an error, not a row (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.loading import EMBEDDED_TARGET
from ops.bench.concurrency import Target
from ops.bench.spawn import expected_drafter, require_drafter, spawned_server
from ops.models.grown import build_grown
from tests.support import ROOT
from tests.support.cli import mlxcel
from tests.support.server import RunningServer, serve

SMALL = {"hidden": 384, "heads": 6, "kv_heads": 3, "intermediate": 768, "layers": 16}


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory):
    """The embedded target grown a little (ops/models/grown.py), its block drafters with it."""
    return build_grown(tmp_path_factory.mktemp("grown") / "small", **SMALL)


@pytest.mark.slow
def test_a_named_profile_drafts_on_another_target(tmp_path: Path, grown) -> None:
    with serve(tmp_path, "--profile", "default", "-m", str(grown.target)) as server, server.client() as http:
        (startup,) = server.events("acceptance_rule_active")
        assert startup["drafter_kind"] == "draft-model"
        body = http.post("/completion", json={"prompt": "def add(a, b):\n", "n_predict": 16, "temperature": 0})
        assert body.status_code == 200 and body.json()["timings"]["draft_n"] > 0
        require_drafter(server.url, "default on the grown target", expected_drafter("default"))
        with pytest.raises(RuntimeError, match=r"mtp arm: the server drafts with 'draft-model' .*, not the 'mtp'"):
            require_drafter(server.url, "mtp arm", "mtp")


@pytest.mark.parametrize(
    ("profile", "problem"),
    [
        ("mtp", "hidden_size 256 differs from the target's 384"),
        ("dflash", "hidden_size 256 differs from the target's 384"),
    ],
)
def test_a_profile_drafter_that_cannot_pair_stops_startup_naming_both(grown, profile: str, problem: str) -> None:
    """Its models are only read (config.json, tokenizer.json): refused before anything loads."""
    result = mlxcel("serve", "--profile", profile, "-m", str(grown.target))
    assert result.returncode == 2
    profile_file, drafter = ROOT / "profiles" / f"{profile}.toml", ROOT / "models" / profile
    assert result.stderr.strip() == (
        f"error: {profile_file}: drafter.model: {drafter} cannot draft for the target {grown.target} (flag --model): "
        f"{problem} (a block drafter reads the target's hidden states and borrows its embedding and lm_head); "
        "use a drafter made for this target"
    )


def test_the_grown_drafter_pairs_with_the_grown_target_and_not_the_embedded(grown) -> None:
    result = mlxcel("profiles", "check", "mtp")  # the shipped pair still pairs
    assert result.returncode == 0, result.stderr
    refused = mlxcel("serve", "--profile", "mtp", "-md", str(grown.drafters["mtp"]))
    assert refused.returncode == 2
    assert f"cannot draft for the target {EMBEDDED_TARGET}" in refused.stderr
    assert "hidden_size 384 differs from the target's 256" in refused.stderr


def test_a_bench_arm_whose_server_serves_no_drafter_is_an_error(target_only_server: RunningServer) -> None:
    require_drafter(target_only_server.url, "target-only", expected_drafter("target-only"))
    with pytest.raises(RuntimeError, match=r"default: the server drafts with 'none' .*, not the 'draft-model'"):
        require_drafter(target_only_server.url, "default", expected_drafter("default"))


def test_a_bench_arm_whose_drafter_cannot_pair_stops_with_the_servers_error(grown) -> None:
    """The bench's own spawn path: the server exits at startup, and the error quotes its stderr."""
    with pytest.raises(RuntimeError) as failed, spawned_server("mtp", args=["-m", str(grown.target)]):
        pass
    assert "did not become healthy (exit 2)" in str(failed.value)
    assert f"{ROOT / 'models' / 'mtp'} cannot draft for the target {grown.target}" in str(failed.value)


def test_the_bench_serves_each_profile_with_the_grown_copy_of_its_block_drafter(grown) -> None:
    """`--target grown-1.2b`: a block drafter's profile gets its grown copy (`-md`); the draft
    model and prompt lookup pair by vocabulary and keep the profile's."""
    target = Target(grown.target, grown.drafters)
    assert target.flags("mtp") == ["-m", str(grown.target), "-md", str(grown.drafters["mtp"])]
    assert target.flags("dspark") == ["-m", str(grown.target), "-md", str(grown.drafters["dspark"])]
    for profile in ("default", "prompt-lookup", "target-only"):
        assert target.flags(profile) == ["-m", str(grown.target)], profile
    assert Target(None).flags("mtp") == []
