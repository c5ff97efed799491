"""`model.generate` with `torch.compile(model.forward, backend="tilecc")`: the other road
to the NPU, through dynamo instead of torch.export.

    result = generate_compiled(model, ids, max_new_tokens=8, target="tiny")
    result.tokens, result.matches_eager
    print(result.explanation)     # the prefill and decode graphs: NPU partitions, fallbacks

`transformers`' own loop runs with ``cache_implementation="static"``: its `StaticCache`
gives every decode step the same shapes, so dynamo captures two graphs (the prefill and
one decode step) and tilecc compiles each once; the decode graph then runs on the
simulated NPU for every further token. Ops with no NPU lowering (the rotary embedding's
sin / cos) fall back to eager PyTorch, and the explanation (`tilecc.explain`'s) says how
many ops of each graph ran on the NPU. The model's `forward` is restored afterwards.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tilecc.explanation import Explanation
from tilecc.llm.generate import eager_generate
from tilecc.simulator.config import HardwareConfig


@dataclass
class CompiledGeneration:
    tokens: list[list[int]]
    eager_tokens: list[list[int]] | None
    explanation: Explanation

    @property
    def matches_eager(self) -> bool | None:
        return None if self.eager_tokens is None else self.tokens == self.eager_tokens


def generate_compiled(model: Any, ids: torch.Tensor, max_new_tokens: int, *,
                      target: str | Path | HardwareConfig = "tiny", check_eager: bool = True) -> CompiledGeneration:
    """Greedy `model.generate` (static cache) with its forward compiled by the tilecc backend."""
    model = model.eval()
    eager = eager_generate(model, ids, max_new_tokens) if check_eager else None
    torch._dynamo.reset()  # graphs another model left in dynamo's cache do not count here
    plans: list = []
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.eos_token_id = None
    gen_cfg.do_sample = False
    gen_cfg.max_new_tokens = max_new_tokens
    if gen_cfg.pad_token_id is None:
        gen_cfg.pad_token_id = 0
    options: Any = {"target": target, "plans": plans}  # tilecc's backend options (frontend/dynamo.py)
    model.forward = torch.compile(model.forward, backend="tilecc", options=options)
    try:
        with torch.no_grad():
            out = model.generate(ids, generation_config=gen_cfg, cache_implementation="static",
                                 attention_mask=torch.ones_like(ids))
    finally:
        del model.forward  # the instance attribute: the class's forward again
    return CompiledGeneration(out[:, ids.shape[1]:].tolist(), eager, Explanation(plans, out))
