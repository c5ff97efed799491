"""`tilecc.generate`: greedy decoding on the simulated NPU, with the serving figures.

    result = tilecc.generate(model, ids, max_new_tokens=16, target="cloud")
    result.tokens            # [B, N] generated ids (greedy)
    result.matches_eager     # == model.generate(ids, do_sample=False), when checked
    result.ttft_us, result.tpot_us, result.tokens_per_second, result.joules_per_token

The prefill program runs the prompt and gives the first token; the decode program (one
token per sequence, the position an input) runs N-1 times over the shared static cache
(tilecc/llm/programs.py). The figures, from the simulator's reports on the target:

- ttft_us: time to first token, the prefill program's simulated time;
- tpot_us: time per output token, the mean decode step's time (every sequence of the
  batch gets one token per step);
- tokens_per_second: batch / tpot (decode throughput);
- joules_per_token: a decode step's energy over the batch (J per generated token);
- prefill_roofline_ratio, decode_roofline_ratio: simulated cycles over the workload's
  intrinsic bound (`runtime/report.py`; 1.0 is the physical limit).

`timing_only=True` simulates without values (the simulator's timing model alone) and
computes no tokens: one prefill and one decode step, since a decode step's time does not
depend on the position (its shapes are the maximum cache length's) nor on the data.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tilecc.api import CompiledModel
from tilecc.errors import InputMismatchError, TileccError, TimingOnlyError
from tilecc.llm.programs import LMPrograms, compile_programs
from tilecc.runtime.executor import run_program
from tilecc.runtime.report import Report, critical_path_lines
from tilecc.simulator.config import HardwareConfig


@dataclass
class GenerateResult:
    tokens: list[list[int]] | None
    matches_eager: bool | None
    ttft_us: float
    tpot_us: float
    tokens_per_second: float
    joules_per_token: float
    prefill_roofline_ratio: float
    decode_roofline_ratio: float
    batch: int
    prompt_len: int
    new_tokens: int
    target: str
    eager_tokens: list[list[int]] | None = None
    compile_seconds: float = 0.0
    prefill_bottleneck: str = ""
    decode_bottleneck: str = ""
    remarks: list[str] = field(default_factory=list)
    # the chains of instructions that set the prefill's and one decode step's cycles
    # (`simulator/critical_path.py`, `CriticalPath.to_dict`); empty unless asked for
    prefill_critical_path: dict[str, Any] = field(default_factory=dict)
    decode_critical_path: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = []
        if self.tokens is not None:
            for b, row in enumerate(self.tokens):
                lines.append(f"tokens[{b}]          {' '.join(map(str, row))}")
        if self.matches_eager is not None:
            lines.append("matches eager      " + ("yes (greedy tokens identical to model.generate)"
                                                  if self.matches_eager else "NO"))
        lines += [
            f"TTFT               {self.ttft_us:,.2f} us (prefill of {self.prompt_len} tokens x batch {self.batch})",
            f"TPOT               {self.tpot_us:,.2f} us per decode step",
            f"tokens/s           {self.tokens_per_second:,.1f} (batch {self.batch})",
            f"J/token            {self.joules_per_token:.3e}",
            f"prefill roofline   {self.prefill_roofline_ratio:.2f}x ({self.prefill_bottleneck}-bound)",
            f"decode roofline    {self.decode_roofline_ratio:.2f}x ({self.decode_bottleneck}-bound)",
        ]
        for what, cp in (("prefill", self.prefill_critical_path), ("decode step", self.decode_critical_path)):
            if cp:
                lines.append(f"{what}:")
                lines += ["  " + line for line in critical_path_lines(cp)]
        return "\n".join(lines + [f"remark: {r}" for r in self.remarks])


def _target_name(target: str | Path | HardwareConfig) -> str:
    return target.name if isinstance(target, HardwareConfig) else str(target)


def _check_ids(ids: torch.Tensor, vocab: int | None) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise InputMismatchError("generate: the prompt must be an integer tensor of token ids [batch, length]")
    if ids.numel() and vocab is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise InputMismatchError(f"generate: token ids must lie in [0, {vocab}) (the vocabulary)")


def eager_generate(model: Any, ids: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
    """`model.generate(ids, do_sample=False)` for exactly `max_new_tokens` tokens (no
    stopping at an end-of-sequence token, as tilecc's loop does not stop either)."""
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.eos_token_id = None
    gen_cfg.do_sample = False
    gen_cfg.max_new_tokens = max_new_tokens
    gen_cfg.min_new_tokens = None
    if gen_cfg.pad_token_id is None:
        gen_cfg.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(ids, generation_config=gen_cfg, attention_mask=torch.ones_like(ids))
    return out[:, ids.shape[1]:].tolist()


def _timed_run(cm: CompiledModel, inputs: tuple, functional: bool,
               trace: str | Path | None = None) -> tuple[list[torch.Tensor], Report]:
    """One run of a compiled program on the simulator with its state, functional or
    timing-only (the state's values are then not updated)."""
    if functional and trace is None:
        out = cm(*inputs)
        assert cm.report is not None
        return [out], cm.report
    if not functional and trace is None:
        return [], cm.simulate(*inputs)  # shapes only: meta-device weights and cache too
    program = cm.program_for(inputs)
    args = cm.state.program_inputs(program, inputs)
    if program.timing_only:
        raise TimingOnlyError("generate: a trace needs the model's weights (this one is on the meta device); "
                              "run without --trace, or load the weights")
    outputs, report = run_program(program, args, functional=functional, sanitize=cm.sanitize, trace=trace)
    if not functional:
        return [], report  # no values: the outputs are not computed
    return cm.state.absorb(program, outputs, inputs), report


def run_generation(progs: LMPrograms, ids: torch.Tensor, max_new_tokens: int, *, timing_only: bool = False,
                   trace: str | Path | None = None) -> tuple[list[list[int]] | None, Report, list[Report]]:
    """Greedy decoding with compiled programs: (tokens or None, prefill report, decode reports).
    `trace` writes the Perfetto timeline of the first decode step there."""
    functional = not timing_only
    progs.lm.reset()
    progs.prefill.state.buffers.clear()  # the cache starts empty for this prompt
    outputs, prefill_report = _timed_run(progs.prefill.compiled, progs.prefill_inputs(ids), functional)
    steps = max_new_tokens - 1 if functional else min(1, max_new_tokens - 1)
    next_ids = outputs[0][:, -1, :].argmax(-1) if functional else torch.zeros(progs.batch, dtype=torch.long)
    tokens = [next_ids]
    reports = []
    for i in range(steps):
        inputs = progs.decode_inputs(next_ids, progs.prompt_len + i)
        outputs, report = _timed_run(progs.decode, inputs, functional, trace if i == 0 else None)
        reports.append(report)
        if functional:
            next_ids = outputs[0][:, -1, :].argmax(-1)
            tokens.append(next_ids)
    if timing_only:
        return None, prefill_report, reports
    return torch.stack(tokens, 1).tolist(), prefill_report, reports


def generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int,
    *,
    target: str | Path | HardwareConfig = "tiny",
    timing_only: bool = False,
    check_eager: bool = True,
    trace: str | Path | None = None,
    max_len: int | None = None,
    critical_path: bool = False,
    **compile_kwargs: Any,
) -> GenerateResult:
    """Greedy decoding of `max_new_tokens` tokens after the prompt `ids` ([batch, P]
    token ids) with `model` (a `transformers` causal LM) compiled for `target`; with
    `check_eager`, the tokens are compared with eager `model.generate` (exactly);
    `critical_path` adds the chains of instructions that set the prefill's and one
    decode step's cycles (where a layer's time goes, each shared kernel's launches summed)."""
    if max_new_tokens < 1:
        raise TileccError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    _check_ids(ids, vocab)
    batch, prompt_len = ids.shape
    max_len = max_len or prompt_len + max_new_tokens
    if prompt_len + max_new_tokens > max_len:
        raise TileccError(f"generate: the prompt ({prompt_len}) and {max_new_tokens} new tokens do not fit "
                          f"the cache of {max_len} positions")
    model = model.eval()
    eager = None
    if check_eager and not timing_only:
        eager = eager_generate(model, ids, max_new_tokens)  # before the wrapper tabulates the rotary
    progs = compile_programs(model, batch=batch, prompt_len=prompt_len, max_len=max_len, target=target,
                             **compile_kwargs)
    tokens, pre, decs = run_generation(progs, ids, max_new_tokens, timing_only=timing_only, trace=trace)
    result = summarize(progs, tokens, eager, pre, decs, target, max_new_tokens)
    if critical_path:
        result.prefill_critical_path, result.decode_critical_path = critical_paths(progs, ids)
    return result


