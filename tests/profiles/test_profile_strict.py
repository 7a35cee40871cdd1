"""A bad profile, environment variable or flag stops `serve` and `profiles check` with exit code 2
and exactly one line naming where the bad value came from: never a traceback, never defaults."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from app.cli import main
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles import resolve
from tests.support.cli import mlxcel, write
from tests.support.server import free_port

TARGET_ONLY = 'target = "@TARGET@"\n'


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """`mlxcel ARGS` in this process (app.cli.main, what `python -m app` runs) with a clean
    environment plus `env`: asserts exit 2 and one line on stderr; returns that line.

    In-process keeps each case fast; an exception escaping main (a traceback) fails the test.
    """

    def refused(*args: str, env: dict[str, str] | None = None) -> str:
        for name in [n for n in os.environ if n.startswith("MLXCEL_")]:
            monkeypatch.delenv(name)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        assert main(list(args)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    return refused


def refused_in_a_process(*args: str, env: dict[str, str] | None = None) -> str:
    """`python -m app ARGS` in a subprocess: exit 2, one line on stderr, no traceback."""
    result = mlxcel(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def assert_refused(
    refused: Callable[..., str],
    profile: Path | str,
    *expected: str,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> None:
    """`serve` and `profiles check` (unless `flags`, which only `serve` takes) refuse `profile`."""
    commands = [] if flags else [("profiles", "check", str(profile))]
    commands.append(("serve", "--profile", str(profile), *flags))
    for command in commands:
        line = refused(*command, env=env)
        for text in expected:
            assert text in line, (command, line)


def model_copy(tmp_path: Path, source: Path, name: str, **replaced: str) -> Path:
    """`source` as a new directory of links, with some files' text replaced."""
    directory = tmp_path / name
    directory.mkdir()
    for item in source.iterdir():
        (directory / item.name).symlink_to(item)
    for file_name, text in replaced.items():
        (directory / file_name).unlink()
        (directory / file_name).write_text(text)
    return directory


# --- 1. values are data: no dynaconf casts, templates or includes ------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MLXCEL_SERVER__PORT", "@int abc"),  # was a DynaconfParseError traceback
        ("MLXCEL_SERVER__PORT", "@int 8080"),  # was silently cast
        ("MLXCEL_SERVER__MODEL_ALIAS", "@jinja {{ 7 * 7 }}"),  # was rendered to '49'
        ("MLXCEL_LOGGING__DESTINATION", "@format {env[HOME]}/mlxcel.log"),
    ],
)
def test_an_at_cast_in_the_environment_is_refused(
    cli: Callable[..., str], tmp_path: Path, variable: str, value: str
) -> None:
    profile = write(tmp_path, "p", TARGET_ONLY)
    assert_refused(
        cli, profile, f"environment: {variable}: {value!r}: @-casts are not supported", env={variable: value}
    )


def test_at_casts_in_a_real_process_are_one_line(tmp_path: Path) -> None:
    """The issue's case end to end: `@int abc` was a DynaconfParseError traceback."""
    profile = write(tmp_path, "p", TARGET_ONLY)
    for command in (("serve", "--profile", str(profile)), ("profiles", "check", str(profile))):
        line = refused_in_a_process(*command, env={"MLXCEL_SERVER__PORT": "@int abc"})
        assert line.startswith("error: environment: MLXCEL_SERVER__PORT: '@int abc': @-casts are not supported")


def test_strings_from_profile_and_environment_are_never_evaluated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = "@jinja {{ 7 * 7 }}"  # dynaconf rendered it to '49'
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\nmodel_alias = "{template}"\n')
    assert resolve(str(profile)).settings.server.model_alias == template
    monkeypatch.setenv("MLXCEL_SERVER__MODEL_ALIAS", f'"{template}"')  # quoted: a TOML string, taken as is
    resolved = resolve(str(profile))
    assert (resolved.settings.server.model_alias, resolved.sources["server.model_alias"]) == (template, "env")


def test_a_profile_cannot_include_python(cli: Callable[..., str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    profile = write(tmp_path, "p", 'dynaconf_include = ["evil.py"]\n' + TARGET_ONLY)
    assert_refused(cli, profile, f"{profile}: dynaconf_include: unknown key")
    assert not marker.exists()


# --- 2. non-finite numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[sampling]\npresence_penalty = nan\n", "sampling.presence_penalty: nan is not a finite number"),
        ("[sampling]\nfrequency_penalty = -inf\n", "sampling.frequency_penalty: -inf is not a finite number"),
        ("[sampling]\ntemperature = inf\n", "sampling.temperature: inf is not a finite number"),
        ('[sampling]\ntemperature = "inf"\n', "sampling.temperature: inf is not a finite number"),
        ("[governor]\nfloor = nan\n", "governor.floor: expected `float` > 1.0"),
        ("[server]\ndrain_timeout_s = inf\n", "server.drain_timeout_s: expected `float` <= 3600.0"),
        ("[server]\ntemplate_timeout_s = nan\n", "server.template_timeout_s: expected `float` > 0.0"),
    ],
)
def test_non_finite_numbers_in_a_profile_are_refused(
    cli: Callable[..., str], tmp_path: Path, text: str, expected: str
) -> None:
    profile = write(tmp_path, "p", TARGET_ONLY + text)
    assert_refused(cli, profile, f"{profile}: {expected}")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MLXCEL_SAMPLING__PRESENCE_PENALTY", "nan"),
        ("MLXCEL_SAMPLING__REPEAT_PENALTY", "inf"),
        ("MLXCEL_SAMPLING__FREQUENCY_PENALTY", "-inf"),
    ],
)
def test_non_finite_numbers_in_the_environment_are_refused(
    cli: Callable[..., str], tmp_path: Path, variable: str, value: str
) -> None:
    profile = write(tmp_path, "p", TARGET_ONLY)
    assert_refused(cli, profile, f"environment: {variable}: {value} is not a finite number", env={variable: value})


