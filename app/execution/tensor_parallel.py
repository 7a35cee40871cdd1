"""A tensor-parallel target: each rank of an `mlx.launch` job holds one shard of it.

MLX's own distributed runtime does the work: `mlx.launch` starts the ranks (ring backend on one
host or over a hostfile), `mx.distributed.init` joins them into one group, mlx-lm's `shard()`
splits the target (app/execution/model.py), and the shards' products meet in all_sum collectives.
Rank 0 serves; the followers only repeat rank 0's target forwards and rewinds, in the order rank 0
sends them (app/execution/lockstep.py), until it tells them to stop.
"""

from __future__ import annotations

import mlx.core as mx

from app.events import tensor as events
from app.execution.lockstep import Lockstep, Order
from app.execution.model import LoadedModel, load_model
from app.execution.prepare import prepare
from app.execution.runner import ModelRunner
from app.loading.checkpoint import ModelLoadError


def join_group(world_size: int) -> mx.distributed.Group:
    """The job's group (whatever backend mlx.launch set up), which must have `world_size` ranks."""
    try:
        group = mx.distributed.init(strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"cannot join the tensor-parallel group (start the ranks with mlx.launch): {exc}") from exc
    if group.size() != world_size:
        raise ModelLoadError(
            f"target.world_size is {world_size} but mlx.launch started {group.size()} ranks; make them agree"
        )
    return group


def load_leader(path: str, world_size: int) -> tuple[LoadedModel, Lockstep]:
    """Rank 0's shard of the target, its runners ordering the followers through the returned channel."""
    group = join_group(world_size)
    target = load_model(path, shard_group=group)
    lockstep = Lockstep(group)
    prepare(target.model, lockstep=lockstep)  # its runners send their forwards and rewinds as orders
    return target, lockstep


def follow(path: str, world_size: int) -> None:
    """A follower rank: load this rank's shard, then run rank 0's orders until it says stop."""
    group = join_group(world_size)
    model = load_model(path, shard_group=group).model
    lockstep = Lockstep(group)
    events.rank_ready(rank=group.rank(), world_size=world_size)
    runners: dict[int, ModelRunner] = {}
    while (received := lockstep.receive()).order is not Order.STOP:
        if received.order is Order.FORWARD:
            if received.runner not in runners:
                runners[received.runner] = ModelRunner(model, max_kv_size=received.argument or None)
            mx.eval(runners[received.runner].forward(received.payload))
        elif received.order is Order.REWIND:
            runners[received.runner].rewind(received.argument)
        elif received.order is Order.FREE:
            for number in received.payload.tolist():
                runners.pop(number, None)
    events.rank_stopped(rank=group.rank())
