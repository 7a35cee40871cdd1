"""Past one process: aggregate tokens/s at 8 concurrent streaming clients for one replica (direct),
two replicas behind nginx (ops/deploy/nginx.conf, run by ops/bench/nginx.py), and a 2-rank
tensor-parallel target: a profile with `[target] parallel = "tensor"` and `world_size = 2`. That
arm runs when such a profile is shipped (or named with --tensor-profile) and starts; otherwise the
table says why it is not available.

The waves are ops/bench/concurrency.py's: the held-out code prompts as streaming
`/v1/completions` requests, T = 0, a fixed token count, EOS ignored, arms interleaved wave by wave.

    python -m ops.bench.scale_out [--profile default] [--tensor-profile NAME|PATH] [--clients 8]
        [--tokens 64] [--repeats 2] [--note TEXT] [--write]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, machine, table, write_section  # first: sets up MLX's BLAS

# isort: on
import argparse
import tempfile
import tomllib
from contextlib import ExitStack
from pathlib import Path

from app.profiles.loader import profile_path, shipped_profiles
from ops.bench.concurrency import Cell, measure, ratio, spread
from ops.bench.nginx import fronted
from ops.bench.spawn import spawned_server

ONE, TWO, TENSOR = "1 replica, direct", "2 replicas behind nginx", "tensor-parallel target, 2 ranks"


def tensor_profile() -> str | None:
    """The first shipped profile whose target is tensor-parallel over 2 ranks."""
    for name in shipped_profiles():
        target = tomllib.loads(profile_path(name).read_text()).get("target")
        if isinstance(target, dict) and target.get("parallel") == "tensor" and target.get("world_size") == 2:
            return name
    return None


def start_arms(servers: ExitStack, profile: str, tensor: str | None, work: Path) -> tuple[dict[str, str], str]:
    """Each arm's URL, and why the tensor-parallel arm is missing ("" when it runs)."""
    urls = {ONE: servers.enter_context(spawned_server(profile))[0]}
    replicas = [servers.enter_context(spawned_server(profile))[0] for _ in range(2)]
    urls[TWO] = servers.enter_context(fronted(replicas, work / "nginx"))
    if tensor is None:
        return urls, 'no shipped profile has `[target] parallel = "tensor"` with `world_size = 2`'
    try:
        urls[TENSOR] = servers.enter_context(spawned_server(tensor))[0]
    except RuntimeError as failed:  # this build's server does not run it
        return urls, f"`{tensor}` did not start: {failed}"
    return urls, ""


def render(cells: dict[tuple[str, int], Cell], profiles: dict[str, str], missing: str, args: argparse.Namespace) -> str:
    clients = args.clients
    one = cells[ONE, clients]
    rows = [
        [arm, f"`{profiles[arm]}`", f"{cell.tokens_per_second:.1f}", ratio(cell, one),
         spread(cell.inter_token_s, ".1f"), spread(cell.first_token_s, ".0f")]
        for (arm, _), cell in cells.items()
    ]  # fmt: skip
    header = ["arm", "profile", "aggregate tokens/s", "vs 1 replica", "inter-token ms p50 / p95",
              "first token ms p50 / p95"]  # fmt: skip
    intro = (
        f"{machine()}. {clients} concurrent streaming `/v1/completions` clients in waves over the held-out "
        f"code prompts, {args.tokens} tokens each, T=0, EOS ignored, {args.repeats} repeats, arms "
        "interleaved wave by wave; the replicas, nginx and the clients share one host. This machine has "
        "2 cores, shared by all of them and by other jobs: a second replica can use CPU time one replica "
        "leaves idle between its steps, and under contention more processes take a larger share of the "
        "CPU. Neither shows what real hosts give, where each replica brings its own cores and memory "
        "bandwidth (or GPU), and a tensor-parallel target splits each forward over devices of its own; "
        "on one CPU its ranks only add communication."
    )
    parts = ["## Scale-out: replicas and tensor parallelism (`ops/bench/scale_out.py`)", "", intro, ""]
    parts += [args.note, ""] if args.note else []
    parts.append(table(header, rows))
    return "\n".join([*parts, "", f"- {TENSOR}: not available here; {missing}."] if missing else parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="default", help="the replicas' profile")
    parser.add_argument("--tensor-profile", default=None, help="default: the shipped tensor-parallel profile")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--note", default="", help="a line for the section (e.g. the machine's state)")
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tensor = args.tensor_profile or tensor_profile()
    with tempfile.TemporaryDirectory() as work, ExitStack() as servers:  # nginx stops before its folder goes
        urls, missing = start_arms(servers, args.profile, tensor, Path(work))
        cells = measure(urls, [args.clients], args.tokens, args.repeats)
    profiles = {ONE: args.profile, TWO: args.profile, TENSOR: tensor or ""}
    body = render(cells, profiles, missing, args)
    print(body)
    if args.write:
        write_section("scale-out", body)


if __name__ == "__main__":
    main()