# --- 3. a profile is a .toml file -----------------------------------------------------------------


def test_a_profile_path_must_be_a_toml_file(cli: Callable[..., str], tmp_path: Path) -> None:
    conf = tmp_path / "mine.conf"
    conf.write_text(f'target = "{EMBEDDED_TARGET}"\n')
    assert_refused(cli, conf, f"{conf}: not a .toml file")
    assert_refused(cli, "/etc/passwd", "/etc/passwd: not a .toml file")
    assert_refused(cli, tmp_path, f"{tmp_path}: is a directory")
    assert_refused(cli, tmp_path / "absent.toml", f"{tmp_path / 'absent.toml'}: no such profile file")
    assert_refused(cli, "mine/absent.toml", "mine/absent.toml: no such profile file (")  # where it looked
    assert_refused(cli, "absent", "profiles/absent.toml: profile not found (shipped profiles: ")  # a name


def test_a_profile_that_is_not_utf8_is_refused(cli: Callable[..., str], tmp_path: Path) -> None:
    profile = tmp_path / "latin.toml"
    profile.write_bytes(b'target = "caf\xe9"\n')
    assert_refused(cli, profile, f"{profile}: not UTF-8 text")


# --- 4. an empty API key is an error, not "no auth" -----------------------------------------------


@pytest.mark.parametrize("key", ['""', '"   "'])
def test_an_empty_api_key_in_a_profile_is_refused(cli: Callable[..., str], tmp_path: Path, key: str) -> None:
    profile = write(tmp_path, "p", f"{TARGET_ONLY}[server]\napi_key = {key}\n")
    assert_refused(cli, profile, f"{profile}: server.api_key: empty API key")


def test_an_empty_api_key_from_environment_or_flag_is_refused(cli: Callable[..., str], tmp_path: Path) -> None:
    profile = write(tmp_path, "p", TARGET_ONLY)
    assert_refused(
        cli, profile, "environment: MLXCEL_SERVER__API_KEY: empty API key", env={"MLXCEL_SERVER__API_KEY": ""}
    )
    assert_refused(cli, profile, "flag --api-key: empty API key", flags=("--api-key", ""))


def test_an_empty_key_in_api_keys_is_refused(cli: Callable[..., str], tmp_path: Path) -> None:
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\napi_keys = ["k1", " "]\n')
    assert_refused(cli, profile, f"{profile}: server.api_keys: an empty API key")


def test_a_key_file_that_is_missing_or_holds_no_key_is_refused(cli: Callable[..., str], tmp_path: Path) -> None:
    """A relative key file in a profile is relative to the profile; one of only comments would
    serve with no key at all, so it is refused as an empty key is."""
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\napi_key_file = "keys.txt"\n')
    keys = tmp_path / "keys.txt"
    assert_refused(cli, profile, f"{profile}: server.api_key_file: cannot read the key file {keys}: No such file")
    keys.write_text("# no keys yet\n\n")
    assert_refused(cli, profile, f"{profile}: server.api_key_file: {keys} holds no key")
    keys.write_text("# the one key\n  k1  \n")
    assert resolve(str(profile)).settings.server.api_key_file == str(keys)


@pytest.mark.parametrize("entry", ['"app.example"', '"https://app.example/"', '"https://app.example/page"', '""'])
def test_a_cors_origin_that_is_not_an_origin_is_refused(cli: Callable[..., str], tmp_path: Path, entry: str) -> None:
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\ncors_origins = ["*", {entry}]\n')
    assert_refused(cli, profile, f"{profile}: server.cors_origins: {json.loads(entry)!r} is not an origin")
    env = {"MLXCEL_SERVER__CORS_ORIGINS": f"[{entry}]"}
    assert_refused(cli, write(tmp_path, "q", TARGET_ONLY), "environment: MLXCEL_SERVER__CORS_ORIGINS: ", env=env)


