"""A router's profiles (`[router]`, `--models-dir`): read and checked at startup, each failure naming
the router's file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.profiles import ProfileError, resolve
from app.profiles.routing import routed_profiles
from tests.support.cli import mlxcel, write

TARGET_ONLY = 'target = "@TARGET@"\n[drafter]\nkind = "none"\n'
DEFAULT = '[[router.models]]\nprofile = "default"\n'


def routed(tmp_path: Path, text: str, **flags: str) -> list:
    return routed_profiles(resolve(str(write(tmp_path, "router", text)), flags))


def test_models_are_named_by_their_profile_unless_named(tmp_path: Path) -> None:
    write(tmp_path, "mine", TARGET_ONLY)
    text = DEFAULT + '[[router.models]]\nprofile = "mine.toml"\nname = "m"\naliases = ["n"]\n'
    profiles = routed(tmp_path, text)
    assert [(p.name, p.aliases) for p in profiles] == [("default", ()), ("m", ("n",))]
    assert [p.settings.server.model_alias for p in profiles] == ["default", "m"]  # answers say the routed name
    assert profiles[1].path == tmp_path / "mine.toml"  # relative to the router's file


def test_a_models_dir_routes_each_profile_by_its_file_name(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("b", "a"):
        write(models, name, TARGET_ONLY)
    assert [p.name for p in routed(tmp_path, "", models_dir=str(models))] == ["a", "b"]
    assert routed(tmp_path, "") == []  # no router: one profile, as before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[router.models]]\nprofile = "nope"\n',
            "router.toml: router.models[0].profile: {profiles}/nope.toml: profile not found",
        ),
        (
            DEFAULT + '[[router.models]]\nprofile = "target-only"\naliases = ["default"]\n',
            "router.toml: router.models[1]: 'default' names two models; give each model its own name",
        ),
        ('[[router.models]]\nprofile = "router.toml"\n', "has a [router] table of its own"),
        ('[[router.models]]\nprofle = "default"\n', "router.toml: router.models[0]: object contains unknown field"),
        ('[router]\nmodels_dir = "nowhere"\n', "router.toml: router.models_dir: {tmp}/nowhere is not a directory"),
    ],
)
def test_a_bad_router_table_names_its_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ProfileError) as failure:
        routed(tmp_path, text)
    profiles = Path(resolve("default").settings.source).parent
    assert message.format(tmp=tmp_path, profiles=profiles) in str(failure.value)


def test_profiles_check_checks_the_routed_profiles(tmp_path: Path) -> None:
    result = mlxcel("profiles", "check", str(write(tmp_path, "router", '[[router.models]]\nprofile = "nope"\n')))
    assert result.returncode == 2
    assert "router.models[0].profile" in result.stderr
