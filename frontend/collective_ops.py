"""Collectives as torch operators: the markers a sharded model's graph carries.

    y = torch.ops.tilecc.all_reduce(x, 4)             # sum over the 4 chips of the group
    y = torch.ops.tilecc.reduce_scatter(x, 1, 4)      # the sum, cut along dim 1: this chip's block
    y = torch.ops.tilecc.all_gather(x, 1, 4)          # every chip's block, concatenated along dim 1
    y = torch.ops.tilecc.shard(x, 1, 4)               # this chip's block of a replicated x (no traffic)
    y = torch.ops.tilecc.send_recv(x, 1, 2)           # pipeline: x leaves stage 1 for stage 2
    y = torch.ops.tilecc.grad_all_reduce(x, 4)        # training: x itself; its gradient summed over the 4

`frontend/tensor_parallel.py` inserts them into a sharded module; `torch.export` keeps them
as single nodes, and `frontend/segments.py` cuts the graph there into per-chip compute
segments. Their eager kernels are the single-chip view that tracing needs (right shapes
and dtypes: chip 0's block, the identity for the sum); the system runtime
(`runtime/system_run.py`) gives them their meaning across chips through the interconnect's
collective schedules (`simulator/interconnect/`).

`grad_all_reduce` is Megatron's "f" operator: a training copy of a sharded model carries it
on every column-parallel linear's (replicated) input; it moves nothing in the forward, and
in the backward the chips' partial gradients of that input are all-reduced there
(runtime/tp_train.py).
"""

from __future__ import annotations

import torch
from torch.library import custom_op

COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "shard", "send_recv", "grad_all_reduce")


@custom_op("tilecc::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.clone()


@all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@custom_op("tilecc::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    return x.chunk(group, dim)[0].clone()


@reduce_scatter.register_fake
def _(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    return x.chunk(group, dim)[0].new_empty(x.chunk(group, dim)[0].shape)


@custom_op("tilecc::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    return torch.cat([x] * group, dim)


@all_gather.register_fake
def _(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= group
    return x.new_empty(shape)


@custom_op("tilecc::shard", mutates_args=())
def shard(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    return x.chunk(group, dim)[0].clone()


@shard.register_fake
def _(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    return x.chunk(group, dim)[0].new_empty(x.chunk(group, dim)[0].shape)


@custom_op("tilecc::send_recv", mutates_args=())
def send_recv(x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
    return x.clone()


@send_recv.register_fake
def _(x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
    return torch.empty_like(x)


@custom_op("tilecc::grad_all_reduce", mutates_args=())
def grad_all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.clone()


@grad_all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


def collective_name(target: object) -> str | None:
    """'all_reduce', ... when an FX node's target is one of these operators, else None."""
    for name in COLLECTIVE_OPS:
        op = getattr(torch.ops.tilecc, name)
        if target is op or target is getattr(op, "default", None):
            return name
    return None
