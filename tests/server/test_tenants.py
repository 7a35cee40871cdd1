"""Tenants through the real server: each API key is a tenant, the prompt cache is partitioned by
tenant (no tenant learns from `cache_n`, `cached_tokens` or the prompt's timings whether another
sent a prompt), `"global"` shares it, and /slots shows another tenant's rows only as busy."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from app.execution.runner import PREFILL_CHUNK
from app.loading import EMBEDDED_TARGET
from app.profiles.tenants import tenant_id
from tests.support.caching import restored
from tests.support.cli import mlxcel
from tests.support.server import RunningServer, serve

pytestmark = pytest.mark.slow
B = PREFILL_CHUNK
SOLO, ALPHA, BETA = "solo-key-0123456789", "alpha-key-0123456789", "beta-key-0123456789"
KEY_FILE = f"# the team's keys, one per line\n{ALPHA}\n\n   {BETA}   \n"


def tokens(seed: int, n: int) -> list[int]:
    """A prompt of n token ids of its own (seed)."""
    return [(seed * 7919 + i * 131) % 3900 + 20 for i in range(n)]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def key_file(tmp: Path) -> Path:
    path = tmp / "keys.txt"
    path.write_text(KEY_FILE)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """One key on the command line and two in a key file: three tenants, the cache per tenant."""
    tmp = tmp_path_factory.mktemp("tenants")
    with serve(tmp, "--profile", "target-only", "--api-key", SOLO, "--api-key-file", str(key_file(tmp))) as running:
        yield running


def complete(server: RunningServer, key: str, prompt: list[int]) -> dict:
    body = {"prompt": prompt, "n_predict": 2, "temperature": 0}
    response = httpx.post(f"{server.url}/completion", json=body, headers=bearer(key), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["timings"]


def cached_tokens(server: RunningServer, key: str, prompt: list[int]) -> int:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=bearer(key), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_every_configured_key_is_accepted_and_any_other_is_401(server: RunningServer) -> None:
    for key in (SOLO, ALPHA, BETA):
        assert httpx.get(f"{server.url}/slots", headers=bearer(key), timeout=10).status_code == 200
    for headers in ({}, bearer("wrong"), bearer(ALPHA[:-1]), bearer(f"{ALPHA} {BETA}"), {"x-api-key": SOLO[1:]}):
        response = httpx.get(f"{server.url}/slots", headers=headers, timeout=10)
        assert response.status_code == 401, headers
        assert response.json()["error"]["type"] == "authentication_error"


def test_a_tenant_never_hits_another_tenants_prompt_cache(server: RunningServer) -> None:
    """Alpha primes a prompt; beta's same prompt is prefilled in full (cache_n 0, cached_tokens 0),
    while alpha's repeat and then beta's own repeat restore it from their own entries."""
    prompt = tokens(11, 2 * B + 37)
    primed = complete(server, ALPHA, prompt)
    other = complete(server, BETA, prompt)
    other_openai = cached_tokens(server, SOLO, prompt)
    repeat = complete(server, ALPHA, prompt)
    own = complete(server, BETA, prompt)
    print(f"prompt_ms: alpha primes {primed['prompt_ms']:.1f}, beta {other['prompt_ms']:.1f}, "
          f"alpha again {repeat['prompt_ms']:.1f}")  # fmt: skip
    assert (primed["cache_n"], other["cache_n"], other_openai) == (0, 0, 0)
    assert other["prompt_n"] == len(prompt)
    hit = restored(len(prompt), len(prompt))
    assert hit >= 2 * B and (repeat["cache_n"], own["cache_n"]) == (hit, hit)
    assert cached_tokens(server, SOLO, prompt) == hit  # solo's own first request stored it


def test_the_log_names_tenants_by_id_never_by_key(server: RunningServer) -> None:
    complete(server, ALPHA, tokens(14, 20))
    assert {e["tenant"] for e in server.events("http_request") if e["route"] == "/completion"} >= {tenant_id(ALPHA)}
    assert not any(key in server.log.read_text() for key in (SOLO, ALPHA, BETA))


def test_slots_show_another_tenants_row_only_as_busy(server: RunningServer) -> None:
    """Beta's own view shows its request id, counts and logit biases; alpha's shows none of them."""
    body = {"prompt": tokens(12, 40), "n_predict": 4000, "ignore_eos": True, "stream": True, "logit_bias": [[30, 1.5]]}
    headers = bearer(BETA) | {"X-Request-ID": "beta-secret-task"}
    with httpx.stream("POST", f"{server.url}/completion", json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: a dropped iterator closes the stream, which cancels the row
        next(lines)
        (mine,) = [s for s in httpx.get(f"{server.url}/slots", headers=headers).json() if s["is_processing"]]
        (theirs,) = [s for s in httpx.get(f"{server.url}/slots", headers=bearer(ALPHA)).json() if s["is_processing"]]
    assert (mine["id_task"], mine["n_prompt_tokens"]) == ("beta-secret-task", 40) and mine["params"]["logit_bias"]
    assert theirs == {"id": mine["id"], "id_task": -1, "is_processing": True, "n_ctx": mine["n_ctx"]}


def test_a_global_prompt_cache_is_shared_and_a_reload_reads_the_key_file_again(tmp_path: Path) -> None:
    """Rotating keys by editing the key file is a change of who may call: refused until the
    profile allows it (server.reload_may_change_auth), then the new keys serve."""
    keys = key_file(tmp_path)
    profile = tmp_path / "keyed.toml"
    body = f'target = "{EMBEDDED_TARGET}"\n[server]\napi_key_file = "{keys}"\nprompt_cache_scope = "global"\n'
    profile.write_text(body)
    with serve(tmp_path, "--profile", str(profile)) as shared:
        prompt = tokens(13, 2 * B + 37)
        assert complete(shared, ALPHA, prompt)["cache_n"] == 0
        assert complete(shared, BETA, prompt)["cache_n"] == restored(len(prompt), len(prompt))
        keys.write_text(f"{ALPHA}\n{SOLO}\n")  # beta's key is revoked, solo's added
        (refused,) = sighup(shared, "reload_refused")
        assert "server.api_key_file (the keys in it)" in refused["reason"] and refused["level"] == "warning"
        profile.write_text(body + "reload_may_change_auth = true\n")
        sighup(shared, "reload_succeeded")
        (changed,) = shared.events("reload_changed_access")
        assert changed["keys"] == ["server.api_key_file (the keys in it)"]
        statuses = [httpx.get(f"{shared.url}/slots", headers=bearer(key)).status_code for key in (ALPHA, BETA, SOLO)]
        assert statuses == [200, 401, 200]
    assert not any(key in shared.log.read_text() for key in (SOLO, ALPHA, BETA))


def sighup(server: RunningServer, outcome: str) -> list[dict]:
    """Send SIGHUP and wait for the reload's `outcome` event; every such event so far."""
    before = len(server.events(outcome))
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while len(server.events(outcome)) == before:
        assert time.monotonic() < deadline, f"SIGHUP: no {outcome}"
        time.sleep(0.1)
    return server.events(outcome)


def test_a_missing_key_file_fails_at_startup_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.keys"
    result = mlxcel("serve", "--profile", "target-only", "--port", "0", "--api-key-file", str(missing))
    assert result.returncode == 2
    assert f"flag --api-key-file: cannot read the key file {missing}: No such file or directory" in result.stderr
