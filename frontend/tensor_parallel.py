"""Tensor and sequence parallelism of a torch module, in PyTorch's vocabulary.

    plan = {"layers.*.self_attn.q_proj": ColwiseParallel(), ...,       # torch.distributed.tensor.parallel
            "layers.*.self_attn.o_proj": RowwiseParallel()}
    chip_r = shard_module(model, plan, tp=4, rank=r)    # a copy holding chip r's weights

Megatron-style: a `ColwiseParallel` linear keeps rows [r*out/tp, (r+1)*out/tp) of its weight
(the heads of q / k / v, the columns of gate / up); a `RowwiseParallel` linear keeps the
matching columns of its input features, and its partial products are summed across the
chips by a `tilecc.all_reduce` after it (its bias added once, after the sum). Attention heads
follow from the weights: every chip runs heads/tp query heads and kv_heads/tp key / value
heads (the model's `view(..., -1, head_dim)` finds them).

Layouts (`input_layouts`, `output_layouts` of the styles): `Shard(d)` into a column-parallel
linear inserts `all_gather(d)` before it; `Shard(d)` out of a row-parallel linear makes its
sum a `reduce_scatter(d)` (sequence parallelism: the norms between run on a block of the
sequence, `SequenceParallel`); `Replicate()` into a row-parallel linear cuts its input locally
(`shard`). `PrepareModuleInput` / `PrepareModuleOutput` convert a module's inputs / outputs.
An embedding under `RowwiseParallel` keeps its whole table (it is not vocabulary-parallel
here) and converts its output to `output_layouts`.

`auto_plan(model, sp=...)` writes the plan for `transformers` decoders with Llama / Qwen2 /
Mistral naming, and (without `sp`) for GPT-2's: its `Conv1D` layers (weight [in, out],
`x @ W + b`) shard like linears along the transposed dims, and the fused q / k / v
projection `attn.c_attn` is column-sharded per block (each chip keeps its heads of q, of k
and of v; the attention's `split_size` follows). A layer that cannot be sharded raises
`ShardingError` naming it and why.
The collectives are `frontend/collective_ops.py`'s operators, so `torch.export` of the
copy is one chip's program with the communication as single nodes.

`shard_module(..., training=True)` makes a copy for a training step (runtime/tp_train.py):
every column-parallel layer's input also passes `tilecc.grad_all_reduce` (Megatron's "f":
nothing in the forward, the input gradient all-reduced in the backward), and only
Megatron's all-reduce plan is accepted (column-parallel: Replicate() in, Shard(-1) out;
row-parallel: Shard(-1) in, Replicate() out). Every copy records in `tp_shards` how each of
its parameters comes from the model's (`ShardSpec`), so its gradients can be put back
together (`unshard`).
"""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from tilecc.errors import TileccError
from tilecc.frontend import collective_ops  # noqa: F401 (registers torch.ops.tilecc.*)

ops = torch.ops.tilecc


class ShardingError(TileccError):
    """A model or plan that cannot be sharded as asked: names the layer and the reason."""


def _styles() -> dict[str, type]:
    if not torch.distributed.is_available():
        raise ShardingError("this torch build has no torch.distributed: tensor-parallel plans need its styles")
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )
    return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel, "sequence": SequenceParallel,
            "prepare_input": PrepareModuleInput, "prepare_output": PrepareModuleOutput}


def _shard_dim(layout: Any) -> int | None:
    """d for `Shard(d)`, None for `Replicate()`."""
    from torch.distributed.tensor import Replicate, Shard
    if isinstance(layout, Shard):
        return int(layout.dim)
    if isinstance(layout, Replicate):
        return None
    raise ShardingError(f"layout {layout!r} is not supported (Shard(d) or Replicate())")


def _first(layouts: Any) -> Any:
    return layouts[0] if isinstance(layouts, (tuple, list)) else layouts


