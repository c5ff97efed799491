"""Drive PyTorch's own op tests (OpInfo `sample_inputs`) through tilecc.

For every OpInfo that tilecc claims (`CLAIMED`), every sample its support conditions
admit (`admitted`) is exported, compiled for `tiny`, run on the simulator and compared
with eager. Samples that fail and are listed in `EXPECTED_FAILURES` (with the reason)
are counted as known gaps; any other failure fails the test. `benchmarks/op_coverage.py`
prints the README's coverage table from the same run.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import tilecc
from tilecc.errors import TileccError
from tilecc.runtime.compare import tolerance

# OpInfo name -> variant names claimed ("" is the default variant)
CLAIMED: dict[str, tuple[str, ...]] = {
    # elementwise and activations
    "add": ("",), "sub": ("",), "mul": ("",), "div": ("no_rounding_mode", "trunc_rounding", "floor_rounding"), "maximum": ("",),
    "minimum": ("",), "pow": ("",), "abs": ("",), "log": ("",), "erf": ("",), "clamp": ("",),
    "nn.functional.relu": ("",), "exp": ("",), "tanh": ("",), "sigmoid": ("",), "neg": ("",),
    "rsqrt": ("",), "sqrt": ("",), "nn.functional.silu": ("",), "nn.functional.gelu": ("",),
    # comparisons, logic, selection
    "eq": ("",), "ne": ("",), "lt": ("",), "le": ("",), "gt": ("",), "ge": ("",),
    "logical_and": ("",), "logical_not": ("",), "where": ("",),
    # row-wise
    "softmax": ("",), "log_softmax": ("",), "nn.functional.layer_norm": ("",), "cumsum": ("",),
    "nn.functional.group_norm": ("",),
    # reductions
    "sum": ("",), "mean": ("",), "amax": ("",), "amin": ("",), "any": ("",),
    # routing: selection and counting
    "topk": ("",), "sort": ("",), "argsort": ("",), "argmax": ("",), "argmin": ("",),
    "max": ("reduction_with_dim",), "min": ("reduction_with_dim",), "kthvalue": ("",), "histc": ("",),
    # layout
    "permute": ("",), "transpose": ("",), "t": ("",), "reshape": ("",), "view": ("",),
    "expand": ("",), "squeeze": ("",), "unsqueeze": ("",), "clone": ("",), "narrow": ("",),
    "select": ("",), "split": ("",),
    # indexing and creation
    "index_select": ("",), "gather": ("",), "nn.functional.embedding": ("",),
    "zeros_like": ("",), "full_like": ("",),
    # scatters and strided views
    "index_put": ("",), "index_copy": ("",), "index_add": ("",), "slice_scatter": ("",),
    "select_scatter": ("",), "scatter": ("",), "scatter_add": ("",),
    "scatter_reduce": ("sum", "prod", "amax", "amin", "mean"), "as_strided": ("",),
    # convolutional networks
    "nn.functional.conv2d": ("",), "nn.functional.max_pool2d": ("",),
    "nn.functional.avg_pool2d": ("",), "nn.functional.adaptive_avg_pool2d": ("",),
    "nn.functional.pad": ("constant", "reflect", "replicate", "circular"),
    "nn.functional.conv1d": ("",), "nn.functional.conv_transpose1d": ("",),
    "nn.functional.conv_transpose2d": ("",), "nn.functional.interpolate": ("nearest",),
    "nn.functional.batch_norm": ("",), "nn.functional.hardtanh": ("",),
    "nn.functional.hardswish": ("",), "var": ("",), "std": ("",),
    # matmul family
    "matmul": ("",), "mm": ("",), "bmm": ("",), "addmm": ("", "decomposed"),
    "nn.functional.linear": ("",),
}

# (OpInfo name, variant) -> {sample description substring or "*": reason}. A sample that
# fails and matches an entry is a known gap; one that fails and matches none fails the test.
EXPECTED_FAILURES: dict[tuple[str, str], dict[str, str]] = {
    ("topk", ""): {
        "(5, 10, 5), 3, ": "bf16 samples hold tied values; torch's CPU topk orders tied indices arbitrarily, "
        "tilecc by lowest index (a valid answer: the values and the gathered indices equal eager's)",
    },
    ("sort", ""): {
        "(8000,)": "a sort of a row of 8000 elements: longer than an SRAM partition, the streaming selection "
        "would read the row 8000 times (quadratic; no merge sort across tiles yet); a clear TensorTooLargeError",
    },
    ("argsort", ""): {
        "(8000,)": "a row of 8000 elements does not fit one SRAM partition (see sort)",
    },
    ("narrow", ""): {
        "(), ": "a tensor `start` makes the result size data-dependent: torch.export cannot trace it",
    },
    ("index_put", ""): {
        "(tensor([": "a boolean mask index selects a data-dependent set of elements (not imported)",
    },
    ("zeros_like", ""): {"float64": "float64 results: tilecc computes in fp32 / bf16"},
    ("full_like", ""): {"float64": "float64 results: tilecc computes in fp32 / bf16"},
    ("nn.functional.avg_pool2d", ""): {
        ", -2": "a negative divisor_override is rejected (it only flips the sign of the average)",
    },
    ("nn.functional.adaptive_avg_pool2d", ""): {
        r"re:^\(\d+, \d+, \d+\),": "unbatched (3-D) input is not supported yet",
    },
    ("nn.functional.batch_norm", ""): {
        "training=True": "training-mode batch norm updates the running statistics in place",
    },
    ("nn.functional.embedding", ""): {
        "max_norm": "max_norm renormalises the weight in place (a mutation of an input)",
    },
}


@dataclass
class SampleResult:
    op: str
    variant: str
    dtype: str
    desc: str
    status: str  # pass, expected-fail, fail
    detail: str = ""


@dataclass
class OpResult:
    op: str
    variant: str
    samples: list[SampleResult] = field(default_factory=list)


def _op_db():
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def claimed_opinfos():
    return [o for o in _op_db() if o.variant_test_name in CLAIMED.get(o.name, ())]


def admitted(sample) -> bool:
    """tilecc's support conditions: a float input tensor; other tensors float, int or bool
    (int and bool live as int32 on the device); no zero-size dims; rank <= 4."""
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors or not isinstance(sample.input, torch.Tensor) or not sample.input.is_floating_point():
        return False
    ok_dtypes = (torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool)
    return all(t.numel() > 0 and t.dim() <= 4 and t.dtype in ok_dtypes for t in tensors)


def describe(sample) -> str:
    def d(x):
        return f"({', '.join(map(str, x.shape))}{',' if x.dim() == 1 else ''})" if isinstance(x, torch.Tensor) else repr(x)

    parts = [d(sample.input)] + [d(a) for a in sample.args]
    parts += [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


_TENSOR = object()  # marks where the module's tensor inputs go in a sample's arguments


class _Call(torch.nn.Module):
    """`fn(*template)` with the template's tensors as the module's inputs."""

    def __init__(self, fn, spec, leaves):
        super().__init__()
        self.fn, self.spec = fn, spec
        self.leaves = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]

    def forward(self, *tensors):
        it = iter(tensors)
        leaves = [next(it) if x is _TENSOR else x for x in self.leaves]
        inp, args, kwargs = tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def run_sample(opinfo, sample) -> tuple[bool, str]:
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = tuple(x.detach().clone() for x in leaves if isinstance(x, torch.Tensor))
    module = _Call(opinfo.op, spec, leaves)
    with torch.no_grad():
        expected = module(*tensors)
    try:
        cm = tilecc.compile(module, tensors, target="tiny")
        got = cm(*tensors)
    except TileccError as e:
        return False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = list(got) if isinstance(got, tuple) else [got]
    for g, e in zip(got, exp, strict=True):
        rtol, atol = tolerance(e.dtype, float(e.float().abs().max()) if e.numel() else 1.0)
        if g.shape != e.shape or not torch.allclose(g.float(), e.float(), rtol=rtol, atol=atol):
            err = (g.float() - e.float()).abs().max().item() if g.shape == e.shape else "shape"
            return False, f"mismatch (max abs error {err})"
    return True, ""


def expected_failure(opinfo, desc: str) -> str | None:
    table = EXPECTED_FAILURES.get((opinfo.name, opinfo.variant_test_name), {})
    for pattern, reason in table.items():
        if pattern.startswith("re:"):
            if re.search(pattern[3:], desc):
                return reason
        elif pattern == "*" or pattern in desc:
            return reason
    return None


def run_op(opinfo, dtype: torch.dtype, limit: int | None = None) -> OpResult:
    res = OpResult(opinfo.name, opinfo.variant_test_name)
    samples = [s for s in opinfo.sample_inputs("cpu", dtype) if admitted(s)]
    for s in samples[:limit]:
        desc = describe(s)
        ok, detail = run_sample(opinfo, s)
        reason = expected_failure(opinfo, desc)
        status = "pass" if ok else ("expected-fail" if reason else "fail")
        res.samples.append(SampleResult(opinfo.name, opinfo.variant_test_name, str(dtype).split(".")[-1],
                                        desc, status, reason or detail))
    return res
