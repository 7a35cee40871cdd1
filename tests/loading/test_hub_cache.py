"""Models named `org/name`, found in a Hugging Face cache laid out as huggingface_hub lays it
(blobs, snapshots of symlinks, refs/main) around the embedded models, with no network."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import httpx
import pytest
from huggingface_hub import constants

from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles import ProfileError, resolve
from tests.support.cli import mlxcel, write
from tests.support.server import serve

REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_model(hub: Path, repo_id: str, source: Path) -> Path:
    """`source`'s files as the cache holds a downloaded repository; the snapshot's path."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf") / "hub"
    cache_model(root, "acme/target", EMBEDDED_TARGET)
    cache_model(root, "acme/drafter", EMBEDDED_DRAFTER)
    return root


@pytest.fixture
def offline(hub: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache in place, and any HTTP request a failure: nothing may be fetched."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a network request was made")

    monkeypatch.setattr(httpx.Client, "send", refuse)
    return hub


def test_flags_and_profiles_resolve_repo_ids_from_the_cache(offline: Path, tmp_path: Path) -> None:
    flags = {"model": "acme/target", "draft_model": "acme/drafter", "draft_kind": "draft-model"}
    settings = resolve("default", flags).settings
    assert settings.target.model == str(offline / "models--acme--target" / "snapshots" / REVISION)
    assert settings.drafter.model == str(offline / "models--acme--drafter" / "snapshots" / REVISION)
    assert settings.server.model_alias == "acme/target"  # the id clients see, as llama-server's -hf
    profile = write(
        tmp_path, "hub", 'target = "acme/target"\n[drafter]\nkind = "draft-model"\nmodel = "acme/drafter"\n'
    )
    from_file = resolve(str(profile)).settings
    assert (from_file.target.model, from_file.drafter.model) == (settings.target.model, settings.drafter.model)
    (tmp_path / "acme" / "target").mkdir(parents=True)  # a directory of that name wins over the cache
    assert resolve(str(profile)).settings.target.model == str(tmp_path / "acme" / "target")


def test_a_model_missing_from_the_cache_names_the_cache_and_fetches_nothing(offline: Path) -> None:
    with pytest.raises(ProfileError) as refused:
        resolve("default", {"model": "acme/absent"})
    message = str(refused.value)
    assert message.startswith(f"flag --model: no directory {Path.cwd() / 'acme/absent'} here, and acme/absent is not")
    assert str(offline / "models--acme--absent") in message and "--hf-download" in message


def test_a_relative_target_found_nowhere_names_both_places(offline: Path, tmp_path: Path) -> None:
    """Next to the profile, then the Hugging Face cache: the message names the two."""
    profile = write(tmp_path, "p", 'target = "mlx/missing"\n')
    with pytest.raises(ProfileError) as refused:
        resolve(str(profile))
    message = str(refused.value)
    assert message.startswith(f"{profile}: target: no directory {tmp_path / 'mlx' / 'missing'} next to the profile")
    assert str(offline / "models--mlx--missing") in message


def test_a_revision_that_leaves_the_cache_is_refused(offline: Path, tmp_path: Path) -> None:
    """refs/main holding `../`: huggingface_hub joins it to the snapshots folder as it is."""
    outside = cache_model(tmp_path / "elsewhere", "evil/model", EMBEDDED_TARGET)
    repo = offline / "models--acme--escape"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "refs").mkdir()
    escape = Path(*[".."] * len((repo / "snapshots").relative_to("/").parts)) / outside.relative_to("/")
    (repo / "refs" / "main").write_text(str(escape))
    with pytest.raises(ProfileError, match=r"acme/escape: the cache's revision names .* not a folder of"):
        resolve("default", {"model": "acme/escape"})


def test_serve_rejects_a_missing_repo_at_startup(hub: Path) -> None:
    result = mlxcel("serve", "-hf", "acme/absent", "--port", "0", env={"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert "acme/absent is not in the Hugging Face cache" in result.stderr and str(hub) in result.stderr


@pytest.mark.slow
def test_serving_a_cached_pair_by_repo_id_answers_as_the_embedded_pair(
    hub: Path, tmp_path: Path, default_server
) -> None:
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    args = ("--hf-repo", "acme/target", "--draft-model", "acme/drafter", "--draft-kind", "draft-model")
    body = {"messages": [{"role": "user", "content": "Write a function"}], "max_tokens": 24, "temperature": 0}
    with serve(tmp_path, *args, env=env) as server, server.client() as http:
        assert http.get("/v1/models").json()["data"][0]["id"] == "acme/target"
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.headers["x-mlxcel-acceptance-rule"] == "greedy-argmax"
    want = default_server.client().post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert answer.json()["choices"][0]["message"]["content"] == want["content"]
