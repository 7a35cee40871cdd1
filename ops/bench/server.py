"""The server against in-process generation, and prompt lookup against target-only, over HTTP.

Starts real servers (`mlxcel serve`) for the default, target-only and prompt-lookup profiles and
streams the same requests through them (SSE, httpx), interleaved with the same requests decoded
in this process. Rates are client-side: tokens over the wall time from sending the request to
the last frame (prefill included), EOS ignored.

    python -m ops.bench.server [--tokens 128] [--repeats 2] [--write]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import Arm, WRITE_HELP, arguments, machine  # first: sets up MLX's BLAS
from ops.bench.common import progress, stage, table, write_section

# isort: on
import json
import socket
import time

from app.decoding.builder import LoopBuilder, RowRequest
from app.decoding.plan import LoopPlan
from app.execution.model import load_model
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.sampling import SamplingParams
from ops.bench.prompts import COPY_HEAVY, HELD_OUT_CODE
from ops.bench.spawn import spawned_server


def stream_over_http(url: str, prompt: str, n: int) -> tuple[int, float]:
    """Stream one request through a bare socket client: on a two-core machine the client shares
    the cores with the server, so it only collects bytes and parses the final frame at the end."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "stream": True})
    head = (f"POST /completion HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    start = time.perf_counter()
    received = bytearray()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(head.encode() + body.encode())
        while chunk := connection.recv(1 << 16):
            received += chunk
    elapsed = time.perf_counter() - start
    frames = [line for line in bytes(received).split(b"\n") if line.startswith(b"data: ")]
    final = json.loads(frames[-1].removeprefix(b"data: "))
    return final["timings"]["predicted_n"], elapsed


def in_process(builder: LoopBuilder, prompt: list[int], n: int) -> tuple[int, float]:
    start = time.perf_counter()
    generation = builder.build(RowRequest(prompt, SamplingParams(temperature=0.0), max_tokens=n, ignore_eos=True))
    generation.prefill()
    while not generation.finished:
        generation.step()
    return len(generation.emitted), time.perf_counter() - start


def add(arm: Arm, measured: tuple[int, float]) -> None:
    arm.tokens += measured[0]
    arm.seconds += measured[1]


def main(argv: list[str] | None = None) -> None:
    parser = arguments("server", __doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    n = args.tokens
    stage("loading the embedded pair")
    target, drafter = load_model(EMBEDDED_TARGET), load_model(EMBEDDED_DRAFTER, role="drafter")
    classic = LoopBuilder(target, drafter, LoopPlan(drafter_kind="draft-model", num_draft_tokens=4))
    plain = LoopBuilder(target, None, LoopPlan())
    encode = target.tokenizer.encode
    arms = {name: Arm(name) for name in ("in-process classic", "server classic", "in-process target-only",
                                          "server target-only", "server target-only (copy-heavy)",
                                          "server prompt lookup (copy-heavy)")}  # fmt: skip
    # One server at a time next to this process for the in-process comparison (every server holds
    # its own copy of the weights, and this machine's caches are shared); both for the lookup one.
    bar = progress(args.repeats * 2 * (2 * len(HELD_OUT_CODE) + len(COPY_HEAVY)), "requests")
    for profile, builder, label in (("default", classic, "classic"), ("target-only", plain, "target-only")):
        stage(f"starting the {profile} server")
        with spawned_server(profile) as (url, _):
            for repeat in range(args.repeats):
                for i, prompt in enumerate(HELD_OUT_CODE):
                    pairs = [
                        (arms[f"in-process {label}"], lambda p=prompt, b=builder: in_process(b, encode(p), n)),
                        (arms[f"server {label}"], lambda p=prompt, u=url: stream_over_http(u, p, n)),
                    ]
                    for arm, run in pairs if (i + repeat) % 2 == 0 else pairs[::-1]:
                        add(arm, run())
                        bar.update()
    stage("starting the target-only and prompt-lookup servers")
    with spawned_server("target-only") as (plain_url, _), spawned_server("prompt-lookup") as (lookup_url, _):
        for _ in range(args.repeats):
            for prompt in COPY_HEAVY:
                add(arms["server target-only (copy-heavy)"], stream_over_http(plain_url, prompt, n))
                add(arms["server prompt lookup (copy-heavy)"], stream_over_http(lookup_url, prompt, n))
                bar.update(2)
    bar.close()
    rate = {name: arm.tokens_per_second for name, arm in arms.items()}
    rows = [
        ["default profile (draft model, k=4), held-out code", f"{rate['in-process classic']:.1f}",
         f"{rate['server classic']:.1f}", f"{rate['server classic'] / rate['in-process classic']:.2f}x"],
        ["target-only profile, held-out code", f"{rate['in-process target-only']:.1f}",
         f"{rate['server target-only']:.1f}", f"{rate['server target-only'] / rate['in-process target-only']:.2f}x"],
    ]  # fmt: skip
    lookup_ratio = rate["server prompt lookup (copy-heavy)"] / rate["server target-only (copy-heavy)"]
    body = "\n".join(
        [
            "## Server streaming (`ops/bench/server.py`)",
            "",
            f"{machine()}. Same requests in-process and streamed over HTTP (SSE read by a bare socket client, "
            f"client-side wall time from request to last frame, prefill included), {n} tokens, T=0, EOS ignored, "
            f"{args.repeats} interleaved repeats.",
            "",
            table(["request set", "in-process tokens/s", "server tokens/s", "server / in-process"], rows),
            "",
            table(
                ["copy-heavy edits over HTTP", "tokens/s", "vs target-only"],
                [
                    ["target-only profile", f"{rate['server target-only (copy-heavy)']:.1f}", "1.00x"],
                    [
                        "prompt-lookup profile",
                        f"{rate['server prompt lookup (copy-heavy)']:.1f}",
                        f"{lookup_ratio:.2f}x",
                    ],
                ],
            ),
        ]
    )
    print(body)
    if args.write:
        write_section("server", body)


if __name__ == "__main__":
    main()
