"""The two programs of LLM generation: prefill and decode, over one device-resident KV cache.

    progs = compile_programs(model, batch=1, prompt_len=P, max_len=P + N, target="cloud")
    logits = progs.prefill(ids, torch.arange(P))           # [B, 1, vocab]: the last position
    logits = progs.decode(next_ids, torch.tensor([P]))     # any step: the position is an input

Both compile one `StaticCacheLM` (tilecc/llm/static_cache.py) at two input shapes:
prefill takes the whole prompt (positions 0..P-1), decode one token per sequence at a
position given as an input, compiled once for the maximum cache length and used for
every step (its masks come from the position, never from a constant). The cache buffers
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
from tilecc.errors import TileccError
from tilecc.llm.static_cache import StaticCacheLM
from tilecc.runtime.compiler import CompileStats
from tilecc.simulator.config import HardwareConfig


@dataclass
class LMPrograms:
    lm: StaticCacheLM
    prefill: CompiledModel
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

    def prefill_inputs(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ids, torch.arange(self.prompt_len)

    def decode_inputs(self, tokens: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= position < self.max_len:
            raise TileccError(f"decode position {position} is outside the cache (0..{self.max_len - 1})")
        return tokens.reshape(self.batch, 1), torch.tensor([position])


class _LastLogits(torch.nn.Module):
    """The cache model returning the last position's logits only ([B, 1, vocab])."""

    def __init__(self, lm: StaticCacheLM):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids, cache_position, last_only=True)


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
    top = _LastLogits(lm).eval()
    t0 = time.perf_counter()
    # example inputs on the weights' device: a model on the meta device (timing only)
    # exports with meta positions, as the cache update mixes them with the meta cache
    dev = next(model.parameters()).device
    ids = torch.zeros(batch, prompt_len, dtype=torch.long, device=dev)
    prefill = tilecc_compile(top, (ids, torch.arange(prompt_len, device=dev)), target=target, **compile_kwargs)
    step = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    decode = tilecc_compile(top, (step, torch.tensor([min(prompt_len, max_len - 1)], device=dev)), target=target,
                            **compile_kwargs)
    decode.share_state(prefill)
    seconds = time.perf_counter() - t0
    return LMPrograms(lm, prefill, decode, prompt_len, seconds, [prefill.compile_stats, decode.compile_stats])