def critical_paths(progs: LMPrograms, ids: torch.Tensor) -> tuple[dict[str, Any], dict[str, Any]]:
    """The critical paths (`CriticalPath.to_dict`) of the prefill of `ids` and of the
    first decode step after it, from timing-only runs (the cache's values are neither
    read nor changed)."""
    pre = progs.prefill.compiled.simulate(*progs.prefill_inputs(ids), critical_path=True)
    step = torch.zeros(progs.batch, dtype=torch.long)
    dec = progs.decode.simulate(*progs.decode_inputs(step, min(progs.prompt_len, progs.max_len - 1)),
                                critical_path=True)
    return pre.critical_path, dec.critical_path


def summarize(progs: LMPrograms, tokens: list[list[int]] | None, eager: list[list[int]] | None, pre: Report,
              decs: list[Report], target: Any, new_tokens: int) -> GenerateResult:
    remarks = []
    if decs:
        tpot = sum(r.time_us for r in decs) / len(decs)
        joules = sum(r.energy.get("joules", 0.0) for r in decs) / len(decs)
        ratio = sum(r.roofline_ratio for r in decs) / len(decs)
        dec_bottleneck = decs[0].bottleneck
    else:  # one new token: no decode step ran
        tpot, joules, ratio, dec_bottleneck = 0.0, 0.0, 0.0, ""
        remarks.append("one new token: the prefill gave it, no decode step ran (TPOT 0)")
    return GenerateResult(
        tokens=tokens,
        matches_eager=None if eager is None or tokens is None else tokens == eager,
        ttft_us=pre.time_us,
        tpot_us=tpot,
        tokens_per_second=progs.batch * 1e6 / tpot if tpot else 0.0,
        joules_per_token=joules / progs.batch,
        prefill_roofline_ratio=pre.roofline_ratio,
        decode_roofline_ratio=ratio,
        batch=progs.batch,
        prompt_len=progs.prompt_len,
        new_tokens=new_tokens,
        target=_target_name(target),
        eager_tokens=eager,
        compile_seconds=progs.compile_seconds,
        prefill_bottleneck=pre.bottleneck,
        decode_bottleneck=dec_bottleneck,
        remarks=remarks,
    )
