"""The two programs of LLM generation: prefill and decode, over one device-resident KV cache.

    progs = compile_programs(model, batch=1, prompt_len=P, max_len=P + N, target="cloud")
    logits = progs.prefill(ids)                            # [B, 1, vocab]: the last position
    logits = progs.prefill(ids, torch.arange(P))           # the same (the positions are checked)
    logits = progs.decode(next_ids, torch.tensor([P]))     # any step: the position is an input

Both compile one `StaticCacheLM` (tilecc/llm/static_cache.py) at two input shapes:
prefill takes the whole prompt, decode one token per sequence at a position given as an
input, compiled once for the maximum cache length and used for every step (its masks
come from the position, never from a constant).

A prefill always covers positions 0..P-1 of an empty cache, so its program takes the
token ids alone and the positions are a constant of it (`torch.arange(P)` inside the
traced forward): the attention mask built from them ("key position <= query position")
is then a compile-time constant, which recognise-attention (passes/graph/attention.py)
finds to be the causal pattern, so the flash kernel skips the masked tiles (the upper
triangle and the cache slots past the prompt) and no mask is built at run time. The
intrinsic bound counts the same causal pairs (`ir/graph_work.py`: a compile-time mask's
masked pairs are no work). `PrefillProgram` accepts the positions for the older call
form and refuses any other than 0..P-1 (`InputMismatchError`). The cache buffers
are the programs' state (`CompiledModel.state`); the decode program shares the prefill
program's (`CompiledModel.share_state`), so what prefill writes, decode reads, with no
copy between them. The weights are each program's constants, resident in its HBM image.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tilecc.api import CompiledModel
from tilecc.api import compile as tilecc_compile
from tilecc.errors import InputMismatchError, TileccError
from tilecc.llm.static_cache import StaticCacheLM
from tilecc.runtime.compiler import CompileStats
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.runtime.state import ModelState
from tilecc.simulator.config import HardwareConfig


class PrefillProgram:
    """The compiled prefill of `prompt_len` tokens: `compiled` takes the token ids alone
    (the positions 0..P-1 are constants of its program). Called as
    ``prefill(ids[, positions])``; positions other than ``arange(P)`` raise."""

    def __init__(self, compiled: CompiledModel, prompt_len: int):
        self.compiled = compiled
        self.prompt_len = prompt_len

    def inputs(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        """The program's inputs for a call with `ids` (and the positions, checked)."""
        if positions is not None and not self._from_zero(positions):
            shown = (f"positions of shape {list(positions.shape)} starting {positions.flatten()[:4].tolist()}"
                     if isinstance(positions, torch.Tensor) else repr(positions))
            raise InputMismatchError(
                f"prefill: the prompt's positions must be 0..{self.prompt_len - 1} (the prefill program fills an "
                f"empty cache from position 0: its positions are compile-time constants), got {shown}; run "
                "tokens at other positions through the decode program")
        return (ids,)

    def _from_zero(self, positions: Any) -> bool:
        """Whether `positions` are 0..P-1 (a meta tensor, shapes only: its shape is)."""
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (self.prompt_len,):
            return False
        return positions.is_meta or torch.equal(positions.to("cpu", torch.long), torch.arange(self.prompt_len))

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> Any:
        return self.compiled(*self.inputs(ids, positions))

    def simulate(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> Report:
        return self.compiled.simulate(*self.inputs(ids, positions))

    @property
    def program(self) -> Program | None:
        return self.compiled.program

    @property
    def state(self) -> ModelState:
        return self.compiled.state

    @property
    def report(self) -> Report | None:
        return self.compiled.report


@dataclass
class LMPrograms:
    lm: StaticCacheLM
    prefill: PrefillProgram
    decode: CompiledModel
    prompt_len: int
    compile_seconds: float = 0.0
    stats: list[CompileStats | None] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return self.lm.batch

    @property
    def max_len(self) -> int:
        return self.lm.max_len

    def prefill_inputs(self, ids: torch.Tensor) -> tuple[torch.Tensor]:
        return self.prefill.inputs(ids)

    def decode_inputs(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= position < self.max_len:
            raise TileccError(f"decode position {position} is outside the cache (0..{self.max_len - 1})")
        return tokens.reshape(self.batch, 1), torch.tensor([position])


class _LastLogits(torch.nn.Module):
    """The cache model returning the last position's logits only ([B, 1, vocab]), at the
    positions given (the decode program's forward)."""

    def __init__(self, lm: StaticCacheLM):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids, cache_position, last_only=True)


class _Prefill(torch.nn.Module):
    """The prefill's forward: the prompt at positions 0..S-1, a constant of the trace (so
    its masks are compile-time constants), the last position's logits ([B, 1, vocab])."""

    def __init__(self, lm: StaticCacheLM):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.lm(input_ids, positions, last_only=True)


def compile_programs(
    model: torch.nn.Module,
    *,
    batch: int,
    prompt_len: int,
    max_len: int,
    target: str | Path | HardwareConfig = "tiny",
    dtype: torch.dtype | None = None,
    **compile_kwargs: Any,
) -> LMPrograms:
    """Wrap `model` with a static cache of `max_len` positions for `batch` sequences and
    compile its prefill (`prompt_len` tokens) and decode (one token) programs."""
    import time

    if prompt_len < 1:
        raise TileccError(f"the prompt must hold at least one token (prompt length {prompt_len})")
    if prompt_len > max_len:
        raise TileccError(f"a prompt of {prompt_len} tokens is longer than the cache ({max_len} positions)")
    lm = StaticCacheLM(model, batch=batch, max_len=max_len, dtype=dtype).eval()
    t0 = time.perf_counter()
    # example inputs on the weights' device: a model on the meta device (timing only)
    # exports with meta positions, as the cache update mixes them with the meta cache
    dev = next(model.parameters()).device
    ids = torch.zeros(batch, prompt_len, dtype=torch.long, device=dev)
    prefill = tilecc_compile(_Prefill(lm).eval(), (ids,), target=target, **compile_kwargs)
    step = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    decode = tilecc_compile(_LastLogits(lm).eval(), (step, torch.tensor([min(prompt_len, max_len - 1)], device=dev)),
                            target=target, **compile_kwargs)
    decode.share_state(prefill)
    seconds = time.perf_counter() - t0
    return LMPrograms(lm, PrefillProgram(prefill, prompt_len), decode, prompt_len, seconds,
                      [prefill.compile_stats, decode.compile_stats])
