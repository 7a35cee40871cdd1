"""A llama-server launch line copied from a tutorial starts this server: each flag honoured or
accepted as a documented no-op (`mlxcel serve --help` says why for each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import build_parser
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.profiles.loader import NO_OP_FLAGS, flags_of, resolve
from tests.support.server import serve

LAUNCH = [
    "-m", str(EMBEDDED_TARGET), "-md", str(EMBEDDED_DRAFTER), "-ngl", "99", "-fa", "on", "-c", "4096", "-np", "4",
    "--host", "127.0.0.1", "--api-key", "K", "--embeddings", "--top-k", "40", "--temp", "0.7", "--no-webui",
]  # fmt: skip


@pytest.mark.slow
def test_a_llama_server_launch_line_starts_the_server(tmp_path: Path) -> None:
    with serve(tmp_path, *LAUNCH) as server, server.client(headers={"Authorization": "Bearer K"}) as http:
        props = http.get("/props").json()
        defaults = props["default_generation_settings"]
        assert (defaults["top_k"], defaults["temperature"], props["total_slots"]) == (40, 0.7, 4)
        assert props["mlxcel"]["drafter"]["kind"] == "draft-model"  # -md: the draft model, its kind read
        assert http.post("/v1/embeddings", json={"input": "hi"}).status_code == 200  # --embeddings
        assert http.get("/").status_code == 404  # --no-webui
        assert http.post("/completion", json={"prompt": "x", "n_predict": 1}).status_code == 200
        assert server.client().post("/completion", json={"prompt": "x", "n_predict": 1}).status_code == 401


def parsed(line: str) -> dict:
    args = build_parser(["serve"]).parse_args(["serve", *line.split()])
    return {dest: value for dest, value in flags_of(args).items() if value is not None}


def test_ngl_is_its_own_flag_not_n_with_a_value() -> None:
    """`-ngl 99` once read as `-n gl` ("invalid int value: 'gl'")."""
    assert parsed("-ngl 99 -n 16") == {"n_predict": 16}
    assert parsed("-ngl all -fa -c 8192") == {}  # -fa with no value, as older builds spell it
    assert parsed("--ctx-size=4096 --flash-attn auto --mlock -t 8") == {}


def test_flags_with_a_meaning_here_set_their_keys() -> None:
    line = (
        "-md models/drafter --draft-max 6 --draft-min 2 --draft-p-min 0.3 --embeddings --pooling last "
        "--top-k 20 --top-p 0.9 --min-p 0.1 --repeat-penalty 1.1 --chat-template-file t.jinja --no-webui -v "
        "-s 5 -a m --samplers top_k;temp;min-p --reasoning-format none"
    )
    settings = resolve("default", parsed(line)).settings
    assert settings.drafter.model == "models/drafter"
    assert (settings.drafter.num_draft_tokens, settings.drafter.min_draft_tokens, settings.drafter.p_min) == (6, 2, 0.3)
    assert (settings.server.embeddings, settings.server.embeddings_pooling, settings.server.web_ui) == (
        True,
        "last",
        False,
    )
    sampling = settings.sampling
    assert (sampling.top_k, sampling.top_p, sampling.min_p, sampling.repeat_penalty) == (20, 0.9, 0.1, 1.1)
    assert sampling.samplers == ["top_k", "temperature", "min_p"]  # the command line reads the aliases
    assert (sampling.seed, settings.server.model_alias, settings.logging.level) == (5, "m", "debug")
    assert (settings.server.chat_template_file, settings.server.reasoning_format) == ("t.jinja", "none")


def test_every_no_op_flag_says_why_in_help(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser(["serve"]).parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for names in NO_OP_FLAGS:
        assert names[-1] in help_text
    assert help_text.count("no effect:") == len(NO_OP_FLAGS)


def test_an_unknown_sampler_on_the_command_line_is_an_error(capsys) -> None:
    with pytest.raises(SystemExit):
        parsed("--samplers top_k;tfs_z")
    assert "unknown sampler 'tfs_z'" in capsys.readouterr().err
