"""ops/deploy/nginx.conf as a child process in front of replicas on loopback (the replica test and
ops/bench/scale_out.py).

The recipe runs as shipped but for its addresses: its first replica ports become the given
replicas' (recipe lines beyond them are left out), it listens on a free loopback port, and its
pid, logs and temporary files live in a work folder. So it never touches the system's nginx
service or paths.
`make test` installs nginx where it is missing (.ci/ensure-nginx).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ops.bench.spawn import free_port

RECIPE = Path(__file__).resolve().parents[1] / "deploy" / "nginx.conf"
STARTUP_S = 10
REPLICA = re.compile(r"server 127\.0\.0\.1:(\d+)")
# http-level paths Debian's build points at /var/lib/nginx and /var/log/nginx
WORK_PATHS = ("client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path")


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError(
            "nginx is not installed: `make test` installs it (.ci/ensure-nginx), or apt-get install nginx"
        )
    return found


def localized(recipe: str, replica_ports: list[int], listen: int, work: Path) -> str:
    """The recipe with its first replicas moved to `replica_ports` and the rest left out,
    listening on 127.0.0.1:`listen`, its temporary files and access log under `work`."""
    shipped = list(dict.fromkeys(REPLICA.findall(recipe)))
    if len(shipped) < len(replica_ports):
        raise ValueError(f"the recipe balances {len(shipped)} replicas, not {len(replica_ports)}")
    moved = dict(zip(shipped, map(str, replica_ports), strict=False))
    kept = [line for line in recipe.splitlines(keepends=True) if (m := REPLICA.search(line)) is None or m[1] in moved]
    text = "".join(kept)
    text = REPLICA.sub(lambda m: f"server 127.0.0.1:{moved[m.group(1)]}", text)
    text = re.sub(r"^(\s*)listen \d+;", rf"\g<1>listen 127.0.0.1:{listen};", text, count=1, flags=re.M)
    paths = [f"    {directive} {work / directive};" for directive in WORK_PATHS]
    return text.replace("http {", "\n".join(["http {", f"    access_log {work / 'access.log'};", *paths]), 1)


def prepared(replicas: list[str], work: Path, recipe: Path = RECIPE) -> tuple[list[str], int]:
    """The nginx command line running `recipe` in front of `replicas` (their http://127.0.0.1:PORT
    URLs) from `work`, checked with `nginx -t`; and the port it will listen on."""
    work.mkdir(parents=True, exist_ok=True)
    listen = free_port()
    ports = [int(url.rsplit(":", 1)[1]) for url in replicas]
    config = work / "nginx.conf"
    config.write_text(localized(recipe.read_text(), ports, listen, work))
    # as root the workers would switch to `nobody`, who cannot enter a private temporary folder
    main = f"daemon off; pid {work / 'nginx.pid'};" + (" user root;" if os.geteuid() == 0 else "")
    command = [nginx_binary(), "-p", str(work), "-c", str(config), "-e", str(work / "error.log"), "-g", main]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(f"nginx -t failed: {checked.stderr}")
    return command, listen


@contextmanager
def fronted(replicas: list[str], work: Path) -> Iterator[str]:
    """nginx running the recipe in front of `replicas`; its URL."""
    command, listen = prepared(replicas, work)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(listen, process, work / "error.log")
        yield f"http://127.0.0.1:{listen}"
    finally:
        process.terminate()
        process.wait(10)


def wait_listening(port: int, process: subprocess.Popen, error_log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    log = error_log.read_text() if error_log.exists() else ""
    raise RuntimeError(f"nginx did not start (exit {process.poll()}): {log}")
