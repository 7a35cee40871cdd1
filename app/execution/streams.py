"""The MLX streams an engine thread computes on, handed to the next engine when it ends.

MLX gives each thread that computes a default stream of its own, and a stream (on the CPU, a
native worker thread with its own buffers) lives as long as the process, even after its thread
has ended; `mx.clear_streams()` does not end a CPU stream's worker. Each reload starts a new
engine thread, so each one left a stream behind: 133 reloads took a server from 10 threads to
143, and its RSS from 257 MB to 1.2 GB.

So an engine thread runs on pooled streams instead (one per device it may compute on), taken for
as long as it runs and given back when it ends. A stream is never shared by two threads at once
(MLX does not guard a stream against concurrent evaluation), so the pool holds as many streams as
engines ever ran at once: during a reload's overlap, the old engine finishing its requests and the
new one serving.

A router's load runs on a thread of lower CPU priority (app/engine/engine.py `niced`), and a CPU
stream's worker thread, started by the first evaluation on the stream, takes the priority of the
thread that evaluated. So a stream's worker starts when the stream is made, from the thread that
takes it, and loads take streams from a pool of their own: serving engines' forwards ran on
workers at the load's priority, sharing the cores evenly with the next load.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

_free: dict[tuple[str, str], list[mx.Stream]] = {}  # by pool and device: streams no running thread holds
_lock = threading.Lock()


def _devices() -> list[mx.Device]:
    """The default device, and the CPU (where a GPU build's CPU-only operations run)."""
    default = mx.default_device()
    return [default] if default.type == mx.DeviceType.cpu else [default, mx.Device(mx.cpu)]


def _take(pool: str, device: mx.Device) -> mx.Stream:
    with _lock:
        free = _free.setdefault((pool, str(device)), [])
        if free:
            return free.pop()
    stream = mx.new_thread_unsafe_stream(device)  # usable from any thread, which a pooled stream must be
    mx.eval(mx.zeros((1,), stream=stream))  # its worker starts now, at this thread's priority
    return stream


def _give_back(pool: str, stream: mx.Stream) -> None:
    with _lock:
        _free[(pool, str(stream.device))].append(stream)


@contextmanager
def pooled_streams(pool: str = "serving") -> Iterator[None]:
    """Within this block, the calling thread computes on streams of `pool` (its whole life: enter
    it before its first MLX operation, and leave it when the thread is done with MLX). A thread of
    lowered priority names a pool of its own ("loading")."""
    streams = [_take(pool, device) for device in _devices()]
    for stream in streams:
        mx.set_default_stream(stream)
    try:
        yield
    finally:
        for stream in streams:
            _give_back(pool, stream)