def test_a_star_beside_listed_cors_origins_is_refused(cli: Callable[..., str], tmp_path: Path) -> None:
    """ "*" answers every origin without credentials: the listed origin would silently lose its."""
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\ncors_origins = ["*", "https://app.example"]\n')
    assert_refused(cli, profile, f'{profile}: server.cors_origins: "*" beside listed origins')


@pytest.mark.parametrize("entry", ['"proxy.example:8080"', '"http://proxy.example"', '"a b"', '""', '"::1"'])
def test_an_allowed_host_that_is_not_a_host_name_is_refused(
    cli: Callable[..., str], tmp_path: Path, entry: str
) -> None:
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[server]\nallowed_hosts = ["proxy.example", {entry}]\n')
    assert_refused(cli, profile, f"{profile}: server.allowed_hosts: {json.loads(entry)!r} is not a host name")


# --- 5. errors name the source that set the value --------------------------------------------------


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({"MLXCEL_SERVER__PORT": "abc"}, (), "environment: MLXCEL_SERVER__PORT: expected `int`, got `str`"),
        ({"MLXCEL_TARGET": "/nowhere"}, (), "environment: MLXCEL_TARGET: model path does not exist: /nowhere"),
        ({"MLXCEL_DRAFTER__KIND": "eagle"}, (), "environment: MLXCEL_DRAFTER__KIND: invalid enum value 'eagle'"),
        ({}, ("--draft-max", "0"), "flag --draft-max: expected `int` >= 1"),
        ({}, ("--draft-model", "/nowhere"), "flag --draft-model: model path does not exist: /nowhere"),
        ({}, ("--model", "/nowhere"), "flag --model: model path does not exist: /nowhere"),
    ],
)
def test_errors_name_the_environment_variable_or_flag(
    cli: Callable[..., str], tmp_path: Path, env: dict[str, str], flags: tuple[str, ...], expected: str
) -> None:
    profile = write(tmp_path, "p", TARGET_ONLY)
    assert_refused(cli, profile, expected, flags=flags, env=env)
    assert str(profile) not in cli("serve", "--profile", str(profile), *flags, env=env)


# --- 6. no tracebacks: model files, log destination -----------------------------------------------


def test_a_broken_drafter_tokenizer_is_one_line(cli: Callable[..., str], tmp_path: Path) -> None:
    for name, text in (("not-json", "{not json"), ("not-object", "[1, 2]")):
        drafter = model_copy(tmp_path, EMBEDDED_DRAFTER, name, **{"tokenizer.json": text})
        profile = write(tmp_path, name, f'{TARGET_ONLY}[drafter]\nkind = "draft-model"\nmodel = "{drafter}"\n')
        assert_refused(
            cli, profile, f"{profile}: drafter.model: {drafter}/tokenizer.json is not a valid tokenizer.json"
        )


def test_a_broken_target_tokenizer_is_one_line(cli: Callable[..., str], tmp_path: Path) -> None:
    target = model_copy(tmp_path, EMBEDDED_TARGET, "target", **{"tokenizer.json": '{"model": []}'})
    profile = write(tmp_path, "p", f'target = "{target}"\n')
    assert_refused(cli, profile, f"{profile}: target: {target}/tokenizer.json is not a valid tokenizer.json")


def test_a_target_that_is_a_file_is_one_line(cli: Callable[..., str], tmp_path: Path) -> None:
    profile = write(tmp_path, "p", f'target = "{EMBEDDED_TARGET}/config.json"\n')
    assert_refused(cli, profile, f"{profile}: target: not a model directory (a file was given)")


def test_a_config_json_mlx_lm_cannot_load_is_one_line(tmp_path: Path) -> None:
    config = json.loads((EMBEDDED_TARGET / "config.json").read_text()) | {"hidden_size": "wide"}
    target = model_copy(tmp_path, EMBEDDED_TARGET, "target", **{"config.json": json.dumps(config)})
    profile = write(tmp_path, "p", f'target = "{target}"\n')
    line = refused_in_a_process("serve", "--profile", str(profile), "--port", str(free_port()))  # was exit 1, TypeError
    assert f"cannot load {target} as an mlx-lm model: TypeError" in line


@pytest.mark.parametrize(
    ("destination", "expected"),
    [("@TMP@/missing/mlxcel.log", "directory @TMP@/missing does not exist"), ("@TMP@", "@TMP@ is a directory")],
)
def test_an_unusable_log_destination_is_one_line(
    cli: Callable[..., str], tmp_path: Path, destination: str, expected: str
) -> None:
    destination, expected = destination.replace("@TMP@", str(tmp_path)), expected.replace("@TMP@", str(tmp_path))
    profile = write(tmp_path, "p", f'{TARGET_ONLY}[logging]\ndestination = "{destination}"\n')
    assert_refused(cli, profile, f"{profile}: logging.destination: {expected}")
    env = {"MLXCEL_LOGGING__DESTINATION": destination}
    assert_refused(
        cli, write(tmp_path, "q", TARGET_ONLY), f"environment: MLXCEL_LOGGING__DESTINATION: {expected}", env=env
    )