ATTN_COL = ("q_proj", "k_proj", "v_proj")
MLP_COL = ("gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
# GPT-2 naming (transformers' Conv1D layers): attn.c_attn (fused q / k / v), mlp.c_fc column-,
# attn.c_proj and mlp.c_proj row-parallel
GPT2_COL = ("attn.c_attn", "mlp.c_fc")
GPT2_ROW = ("attn.c_proj", "mlp.c_proj")


def _is_conv1d(mod: nn.Module) -> bool:
    """transformers' `Conv1D`: a linear layer whose weight is stored [in, out] (`nf` outputs)."""
    return type(mod).__name__ == "Conv1D" and hasattr(mod, "nf") and isinstance(getattr(mod, "weight", None),
                                                                             torch.Tensor)


def _gpt2_plan(model: nn.Module, names: list[str], sp: bool) -> dict[str, Any]:
    st = _styles()
    plan: dict[str, Any] = {}
    for name in names:
        two = ".".join(name.rsplit(".", 2)[-2:])
        if two in GPT2_COL and _is_conv1d(model.get_submodule(name)):
            plan[name] = st["colwise"]()
        elif two in GPT2_ROW and _is_conv1d(model.get_submodule(name)):
            plan[name] = st["rowwise"]()
    if plan and sp:
        raise ShardingError(f"{type(model).__name__}: the automatic plan's sequence parallelism covers Llama / "
                            "Qwen2 / Mistral naming; for GPT-2 pass tp_plan= or leave sp off")
    return plan


def auto_plan(model: nn.Module, sp: bool = False) -> dict[str, Any]:
    """The Megatron plan of a `transformers` decoder (Llama / Qwen2 / Mistral naming): q / k / v
    and gate / up column-parallel, o / down row-parallel; with `sp` the norms run on a block
    of the sequence between a reduce-scatter and an all-gather."""
    st = _styles()
    from torch.distributed.tensor import Replicate, Shard
    plan: dict[str, Any] = {}
    names = [n for n, _ in model.named_modules()]
    gpt2 = _gpt2_plan(model, names, sp)
    if gpt2:
        return gpt2
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ATTN_COL + MLP_COL:
            plan[name] = st["colwise"]()
        elif sp and leaf == "self_attn":  # called with hidden_states=...
            plan[name] = st["prepare_input"](input_kwarg_layouts={"hidden_states": Shard(1)},
                                             desired_input_kwarg_layouts={"hidden_states": Replicate()})
        elif sp and leaf == "mlp":
            plan[name] = st["prepare_input"](input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        elif leaf in ROW:
            plan[name] = st["rowwise"](output_layouts=Shard(1)) if sp else st["rowwise"]()
        elif sp and leaf in NORMS:
            plan[name] = st["sequence"]()
    if not any(n.rsplit(".", 1)[-1] in ROW for n in plan):
        kind = type(model).__name__
        raise ShardingError(f"{kind}: no layer matches the automatic tensor-parallel plan (Llama / Qwen2 / Mistral "
                            f"naming: {', '.join(ATTN_COL + MLP_COL + ROW)} as nn.Linear, or GPT-2's "
                            f"{', '.join(GPT2_COL + GPT2_ROW)} as Conv1D); pass tp_plan=")
    if sp:
        layers = [n for n in names if n.rsplit(".", 1)[-1].isdigit() and n.rsplit(".", 1)[0].endswith("layers")]
        if not layers:
            raise ShardingError(f"{type(model).__name__}: sequence parallelism cuts the residual stream at the first "
                                f"decoder layer (a `layers.0` module); none found")
        # at the first layer, not the embedding: the model derives positions from the embedding's length
        plan[layers[0]] = st["prepare_input"](input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),))
        plan[""] = st["prepare_output"](output_layouts=Shard(1), desired_output_layouts=Replicate())
    return plan


