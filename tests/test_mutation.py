"""Mutation testing end to end: faults planted in compiled programs (a wait removed, an
address shifted, semaphores swapped, a store dropped) must all be caught, by the
sanitisers (race, uninitialised read), the simulator (deadlock, out of bounds) or the
comparison of the outputs with torch eager, exactly as a user's run would see them
(`run_program(..., sanitize=True)`). The one exception is a removed wait that the sync
analysis proves redundant (implied by the other waits): the program is unchanged in
meaning, and its outputs must then be bit-identical.

tests/test_sanitizers.py checks the sanitisers' verdicts against brute-force oracles;
this file checks that no planted fault goes unnoticed by a user. Each mutant runs on two
input sets, ordinary and 16x larger: some faults are invisible on small values (a
softmax that subtracts another tile's row maximum instead of its own is shift-invariant
and only overflows when the logits are large). A mutant that still stays within eager's
tolerance on both sets (that softmax case, behind a layer norm that bounds the logits)
is an equivalent mutant up to rounding: it is caught by comparing its outputs bit for bit
with the unmutated program's, counted separately. A shifted address whose outputs are
bit-identical on both sets is an equivalent mutant (a bias row replicated on every
partition, read one partition further down): nothing to catch, counted. Both kinds
must stay a small minority (at most a tenth of the mutants, or two).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import tilecc
from tilecc.errors import SimulatorError
from tilecc.runtime.compare import compare
from tilecc.runtime.executor import run_program
from tilecc.runtime.program import Program
from tilecc.simulator.isa import Flag, Opcode
from tilecc.simulator.sanitizers import redundant_waits

PER_KIND = 8
SUMMARY: Counter = Counter()


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(40)
        self.a = torch.nn.Linear(40, 37)
        self.b = torch.nn.Linear(37, 29)

    def forward(self, x):
        return torch.softmax(self.b(torch.nn.functional.gelu(self.a(self.ln(x)))), -1) + x[:, :29]


class _Attn(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


MODELS = {
    "mlp_f32": lambda: (_Mlp(), (torch.randn(21, 40),)),
    "attn_bf16": lambda: (_Attn(), tuple(torch.randn(2, 19, 16, dtype=torch.bfloat16) for _ in range(3))),
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    torch.manual_seed(0)
    model, inputs = MODELS[request.param]()
    model = model.eval()
    if any(t.dtype == torch.bfloat16 for t in inputs):
        model = model.to(torch.bfloat16)
    large = tuple(t * 16 for t in inputs)  # a second input set of large magnitude
    with torch.no_grad():
        ref, ref_large = model(*inputs), model(*large)
    cm = tilecc.compile(model, inputs, target="tiny", cache=False)
    outs, _ = run_program(cm.program, inputs, sanitize=True)
    assert compare(outs, [ref])[0]
    assert compare(run_program(cm.program, large, sanitize=True)[0], [ref_large])[0]
    return request.param, cm.program, [(inputs, [ref]), (large, [ref_large])], outs


def _mutant(program: Program, stream: np.ndarray) -> Program:
    p = Program(**{**program.__dict__, "stream": stream})
    return p


def verdict(case, stream: np.ndarray) -> str:
    """Run the mutant on each input set (ordinary, then large magnitude), sanitised, and
    compare with eager: the first failure is the verdict."""
    name, program, sets, clean = case
    mutant = _mutant(program, stream)
    for k, (inputs, ref) in enumerate(sets):
        try:
            outs, _ = run_program(mutant, inputs, sanitize=True)
        except SimulatorError as e:
            return f"caught: {type(e).__name__}"
        if not compare(outs, ref)[0]:
            return "caught: outputs differ from eager" + (" (large inputs)" if k else "")
        if k == 0:
            identical = all(torch.equal(a, b) for a, b in zip(outs, clean))
    if identical:  # no observable effect on either input set: an equivalent mutant
        return "equivalent: identical outputs"
    # within eager's tolerance on both input sets, but not the bits the unmutated program
    # gives: caught by a bit-exact comparison with it (see the module docstring)
    return "caught: bits differ from the unmutated program (within eager tolerance)"


def _record(kind: str, v: str) -> None:
    SUMMARY[(kind, v)] += 1


def test_removed_waits(case):
    _, program, *_ = case
    s = program.stream
    red = redundant_waits(s, program.config)
    slots = np.argwhere(s["wait_sem"] >= 0)
    rng = np.random.default_rng(11)
    for i, j in slots[rng.choice(len(slots), min(PER_KIND, len(slots)), replace=False)]:
        m = s.copy()
        m["wait_sem"][i, j], m["wait_val"][i, j] = -1, 0
        v = verdict(case, m)
        _record("remove wait" + (" (redundant)" if red[i, j] else ""), v)
        if red[i, j]:
            assert v == "equivalent: identical outputs", v
        else:
            assert v.startswith("caught"), (int(i), v)


def test_swapped_semaphores(case):
    _, program, *_ = case
    s = program.stream
    rng = np.random.default_rng(12)
    kernel = np.cumsum(s["opcode"] == Opcode.BARRIER)
    red = redundant_waits(s, program.config)
    done = 0
    for i in rng.permutation(np.flatnonzero((s["wait_sem"] >= 0).any(axis=1))):
        if done == PER_KIND:
            break
        used = [j for j in np.flatnonzero(s["wait_sem"][i] >= 0) if not red[i, j]]
        if not used:
            continue
        j = used[0]
        same = (kernel == kernel[i]) & (s["signal_sem"] >= 0)
        others = sorted(set(s["signal_sem"][same].tolist()) - set(s["wait_sem"][i].tolist()))
        if not others:
            continue
        m = s.copy()
        m["wait_sem"][i, j] = others[rng.integers(len(others))]
        v = verdict(case, m)
        _record("swap semaphore", v)
        assert v.startswith("caught"), (int(i), v)
        done += 1
    assert done > 0


def test_shifted_addresses(case):
    _, program, *_ = case
    s = program.stream
    rng = np.random.default_rng(13)
    slots = []
    for i in np.flatnonzero(s["opcode"] != Opcode.BARRIER).tolist():
        o = int(s["opcode"][i])
        fields = ["o"] if o == Opcode.DMA_LOAD else ["a"] if o == Opcode.DMA_STORE else ["a", "o"]
        if o == Opcode.MATMUL or (o == Opcode.VEC_BINARY and not s["flags"][i] & Flag.B_IMM):
            fields.append("b")
        slots += [(i, f) for f in fields]
    for n, pick in enumerate(rng.choice(len(slots), PER_KIND, replace=False)):
        i, f = slots[pick]
        m = s.copy()
        if n % 2:
            m[f"{f}_part"][i] += 1
        else:
            m[f"{f}_addr"][i] += 64
        v = verdict(case, m)
        _record("shift address", v)
        # an equivalent shift: e.g. a bias row replicated on every partition read one
        # partition further down (the same values); counted, and must stay rare
        assert v.startswith(("caught", "equivalent")), (i, f, v)


def test_dropped_stores(case):
    _, program, *_ = case
    s = program.stream
    rng = np.random.default_rng(14)
    stores = np.flatnonzero(s["opcode"] == Opcode.DMA_STORE)
    for i in rng.choice(stores, min(PER_KIND, len(stores)), replace=False):
        v = verdict(case, np.delete(s, i))
        _record("drop store", v)
        assert v.startswith("caught"), (int(i), v)


def test_zz_summary(capsys):
    total = sum(SUMMARY.values())
    weak = sum(n for (k, v), n in SUMMARY.items()
               if "redundant" not in k and (v.startswith("caught: bits") or v.startswith("equivalent")))
    assert total == 0 or weak <= max(2, total // 10), SUMMARY
    with capsys.disabled():
        print("\nend-to-end mutation verdicts:")
        for (kind, v), n in sorted(SUMMARY.items()):
            print(f"  {kind:28} {v:42} {n}")
