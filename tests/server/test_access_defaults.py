"""Who can reach a server and what they learn (issue 24): a reload cannot open it, the default
CORS answers browsers without credentials, a loopback server refuses names it is not (DNS
rebinding), /props hides filesystem paths, and a client that leaves mid-body is a 499, not a 500.
Real servers in a subprocess, httpx and raw sockets."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest

from app.profiles.schema import ServerSettings
from app.server.hosts import host_allowed, host_name
from tests.support.cli import write
from tests.support.server import RunningServer, serve

TARGET_ONLY = 'target = "@TARGET@"\n[drafter]\nkind = "none"\n'
KEYED = '[server]\napi_key = "{key}"\nadmin_reload = true\n'
WIDER = 'allowed_hosts = ["proxy.example"]\nprops_show_paths = true\nreload_may_change_auth = true\n'
OLD_KEY, NEW_KEY = "old-key", "new-key"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def wait_for(server: RunningServer, event: str, count: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while len(found := server.events(event)) < count:
        assert time.monotonic() < deadline, f"no {event} event"
        time.sleep(0.1)
    return found[-1]


# --- the Host check, as a function -------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "name"),
    [("LocalHost:8080", "localhost"), ("localhost.", "localhost"), ("[::1]:80", "[::1]"), ("a.example", "a.example")],
)
def test_host_name_drops_the_port_and_the_final_dot(header: str, name: str) -> None:
    assert host_name(header) == name


def test_a_loopback_bind_serves_loopback_names_and_ip_literals_only() -> None:
    loopback = ServerSettings()
    for name in ("localhost", "app.localhost", "127.0.0.1", "[::1]", "10.0.0.7", ""):
        assert host_allowed(name, loopback), name
    for name in ("attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io"):
        assert not host_allowed(name, loopback), name
    assert host_allowed("evil.example", ServerSettings(host="0.0.0.0"))  # a public bind checks nothing by default
    listed = ServerSettings(host="0.0.0.0", allowed_hosts=["*.corp.example"])
    assert host_allowed("mlxcel.corp.example", listed) and not host_allowed("corp.example.evil", listed)
    assert host_allowed("anything.example", ServerSettings(allowed_hosts=["*"]))


# --- a shared default server: CORS, Host, /props, 499 ------------------------------------------


@pytest.mark.slow
def test_default_cors_answers_star_without_credentials(target_only_server: RunningServer) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    with target_only_server.client() as http:
        for origin in ("https://any.example", "null"):
            answer = http.options("/v1/chat/completions", headers={"Origin": origin, **preflight})
            assert answer.status_code == 200, answer.text  # llama-server's, not Litestar's 204
            assert answer.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in answer.headers
            assert "POST" in answer.headers["access-control-allow-methods"]
            simple = http.get("/props", headers={"Origin": origin})
            assert simple.headers["access-control-allow-origin"] == "*"
            assert "access-control-allow-credentials" not in simple.headers
        get = http.options("/props", headers={"Origin": "https://any.example", "Access-Control-Request-Method": "GET"})
        assert get.status_code == 200


@pytest.mark.slow
def test_a_loopback_server_refuses_a_host_it_is_not(target_only_server: RunningServer) -> None:
    port = target_only_server.url.rsplit(":", 1)[1]
    with target_only_server.client() as http:
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "mlxcel.localhost", "127.0.0.1"):
            assert http.get("/health", headers={"Host": host}).status_code == 200, host
        refused = http.get("/props", headers={"Host": f"rebound.example:{port}", "X-Request-ID": "rebound-1"})
        rebound = {"Host": "rebound.example", "Origin": "http://rebound.example"}
        refused_preflight = http.options("/props", headers=rebound | {"Access-Control-Request-Method": "GET"})
    assert refused.status_code == 400 and refused_preflight.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert f"'rebound.example:{port}'" in error["message"] and "server.allowed_hosts" in error["message"]
    event = target_only_server.wait_for_event("http_request", "rebound-1")
    assert event["status"] == 400


@pytest.mark.slow
def test_props_and_models_show_names_not_paths_by_default(target_only_server: RunningServer) -> None:
    with target_only_server.client() as http:
        props = http.get("/props").json()
        meta = http.get("/v1/models").json()["data"][0]["meta"]
    assert props["model_path"] == "target" and meta["path"] == "target"
    assert props["mlxcel"]["profile_file"] == "target-only.toml"


@pytest.mark.slow
def test_a_client_that_leaves_mid_body_is_a_499_not_a_500(target_only_server: RunningServer) -> None:
    host, port = target_only_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(
            b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"X-Request-ID: cut-body-1\r\nContent-Length: 100\r\n\r\n"
            b'{"prompt": "def f('
        )
        time.sleep(0.3)  # the handler is reading the body when the client goes
    event = target_only_server.wait_for_event("http_request", "cut-body-1")
    assert (event["status"], event["route"]) == (499, "/completion")
    with target_only_server.client() as http:
        metrics = http.get("/metrics").text
    assert 'mlxcel_http_requests_total{route="/completion",status="499"}' in metrics
    assert 'route="/completion",status="500"' not in metrics


# --- a keyed server of its own, reloaded ------------------------------------------------------


def reload_outcome(server: RunningServer, seen: int, timeout: float = 60.0) -> dict:
    """The outcome event (succeeded or refused) of the reload after the first `seen` ones."""
    outcomes = ("reload_succeeded", "reload_refused")
    deadline = time.monotonic() + timeout
    while len(found := [e for e in server.events() if e["event"] in outcomes]) <= seen:
        assert time.monotonic() < deadline, "the reload did not end"
        time.sleep(0.1)
    return found[seen]


@pytest.mark.slow
def test_a_reload_cannot_open_the_server(tmp_path: Path) -> None:
    profile = write(tmp_path, "guarded", TARGET_ONLY + KEYED.format(key=OLD_KEY))
    with serve(tmp_path, "--profile", str(profile)) as server:
        keyless = server.client()
        old = server.client(headers=bearer(OLD_KEY))

        # An emptied profile file (a non-atomic write caught halfway) on SIGHUP: refused, the key still needed.
        profile.write_text("")
        server.process.send_signal(signal.SIGHUP)
        refused = reload_outcome(server, 0)
        assert (refused["event"], refused["level"], refused["trigger"]) == ("reload_refused", "warning", "SIGHUP")
        assert f"{profile}: the profile file sets no key" in refused["reason"]
        assert keyless.get("/props").status_code == 401

        # Cut mid-line, over POST /admin/reload: the profile's own error.
        profile.write_text('target = "/wo')
        answer = old.post("/admin/reload")
        assert answer.status_code == 409 and f"{profile}: not valid TOML" in answer.json()["error"]["message"]

        # A profile that lost its [server] table: refused, naming the access keys it would change.
        write(tmp_path, "guarded", TARGET_ONLY)
        answer = old.post("/admin/reload")
        assert answer.status_code == 409, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith("reload refused: server.api_key, server.admin_reload: ")
        assert "server.reload_may_change_auth = true" in message and OLD_KEY not in message
        assert keyless.get("/props").status_code == 401 and keyless.post("/completion", json={}).status_code == 401

        # Said explicitly, they change, with a warning naming the keys (never a value).
        write(tmp_path, "guarded", TARGET_ONLY + KEYED.format(key=NEW_KEY) + WIDER)
        assert old.post("/admin/reload").status_code == 200
        (changed,) = server.events("reload_changed_access")
        assert changed["level"] == "warning"
        assert changed["keys"] == ["server.api_key", "server.allowed_hosts", "server.props_show_paths"]
        assert OLD_KEY not in str(changed) and NEW_KEY not in str(changed)
        assert old.get("/props").status_code == 401
        with server.client(headers=bearer(NEW_KEY)) as new:
            assert new.get("/props").json()["model_path"].endswith("models/target")  # props_show_paths
            assert new.get("/health", headers={"Host": "proxy.example:443"}).status_code == 200  # allowed_hosts
            assert new.get("/health", headers={"Host": "other.example"}).status_code == 400
    assert [e["event"] for e in server.events() if e["event"].startswith("reload_")] == [
        "reload_requested",
        "reload_refused",
        "reload_requested",
        "reload_refused",
        "reload_requested",
        "reload_refused",
        "reload_requested",
        "reload_changed_access",
        "reload_succeeded",
    ]