def resolve_plan(model: nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """FQN -> style for every module a plan key names (keys may hold `*` wildcards)."""
    modules = dict(model.named_modules())
    out: dict[str, Any] = {}
    for key, style in plan.items():
        hits = [n for n in modules if n == key or ("*" in key and fnmatch.fnmatchcase(n, key))]
        if not hits:
            raise ShardingError(f"tp_plan key '{key}' names no module of {type(model).__name__}")
        for n in hits:
            out[n] = style
    return out


@dataclass(frozen=True)
class ShardSpec:
    """A chip's parameter from the model's `source` (None: it has none, as a row-parallel
    Conv1D's zero bias): whole (`dim` None) or piece `rank` of tp along `dim`, that dim first
    viewed as `blocks` x (size / blocks) (a fused q / k / v: each chip keeps its part of each)."""

    source: str | None
    dim: int | None = None
    blocks: int = 1


def unshard(pieces: list[torch.Tensor], spec: ShardSpec) -> torch.Tensor:
    """The model's tensor from every chip's piece (chip order), `ShardSpec`'s inverse."""
    if spec.dim is None:
        return pieces[0]
    d = spec.dim % pieces[0].dim()
    shape = pieces[0].shape
    view = [*shape[:d], spec.blocks, shape[d] // spec.blocks, *shape[d + 1:]]
    whole = torch.cat([p.reshape(view) for p in pieces], d + 1)
    return whole.reshape(*shape[:d], -1, *shape[d + 1:])


def _param(name: str, leaf: str) -> str:
    return f"{name}.{leaf}" if name else leaf


def _split(t: torch.Tensor, dim: int, tp: int, rank: int, what: str) -> torch.Tensor:
    if t.shape[dim] % tp:
        raise ShardingError(f"{what}: size {t.shape[dim]} along dim {dim} cannot be split over {tp} chips")
    return t.chunk(tp, dim)[rank].clone()


def _check_heads(model: nn.Module, name: str, lin: nn.Linear, tp: int) -> None:
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    head_dim = getattr(parent, "head_dim", None)
    if not isinstance(head_dim, int) or lin.out_features % head_dim:
        return
    heads = lin.out_features // head_dim
    if heads % tp:
        which = "key / value" if name.endswith(("k_proj", "v_proj")) else "attention"
        raise ShardingError(f"{name}: {heads} {which} heads cannot be split over {tp} chips "
                            f"(tensor parallelism gives each chip whole heads)")


def shard_module(model: nn.Module, plan: dict[str, Any], tp: int, rank: int, *, training: bool = False) -> nn.Module:
    """A copy of `model` holding chip `rank`'s shard of the weights, with the collectives of
    the plan around the sharded layers (and, `training`, the backward's markers)."""
    if tp < 1 or not 0 <= rank < tp:
        raise ShardingError(f"rank {rank} of a tensor-parallel group of {tp}")
    st = _styles()
    resolved = resolve_plan(model, plan)
    chip = copy.deepcopy(model)
    specs = {n: ShardSpec(n) for n, _ in chip.named_parameters()}
    for name, style in resolved.items():
        mod = chip.get_submodule(name) if name else chip
        if training:
            _check_training(name, mod, style, st)
        if isinstance(style, st["colwise"]) and _is_conv1d(mod):
            blocks = _colwise_conv1d(chip, name, mod, style, tp, rank)
            specs[_param(name, "weight")] = ShardSpec(_param(name, "weight"), 1, blocks)
            if mod.bias is not None:
                specs[_param(name, "bias")] = ShardSpec(_param(name, "bias"), 0, blocks)
        elif isinstance(style, st["colwise"]):
            _colwise(model, name, mod, style, tp, rank)
            specs[_param(name, "weight")] = ShardSpec(_param(name, "weight"), 0)
            if mod.bias is not None:
                specs[_param(name, "bias")] = ShardSpec(_param(name, "bias"), 0)
        elif isinstance(style, st["rowwise"]):
            _rowwise(name, mod, style, tp, rank)
            if isinstance(mod, nn.Linear) or _is_conv1d(mod):
                specs[_param(name, "weight")] = ShardSpec(_param(name, "weight"), 0 if _is_conv1d(mod) else 1)
                if getattr(mod, "tp_bias", None) is not None:
                    specs[_param(name, "tp_bias")] = ShardSpec(_param(name, "bias"))
                if _is_conv1d(mod):
                    specs[_param(name, "bias")] = ShardSpec(None)
        elif isinstance(style, st["sequence"]):
            pass  # runs on its block of the sequence: the layouts around it cut and gather
        elif isinstance(style, st["prepare_input"]):
            _prepare_input(mod, style, tp)
        elif isinstance(style, st["prepare_output"]):
            _prepare(mod, _first(style.output_layouts), _first(style.desired_output_layouts), tp)
        else:
            raise ShardingError(f"{name or '<root>'}: style {type(style).__name__} is not supported "
                                f"(ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput/Output)")
        if training and isinstance(style, st["colwise"]):  # Megatron's f on the replicated input
            mod.register_forward_pre_hook(lambda m, args: (ops.grad_all_reduce(args[0], tp), *args[1:]))
    chip.__dict__["tp_shards"] = specs  # a plain attribute (nn.Module's setattr is typed for tensors)
    return chip


def shard_specs(chip: nn.Module) -> dict[str, ShardSpec]:
    """How each parameter of a chip's copy comes from the model's (`tp_shards`)."""
    return cast("dict[str, ShardSpec]", chip.__dict__["tp_shards"])


def _check_training(name: str, mod: nn.Module, style: Any, st: dict[str, type]) -> None:
    """A training copy takes Megatron's all-reduce plan only (see the module's docstring)."""
    what = None
    if isinstance(style, st["colwise"]):
        if _shard_dim(_first(style.input_layouts)) is not None:
            what = "a Shard() input (an all-gather before it)"
        elif _shard_dim(_first(style.output_layouts)) is None:
            what = "a Replicate() output (an all-gather after it)"
    elif isinstance(style, st["rowwise"]):
        if _shard_dim(_first(style.output_layouts)) is not None:
            what = "a Shard() output (a reduce-scatter: sequence parallelism)"
        elif _shard_dim(_first(style.input_layouts)) is None and not isinstance(mod, nn.Embedding):
            what = "a Replicate() input (a local cut before it)"
    else:
        what = f"the style {type(style).__name__}"
    if what is not None:
        raise ShardingError(f"{name or '<root>'}: training with tensor parallelism runs Megatron's all-reduce plan "
                            f"(ColwiseParallel: Replicate() in, Shard(-1) out; RowwiseParallel: Shard(-1) in, "
                            f"Replicate() out); {what} is not supported in sm.train()")


def _colwise(model: nn.Module, name: str, mod: nn.Module, style: Any, tp: int, rank: int) -> None:
    if not isinstance(mod, nn.Linear):
        raise ShardingError(f"{name}: ColwiseParallel shards nn.Linear layers; this one is a {type(mod).__name__}")
    _check_heads(model, name, mod, tp)
    mod.weight = nn.Parameter(_split(mod.weight.data, 0, tp, rank, name), requires_grad=False)
    if mod.bias is not None:
        mod.bias = nn.Parameter(_split(mod.bias.data, 0, tp, rank, name), requires_grad=False)
    mod.out_features //= tp
    d_in = _shard_dim(_first(style.input_layouts))
    if d_in is not None:
        mod.register_forward_pre_hook(lambda m, args: (ops.all_gather(args[0], d_in, tp), *args[1:]))
    d_out = _shard_dim(_first(style.output_layouts))
    if d_out is None:
        mod.register_forward_hook(lambda m, args, out: ops.all_gather(out, -1, tp))
    elif d_out != -1:
        raise ShardingError(f"{name}: a column-parallel linear's output is sharded on its last dim, "
                            f"not Shard({d_out})")


def _colwise_conv1d(chip: nn.Module, name: str, mod: Any, style: Any, tp: int, rank: int) -> int:
    """A `Conv1D` (weight [in, out]) of the chip's copy `chip`, column-parallel: its output
    columns split; a fused q / k / v projection (the parent attention's `split_size` is a
    third of the outputs) split per block, so every chip keeps whole heads of q, k and v.
    Returns the blocks (3 or 1)."""
    if _shard_dim(_first(style.input_layouts)) is not None or _shard_dim(_first(style.output_layouts)) != -1:
        raise ShardingError(f"{name}: a Conv1D column-parallel layer takes the default layouts "
                            f"(Replicate() in, Shard(-1) out)")
    parent = chip.get_submodule(name.rsplit(".", 1)[0]) if "." in name else chip
    n_out = int(mod.nf)
    fused = getattr(parent, "split_size", None) == n_out // 3 and n_out % 3 == 0
    blocks = 3 if fused else 1
    head_dim = getattr(parent, "head_dim", None)
    if fused and isinstance(head_dim, int) and (n_out // 3 // head_dim) % tp:
        raise ShardingError(f"{name}: {n_out // 3 // head_dim} attention heads cannot be split over {tp} chips "
                            f"(tensor parallelism gives each chip whole heads)")
    w = mod.weight.data.reshape(mod.weight.shape[0], blocks, n_out // blocks)
    mod.weight = nn.Parameter(_split(w, 2, tp, rank, name).reshape(mod.weight.shape[0], -1), requires_grad=False)
    if mod.bias is not None:
        b = mod.bias.data.reshape(blocks, n_out // blocks)
        mod.bias = nn.Parameter(_split(b, 1, tp, rank, name).reshape(-1), requires_grad=False)
    mod.nf = n_out // tp
    if fused:
        setattr(parent, "split_size", n_out // 3 // tp)  # noqa: B010 (an attribute nn.Module's type does not declare)
    return blocks


def _rowwise_conv1d(name: str, mod: Any, d_out: int | None, style: Any, tp: int, rank: int) -> None:
    """A `Conv1D` row-parallel: its input rows split; the bias (Conv1D's addmm needs one)
    is zero on the chip and added once after the sum."""
    mod.weight = nn.Parameter(_split(mod.weight.data, 0, tp, rank, name), requires_grad=False)
    bias = mod.bias.data.clone()
    mod.bias = nn.Parameter(torch.zeros_like(bias), requires_grad=False)
    mod.register_parameter("tp_bias", nn.Parameter(bias, requires_grad=False))
    if _shard_dim(_first(style.input_layouts)) is None:
        mod.register_forward_pre_hook(lambda m, args: (ops.shard(args[0], -1, tp), *args[1:]))

    def reduce(m: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        out = ops.all_reduce(out, tp) if d_out is None else ops.reduce_scatter(out, d_out, tp)
        return out + cast(torch.Tensor, m.tp_bias)

    mod.register_forward_hook(reduce)


def _rowwise(name: str, mod: nn.Module, style: Any, tp: int, rank: int) -> None:
    d_out = _shard_dim(_first(style.output_layouts))
    if _is_conv1d(mod):
        _rowwise_conv1d(name, mod, d_out, style, tp, rank)
        return
    if isinstance(mod, nn.Embedding):  # replicated table; only the output layout applies
        if d_out is not None:
            mod.register_forward_hook(lambda m, args, out: ops.shard(out, d_out, tp))
        return
    if not isinstance(mod, nn.Linear):
        raise ShardingError(f"{name}: RowwiseParallel shards nn.Linear layers; this one is a {type(mod).__name__}")
    mod.weight = nn.Parameter(_split(mod.weight.data, 1, tp, rank, name), requires_grad=False)
    mod.in_features //= tp
    bias = mod.bias
    mod.register_parameter("bias", None)
    if bias is not None:
        mod.register_parameter("tp_bias", nn.Parameter(bias.data.clone(), requires_grad=False))
    if _shard_dim(_first(style.input_layouts)) is None:
        mod.register_forward_pre_hook(lambda m, args: (ops.shard(args[0], -1, tp), *args[1:]))

    def reduce(m: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        out = ops.all_reduce(out, tp) if d_out is None else ops.reduce_scatter(out, d_out, tp)
        b = getattr(m, "tp_bias", None)
        return out if b is None else out + b

    mod.register_forward_hook(reduce)


def _prepare(mod: nn.Module, have: Any, want: Any, tp: int) -> None:
    """`PrepareModuleOutput`: convert the outputs from layout `have` to `want`."""
    convert = _converter(have, want, tp)
    mod.register_forward_hook(lambda m, args, out: _map_out(out, convert))


def _prepare_input(mod: nn.Module, style: Any, tp: int) -> None:
    """`PrepareModuleInput`: positional inputs by `input_layouts`, keyword inputs by
    `input_kwarg_layouts` (None: left as it is)."""
    def as_tuple(x: Any) -> tuple:
        return tuple(x) if isinstance(x, (tuple, list)) else (x,)

    pos = [_converter(h, w, tp) for h, w in zip(as_tuple(style.input_layouts), as_tuple(style.desired_input_layouts))]
    have_kw = getattr(style, "input_kwarg_layouts", None) or {}
    want_kw = getattr(style, "desired_input_kwarg_layouts", None) or {}
    kw = {k: _converter(have_kw[k], want_kw.get(k), tp) for k in have_kw}

    def hook(m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        args = tuple(pos[i](a) if i < len(pos) else a for i, a in enumerate(args))
        kwargs = {k: kw[k](v) if k in kw else v for k, v in kwargs.items()}
        return args, kwargs

    mod.register_forward_pre_hook(hook, with_kwargs=True)


def _converter(have: Any, want: Any, tp: int) -> Any:
    if have is None or want is None:
        return lambda t: t
    d_have, d_want = _shard_dim(have), _shard_dim(want)

    def convert(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or d_have == d_want:
            return t
        if d_want is None:
            assert d_have is not None
            return ops.all_gather(t, d_have, tp)
        if d_have is None:
            return ops.shard(t, d_want, tp)
        raise ShardingError(f"converting Shard({d_have}) to Shard({d_want}) (an all-to-all) is not supported")

    return convert


def _map_out(out: Any, fn: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return tuple(fn(o) for o in out)
    if hasattr(out, "last_hidden_state"):  # a transformers ModelOutput
        out.last_hidden_state = fn(out.last_hidden_state)
        return out
    return out
