"""What a user of mlx_lm.server or llama-server types, read as they mean it: mlx_lm.server's flags
mapped onto their settings (or accepted as documented no-ops, or refused with the equivalent), no
abbreviated flags, `--chat-template NAME` for the built-in templates, the usage line of `serve`
on a `serve` error, and did-you-mean for a profile's name and its `model` key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import build_parser, parse
from app.loading import EMBEDDED_TARGET
from app.loading.builtin_templates import BUILTIN_TEMPLATES, builtin_source
from app.loading.chat_template import ENVIRONMENT, Limits, render
from app.profiles import ProfileError, resolve, settled
from app.profiles.loader import NO_OP_FLAGS, flags_of
from tests.cli.test_cli_surface import every_parser
from tests.support import ROOT
from tests.support.cli import mlxcel, write
from tests.support.server import serve


def parsed(*words: str) -> dict:
    args = parse(build_parser(["serve"]), ["serve", *words])  # as `mlxcel serve` parses them
    return {dest: value for dest, value in flags_of(args).items() if value is not None}


def test_mlx_lm_servers_flags_set_their_keys() -> None:
    line = (
        "--max-tokens", "16", "--log-level", "DEBUG", "--chat-template-args", '{"enable_thinking": false}',
        "--prompt-cache-size", "7", "--prompt-cache-bytes", "64MB", "--decode-concurrency", "4",
        "--allowed-origins", "http://a.example,https://b.example", "--trust-remote-code", "--kv-bits", "4",
        "--prompt-concurrency", "2", "--prefill-step-size", "512", "--num-draft-tokens", "3", "--temp", "0",
    )  # fmt: skip
    settings = resolve("default", parsed(*line)).settings
    assert (settings.sampling.n_predict, settings.logging.level, settings.server.max_rows) == (16, "debug", 4)
    assert settings.server.chat_template_kwargs == {"enable_thinking": False}
    assert (settings.server.prompt_cache_entries, settings.server.prompt_cache_mb) == (7, 62)  # 64 MB in MiB
    assert settings.server.cors_origins == ["http://a.example", "https://b.example"]
    assert (settings.drafter.num_draft_tokens, settings.sampling.temperature) == (3, 0.0)
    assert parsed("--log-level", "critical") == {"log_level": "error"}


@pytest.mark.parametrize(
    ("words", "needle"),
    [
        (("--adapter-path", "adapters"), "--adapter-path: adapter path does not exist: adapters"),
        (("--lora", "a.gguf"), "--lora: a.gguf is a GGUF LoRA, which only llama.cpp applies"),
        (("--lora-scaled", "a.gguf", "0.5"), "--lora-scaled: a.gguf is a GGUF LoRA"),
        (("--use-default-chat-template",), "--chat-template chatml"),
        (("--chat-templ", "chatml"), "did you mean --chat-template?"),  # no abbreviations
        (("--max-token", "5"), "did you mean --max-tokens?"),
        (("--log-level", "loud"), "expected one of debug"),
        (("--chat-template-args", "[1]"), "expected a JSON object"),
    ],
)
def test_a_refused_or_unknown_flag_says_what_to_do_in_serves_usage(capsys, words: tuple, needle: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parsed(*words)
    assert exited.value.code == 2
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith("usage: mlxcel serve") and needle in said


def test_serve_errors_print_serves_usage() -> None:
    """The process as an operator runs it: `mlxcel serve --bogus` prints serve's usage, not mlxcel's."""
    result = mlxcel("serve", "--max-token", "5")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: mlxcel serve") and "did you mean --max-tokens?" in result.stderr


def test_no_parser_takes_abbreviations() -> None:
    assert all(not parser.allow_abbrev for parser in every_parser(build_parser()))
    for path in [*ROOT.glob("app/**/*.py"), *ROOT.glob("ops/**/*.py")]:
        for call in re.findall(r'ArgumentParser\([^)]*|\.add_parser\("[^)]*', path.read_text()):
            assert "allow_abbrev=False" in call, (path, call)


def test_the_no_op_flags_include_mlx_lm_servers() -> None:
    flags = {name for names in NO_OP_FLAGS for name in names}
    assert {"--trust-remote-code", "--prompt-concurrency", "--prefill-step-size", "--kv-bits", "--pipeline"} <= flags


def test_chat_template_names_a_built_in_template() -> None:
    """`--chat-template chatml` is the built-in ChatML, not a file named chatml (llama-server's
    names); ChatML renders as the embedded model's own template does; an unknown name is refused
    naming --chat-template-file, with the nearest name."""
    settings = settled(resolve("default", parsed("--chat-template", "chatml"))).settings
    assert settings.server.chat_template == "chatml" and settings.server.chat_template_file is None
    variables = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
    chatml = render(ENVIRONMENT.from_string(builtin_source("chatml")), Limits(2.0, 1 << 20), variables)
    assert chatml == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    for name, source in BUILTIN_TEMPLATES.items():  # every one renders a conversation
        turns = [{"role": "system", "content": "S"}, *variables["messages"], {"role": "assistant", "content": "A"}]
        text = render(ENVIRONMENT.from_string(source), Limits(2.0, 1 << 20), variables | tokens | {"messages": turns})
        assert "hi" in text and "A" in text, name
    with pytest.raises(ProfileError, match=r"flag --chat-template: 'chatmll' is no built-in chat template \(did you "
                                           r"mean 'chatml'\?\).*--chat-template-file FILE"):  # fmt: skip
        settled(resolve("default", parsed("--chat-template", "chatmll")))
    with pytest.raises(ProfileError, match="give one chat template"):
        settled(resolve("default", parsed("--chat-template", "chatml", "--chat-template-file", "t.jinja")))


def test_a_misspelt_profile_and_a_model_key_say_what_was_meant(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"profile not found \(did you mean 'default'\?\)"):
        resolve("defualt")
    for text in ('model = "@TARGET@"\n', '[model]\npath = "@TARGET@"\n'):
        profile = write(tmp_path, "p", text)
        with pytest.raises(ProfileError, match=r"model: unknown key \(did you mean 'target'\?"):
            resolve(str(profile))
    reserved = write(tmp_path, "r", 'target = "@TARGET@"\n[server]\nchat_template_kwargs = {tools = 1}\n')
    with pytest.raises(ProfileError, match=r"server\.chat_template_kwargs: 'tools' is not a template variable"):
        resolve(str(reserved))


@pytest.mark.slow
def test_an_mlx_lm_server_launch_line_starts_the_server(tmp_path: Path) -> None:
    """mlx_lm.server's flags, a template given as text with its variables from --chat-template-args:
    /props shows the template in use, and a chat renders through it."""
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    line = (
        "--model", str(EMBEDDED_TARGET), "--max-tokens", "5", "--log-level", "INFO", "--decode-concurrency", "3",
        "--chat-template", template, "--chat-template-args", '{"greeting": "Hello! "}', "--prompt-cache-size", "4",
        "--trust-remote-code", "--temp", "0",
    )  # fmt: skip
    with serve(tmp_path, *line) as server, server.client() as http:
        props = http.get("/props").json()
        prompt = http.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        answer = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert props["chat_template"] == template and props["total_slots"] == 3
    assert props["default_generation_settings"]["n_predict"] == 5
    assert prompt["prompt"] == "Hello! hi"
    assert answer["usage"]["completion_tokens"] <= 5
