"""The curl examples in docs/ work as printed (against a live server on the default profile)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest

from tests.support import ROOT

DOCS = ROOT / "docs"
PRINTED_URL = "http://127.0.0.1:8080"


def curl_examples() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
            found += [(page.name, line) for line in block.splitlines() if line.startswith("curl ")]
    return found


def test_the_docs_have_curl_examples() -> None:
    assert len(curl_examples()) >= 6


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize(("page", "command"), curl_examples())
def test_curl_example_works_as_printed(default_server, page: str, command: str) -> None:
    assert PRINTED_URL in command, f"{page}: examples address {PRINTED_URL}"
    args = shlex.split(command.replace(PRINTED_URL, default_server.url))
    result = subprocess.run([*args, "--fail-with-body", "--max-time", "60"], capture_output=True, text=True)
    assert result.returncode == 0, f"{page}: {command}\n{result.stdout}{result.stderr}"
    if "/metrics" in command:
        assert "llamacpp:spec_decode_num_drafts_total" in result.stdout
        return
    if '"stream": true' in command:
        frames = [json.loads(line[6:]) for line in result.stdout.splitlines() if line.startswith("data: ")]
        assert frames and frames[-1]["stop"] is True
        return
    body = json.loads(result.stdout)
    assert body.get("error") is None  # a Responses object always carries `error`, null when none
