"""Random programs for differential fuzzing (tests/test_fuzz.py).

A program is a JSON-able *description*: an element type, input shapes, a seed for the
parameters and a list of steps, each one op on earlier values (inputs first):

    {"dtype": "bfloat16", "seed": 3, "inputs": [[5, 37]],
     "steps": [{"op": "linear", "args": [0], "n": 29, "bias": true},
               {"op": "gelu", "args": [1]},
               {"op": "softmax", "args": [2], "dim": 0}],
     "outputs": [3]}

`FuzzModule(desc)` is the torch module that runs it (parameters drawn from `seed`),
`programs()` the hypothesis strategy that builds descriptions (shapes tracked, odd
sizes, broadcasting, views), and `check(desc)` the differential test: export once,
compile at -O0 and -O2 for `tiny`, run each on the simulator with the sanitisers on,
compare every output with eager within the dtype's tolerance. A failing description
saved as tests/fuzz_regressions/*.json is replayed by every test run.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import torch
from hypothesis import strategies as st

REGRESSIONS = Path(__file__).parent / "fuzz_regressions"

UNARY = ("relu", "gelu", "gelu_tanh", "tanh", "sigmoid", "silu", "neg", "abs")
BINARY = ("add", "sub", "mul", "maximum")
REDUCE = ("sum", "mean", "amax")


class FuzzModule(torch.nn.Module):
    def __init__(self, desc: dict):
        super().__init__()
        self.desc = desc
        dtype = getattr(torch, desc["dtype"])
        gen = torch.Generator().manual_seed(int(desc["seed"]))
        self.params = torch.nn.ParameterList()
        self.slot: dict[int, list[int]] = {}
        for i, step in enumerate(desc["steps"]):
            shapes = _param_shapes(step)
            self.slot[i] = []
            for shape, kind in shapes:
                if kind == "weight":
                    t = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
                elif kind == "positive":
                    t = 1.0 + torch.rand(shape, generator=gen)
                else:
                    t = torch.randn(shape, generator=gen) * 0.5
                self.slot[i].append(len(self.params))
                self.params.append(torch.nn.Parameter(t.to(dtype), requires_grad=False))

    def forward(self, *inputs):
        vals = self.values(*inputs)
        outs = [vals[k] for k in self.desc["outputs"]]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def values(self, *inputs) -> list[torch.Tensor]:
        """Every value of the program: the inputs, then one per step."""
        vals = list(inputs)
        for i, step in enumerate(self.desc["steps"]):
            p = [self.params[j] for j in self.slot[i]]
            vals.append(_apply(step, [vals[a] for a in step["args"]], p))
        return vals

    def error_scales(self, *inputs, values: list[torch.Tensor] | None = None) -> list[float]:
        """Per output, the magnitude its rounding errors scale with. It is the output's
        own magnitude, except where a sum or difference cancels: ``a - b`` of two values
        near 16 is near 0, but rounding a or b differently (a fused epilogue keeps a
        bf16 matmul's fp32 accumulator, eager rounds it) moves it by an ulp of 16. The
        magnitude propagates through elementwise ops (sums and differences: the larger
        operand; products: the product; Lipschitz-1 activations, views, mean and max:
        unchanged), matmuls (times the weight's largest row sum) and sums (times the
        count); normalising ops (softmax, layer norm) start afresh from their output."""
        if values is None:
            with torch.no_grad():
                values = self.values(*inputs)
        vals = values
        mag = [float(v.float().abs().max()) if v.numel() else 0.0 for v in vals]
        n_in = len(inputs)
        for i, step in enumerate(self.desc["steps"]):
            op, a = step["op"], [mag[j] for j in step["args"]]
            p = [self.params[j].float() for j in self.slot[i]]
            own = mag[n_in + i]
            if op in ("add", "sub", "maximum"):
                m = max(a)
            elif op in ("add_param", "sub_param", "maximum_param"):
                m = max(a[0], float(p[0].abs().max()))
            elif op == "mul":
                m = a[0] * a[1]
            elif op == "mul_param":
                m = a[0] * float(p[0].abs().max())
            elif op == "scale":
                m = a[0] * abs(step["c"]) + abs(step["b"])
            elif op in ("linear", "matmul_param"):
                w = p[0] if op == "matmul_param" else p[0].T
                m = a[0] * float(w.abs().sum(0).max()) + (float(p[1].abs().max()) if op == "linear" and step["bias"] else 0.0)
            elif op == "gram":
                m = a[0] * a[0] * vals[step["args"][0]].shape[-1]
            elif op == "sum":
                m = a[0] * vals[step["args"][0]].shape[step["dim"]]
            elif op in ("softmax", "layernorm"):
                m = own
            else:  # unary, div by a parameter >= 1, mean, amax, views
                m = a[0]
            mag[n_in + i] = max(own, m)
        return [mag[k] for k in self.desc["outputs"]]


def _param_shapes(step: dict) -> list[tuple[list[int], str]]:
    op = step["op"]
    if op == "linear":
        out = [([step["n"], step["k"]], "weight")]
        return out + ([([step["n"]], "bias")] if step["bias"] else [])
    if op == "matmul_param":
        return [([step["k"], step["n"]], "weight")]
    if op in ("add_param", "mul_param", "sub_param", "maximum_param"):
        return [(step["shape"], "bias")]
    if op == "div_param":
        return [(step["shape"], "positive")]
    if op == "layernorm":
        return [([step["d"]], "positive"), ([step["d"]], "bias")] if step["affine"] else []
    return []


def _apply(step: dict, args: list[torch.Tensor], p: list[torch.Tensor]) -> torch.Tensor:
    op, x = step["op"], args[0]
    F = torch.nn.functional
    if op in UNARY:
        if op == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        return {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                "silu": F.silu, "neg": torch.neg, "abs": torch.abs}[op](x)
    if op in BINARY:
        y = args[1]
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum}[op](x, y)
    if op.endswith("_param"):
        if op == "matmul_param":
            return x @ p[0]
        fn = {"add_param": torch.add, "sub_param": torch.sub, "mul_param": torch.mul,
              "maximum_param": torch.maximum, "div_param": torch.div}[op]
        return fn(x, p[0]) if not step.get("swap") else fn(p[0], x)
    if op == "scale":
        return x * step["c"] + step["b"]
    if op == "linear":
        return F.linear(x, p[0], p[1] if step["bias"] else None)
    if op == "gram":
        return x @ x.transpose(-1, -2)
    if op in REDUCE:
        fn = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[op]
        return fn(x, dim=step["dim"], keepdim=step["keepdim"])
    if op == "softmax":
        return torch.softmax(x, dim=step["dim"])
    if op == "layernorm":
        return F.layer_norm(x, (step["d"],), *(p if step["affine"] else ()))
    if op == "reshape":
        return x.reshape(step["shape"])
    if op == "permute":
        return x.permute(step["perm"])
    if op == "slice":
        d, s, n = step["dim"], step["start"], step["length"]
        return x.narrow(d, s, n)
    raise ValueError(f"unknown fuzz op {op!r}")


# ---- the strategy -----------------------------------------------------------------

SIZE = st.integers(1, 40)


@st.composite
def programs(draw, max_steps: int = 6) -> dict:
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    rank = draw(st.integers(2, 3))
    shape = [draw(st.integers(1, 4))] * (rank - 2) + [draw(SIZE), draw(SIZE)]
    inputs = [shape]
    if draw(st.booleans()):
        inputs.append(list(shape))
    shapes: list[list[int]] = [list(s) for s in inputs]
    steps: list[dict] = []
    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(shapes) - 1))
        x = shapes[i]
        step, out = _draw_step(draw, i, x, shapes)
        steps.append(step)
        shapes.append(out)
    outputs = [len(shapes) - 1]
    if draw(st.booleans()) and len(shapes) - 2 >= len(inputs):
        outputs.append(draw(st.integers(len(inputs), len(shapes) - 2)))
    return {"dtype": dtype, "seed": draw(st.integers(0, 2**16)), "inputs": inputs, "steps": steps,
            "outputs": outputs}


def _broadcast_shape(draw, x: list[int]) -> list[int]:
    shape = [d if draw(st.booleans()) else 1 for d in x]
    drop = draw(st.integers(0, len(x) - 1))  # leading dims may be absent
    return shape[drop:]


def _draw_step(draw, i: int, x: list[int], shapes: list[list[int]]) -> tuple[dict, list[int]]:
    kinds = ["unary", "binary_param", "scale", "linear", "reduce", "softmax", "layernorm", "view",
             "binary", "gram", "matmul_param"]
    kind = draw(st.sampled_from(kinds))
    rank = len(x)
    if kind == "unary" or (kind == "gram" and rank < 2):
        return {"op": draw(st.sampled_from(UNARY)), "args": [i]}, x
    if kind == "binary":
        same = [j for j, s in enumerate(shapes) if s == x and j != i]
        if same:
            return {"op": draw(st.sampled_from(BINARY)), "args": [i, draw(st.sampled_from(same))]}, x
        kind = "binary_param"
    if kind == "binary_param":
        op = draw(st.sampled_from(["add_param", "sub_param", "mul_param", "maximum_param", "div_param"]))
        b = _broadcast_shape(draw, x)
        swap = op != "div_param" and draw(st.booleans())
        return {"op": op, "args": [i], "shape": b, "swap": swap}, x
    if kind == "scale":
        c = draw(st.sampled_from([0.5, 2.0, -1.5, 0.125]))
        return {"op": "scale", "args": [i], "c": c, "b": draw(st.sampled_from([0.0, 1.0, -0.25]))}, x
    if kind in ("linear", "matmul_param"):
        n = draw(SIZE)
        if kind == "linear":
            return {"op": "linear", "args": [i], "k": x[-1], "n": n, "bias": draw(st.booleans())}, x[:-1] + [n]
        return {"op": "matmul_param", "args": [i], "k": x[-1], "n": n}, x[:-1] + [n]
    if kind == "gram" and rank >= 2:
        return {"op": "gram", "args": [i]}, x[:-1] + [x[-2]]
    if kind == "reduce":
        d = draw(st.integers(0, rank - 1))
        keep = rank == 1 or draw(st.booleans())
        out = list(x)
        if keep:
            out[d] = 1
        else:
            del out[d]
        return {"op": draw(st.sampled_from(REDUCE)), "args": [i], "dim": d, "keepdim": keep}, out
    if kind == "softmax":
        return {"op": "softmax", "args": [i], "dim": draw(st.integers(0, rank - 1))}, x
    if kind == "layernorm":
        return {"op": "layernorm", "args": [i], "d": x[-1], "affine": draw(st.booleans())}, x
    # views
    view = draw(st.sampled_from(["reshape", "permute", "slice"]))
    if view == "permute" and rank >= 2:
        perm = draw(st.permutations(list(range(rank))))
        return {"op": "permute", "args": [i], "perm": list(perm)}, [x[p] for p in perm]
    if view == "slice":
        d = draw(st.integers(0, rank - 1))
        if x[d] > 1:
            start = draw(st.integers(0, x[d] - 1))
            length = draw(st.integers(1, x[d] - start))
            out = list(x)
            out[d] = length
            return {"op": "slice", "args": [i], "dim": d, "start": start, "length": length}, out
    # reshape: merge the last two dims, or split the last into two factors
    if rank >= 2 and draw(st.booleans()):
        out = x[:-2] + [x[-2] * x[-1]]
    else:
        factors = [f for f in range(2, x[-1]) if x[-1] % f == 0]
        if factors:
            f = draw(st.sampled_from(factors))
            out = x[:-1] + [f, x[-1] // f]
        else:
            out = [1] + list(x)
    return {"op": "reshape", "args": [i], "shape": out}, out


# ---- the differential check ----------------------------------------------------------


def make_inputs(desc: dict) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(int(desc["seed"]) + 1)
    dtype = getattr(torch, desc["dtype"])
    return tuple(torch.randn(s, generator=gen).to(dtype) for s in desc["inputs"])


def check(desc: dict, opt_levels: tuple[int, ...] = (0, 2)) -> None:
    """Compile `desc` at each level, simulate with the sanitisers on, compare with eager."""
    import tilecc
    from tilecc.runtime.compare import tolerance

    model = FuzzModule(desc).eval()
    inputs = make_inputs(desc)
    with torch.no_grad():
        vals = model.values(*inputs)
    refs = [vals[k] for k in desc["outputs"]]
    scales = model.error_scales(*inputs, values=vals)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, inputs)
    for level in opt_levels:
        cm = tilecc.compile(ep, inputs, target="tiny", opt_level=level, cache=False)
        cm.sanitize = True
        got = cm(*inputs)
        gots = list(got) if isinstance(got, tuple) else [got]
        assert len(gots) == len(refs)
        for k, (g, e) in enumerate(zip(gots, refs)):
            assert g.shape == e.shape and g.dtype == e.dtype, (level, k, g.shape, e.shape, g.dtype, e.dtype)
            rtol, atol = tolerance(e.dtype, max(scales[k], float(e.float().abs().max()) if e.numel() else 1.0))
            # a saved case whose difference is explained numerically (its "explained"
            # note) carries the absolute tolerance that explanation justifies
            atol = max(atol, float(desc.get("atol", 0.0)))
            torch.testing.assert_close(g.float(), e.float(), rtol=rtol, atol=atol,
                                       msg=lambda m, level=level, k=k: f"-O{level} output {k}: {m}")


def case_path(desc: dict, directory: Path = REGRESSIONS) -> Path:
    """Where the regression case of program `desc` is (or would be) saved."""
    text = json.dumps({k: v for k, v in desc.items() if k != "atol"}, sort_keys=True)
    return directory / f"case-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"


def with_saved_tolerance(desc: dict, directory: Path = REGRESSIONS) -> dict:
    """`desc` with the absolute tolerance its saved, explained case carries (a deep run
    replaying hypothesis's database meets those programs again)."""
    path = case_path(desc, directory)
    if "atol" not in desc and path.exists():
        saved = json.loads(path.read_text())
        if saved.get("explained") and "atol" in saved["program"]:
            return {**desc, "atol": saved["program"]["atol"]}
    return desc


def save_regression(desc: dict, error: BaseException, directory: Path = REGRESSIONS) -> Path:
    """Write `desc` (with the failure it gave) as a regression case; returns the path. A
    saved case with an explanation is never overwritten."""
    directory.mkdir(parents=True, exist_ok=True)
    path = case_path(desc, directory)
    if path.exists() and json.loads(path.read_text()).get("explained"):
        return path
    msg = " ".join(str(error).split())[:500]
    # the compiler that failed, by the hash of the sources it imported (tilecc/sources.py):
    # a replay can tell whether it runs the same code
    from tilecc.runtime.cache import compiler_fingerprint

    path.write_text(json.dumps({"program": desc, "failure": f"{type(error).__name__}: {msg}",
                                "compiler": compiler_fingerprint()}, indent=1, sort_keys=True) + "\n")
    return path
