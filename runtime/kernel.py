"""`tilecc.kernel(path_or_source)`: a tile-DSL kernel callable on the simulator.

    k = tilecc.kernel("examples/kernels/gemm_gelu.tdsl")
    y = k(a, b, bias, target="cloud")     # numpy in, numpy out (or torch in, torch out)
    print(k.report)                       # cycles, roofline bound, utilisation, ...
    print(k.ir("tile"), k.ir("npu"), k.asm())

The front end (`frontend/dsl`) parses the kernel and lowers it to the tile dialect; this
module is the kernel's compile driver. The kernel compiles once per (input shapes and
dtypes, target): `lower.build_module` gives the tile-dialect module, list-scheduled a few
ways (`schedule_variants`), and the compiler's own pipeline tail
(`runtime.compiler.compile_tile_module`: plan-sram, plan-hbm, lower-tile-to-npu,
npu-insert-sync) makes each variant's Program, exactly as for a compiled model; the
fastest on the simulator is kept. Every variant's roofline bound is the kernel's
intrinsic work, counted from its source by the same lowering (`frontend/dsl/work.py`),
so the transposes, constants and copies the compiler adds never raise it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tilecc.errors import InputMismatchError, TileccError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import KernelLowering, build_module, kernel_module
from tilecc.frontend.dsl.parser import load_kernels
from tilecc.frontend.dsl.schedule import BOTTLENECK_WEIGHT
from tilecc.frontend.dsl.torch_op import TORCH_DTYPE
from tilecc.ir.graph import GraphProgram
from tilecc.passes.registry import default_pipeline
from tilecc.runtime.compiler import TILE_STAGES, compile_tile_module
from tilecc.runtime.executor import run_program
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.roofline import IntrinsicWork


@dataclass
class Compiled:
    program: Program
    stages: dict[str, str]  # stage name -> IR text after it ("tile": the front end's output)
    module: ModuleOp  # the tile module as the front end built it
    seconds: float


# list-scheduling variants: (slack in units of the target's DMA latency, weight of the
# busiest engine; see schedule_kernel), and None for the order as written. Each is
# compiled and simulated (timing only) and the fastest is kept. Kernels with a long
# straight-line block (unrolled loops) try every slack; slack hardly matters in short
# blocks (loop bodies, where the estimate sees one iteration and not the next one's
# prefetches), which try weights instead.
SCHEDULE_SLACKS = (0.0, 0.25, 1.0)
SCHEDULE_VARIANTS_SHORT = ((0.0, BOTTLENECK_WEIGHT), (0.0, 1.0), (0.0, 0.0), None)
SEARCH_MIN_OPS = 300  # ops in the largest block from which every slack is tried


def schedule_variants(largest: int) -> list[tuple[float, float] | None]:
    """The list-scheduling variants tried for a kernel whose largest block has `largest` ops."""
    if largest < SEARCH_MIN_OPS:
        return list(SCHEDULE_VARIANTS_SHORT)
    return [(s, BOTTLENECK_WEIGHT) for s in SCHEDULE_SLACKS] + [(0.0, 1.0), None]


def compile_kernel(kernel: A.Kernel, shapes: list[tuple[int, ...]], cfg: HardwareConfig,
                   target: str = "", keep_ir: bool = True) -> Compiled:
    """`kernel` at `shapes` for `cfg`: the fastest of its schedule variants."""
    from tilecc.frontend.dsl.schedule import largest_block, schedule_kernel
    from tilecc.simulator.machine import simulate

    t0 = time.perf_counter()
    kl = KernelLowering(kernel, shapes, cfg, target, schedule=False)
    unscheduled = kernel_module(kl, kl.run())
    unscheduled.verify()
    intrinsic = kl.work()  # the kernel's work as written (frontend/dsl/work.py), every variant's bound
    variants = schedule_variants(largest_block(_kernel_func(unscheduled, kernel.name)))
    best: tuple[float, Compiled] | None = None
    for variant in variants:
        module = unscheduled.clone()
        if variant is not None:
            slack, weight = variant
            schedule_kernel(_kernel_func(module, kernel.name), cfg, slack * cfg.dma.latency_cycles, weight)
        compiled = _finish(kernel, module, cfg, keep_ir, intrinsic)
        cycles = simulate(compiled.program.stream, cfg, None, functional=False, record=False).cycles
        if best is None or cycles < best[0]:
            best = (cycles, compiled)
    assert best is not None
    best[1].seconds = time.perf_counter() - t0
    return best[1]


def _kernel_func(module: ModuleOp, name: str) -> func.FuncOp:
    return next(op for op in module.body.block.ops if isinstance(op, func.FuncOp) and op.sym_name.data == name)


def _finish(kernel: A.Kernel, module: ModuleOp, cfg: HardwareConfig, keep_ir: bool,
            intrinsic: IntrinsicWork) -> Compiled:
    """The scheduled tile module through the compiler's tile and npu passes to a Program."""
    stages = {"tile": str(module)} if keep_ir else {}
    front = module.clone()
    gp = GraphProgram(ModuleOp([]), input_names=[p.name for p in kernel.params],
                      output_names=[p.name for p in kernel.results])

    def keep(name: str, m: ModuleOp) -> None:
        stages[name] = str(m)

    program = compile_tile_module(module, gp, cfg, keep if keep_ir else None, intrinsic=intrinsic)
    return Compiled(program, stages, front, 0.0)


class Kernel:
    """A parsed tile-DSL kernel; call it with arrays to compile (once per shapes and
    target) and run it on the simulator."""

    def __init__(self, source: str, filename: str = "<string>", name: str | None = None):
        self.ast = load_kernels(source, filename, name)[0]
        self.name = self.ast.name
        self.sanitize = False
        self.keep_ir = True  # print the IR after every stage (for k.ir()); off for big kernels
        self.report: Report | None = None
        self.compiled: Compiled | None = None
        self._cache: dict[tuple, Compiled] = {}
        self._gpu: dict[tuple, tuple] = {}  # (gpu, shapes, tiles config) -> prepared Triton module
        self.triton_sources: dict[str, str] = {}

    # ---- compile and run ---------------------------------------------------------
    def compile(self, *arrays: Any, target: str | Path | HardwareConfig = "tiny") -> Compiled:
        cfg = load_config(target)
        shapes = [tuple(int(n) for n in a.shape) for a in arrays]
        self._check_dtypes(arrays)
        key = (tuple(shapes), cfg)
        if key not in self._cache:
            self._cache[key] = compile_kernel(self.ast, shapes, cfg, cfg.name, self.keep_ir)
        self.compiled = self._cache[key]
        return self.compiled

    def _check_dtypes(self, arrays: tuple) -> None:
        if len(arrays) != len(self.ast.params):
            raise InputMismatchError(f"kernel {self.name} takes {len(self.ast.params)} array(s) "
                                     f"({', '.join(p.name for p in self.ast.params)}), got {len(arrays)}")
        for p, a in zip(self.ast.params, arrays):
            want = TORCH_DTYPE[p.type.dtype]
            got = a.dtype if isinstance(a, torch.Tensor) else _np_dtype(a, p.name)
            if got != want:
                raise InputMismatchError(f"kernel {self.name}: '{p.name}' is {p.type.dtype}, got an array of {got}")

    def __call__(self, *arrays: Any, target: str | Path | HardwareConfig = "tiny", sanitize: bool | None = None) -> Any:
        as_numpy = not any(isinstance(a, torch.Tensor) for a in arrays)
        tensors = tuple(a if isinstance(a, torch.Tensor) else _to_torch(a, p.type.dtype)
                        for a, p in zip(arrays, self.ast.params))
        if isinstance(target, str) and target == "gpu":
            outs = self.run_gpu(*tensors)
        else:
            c = self.compile(*tensors, target=target)
            outs, self.report = run_program(c.program, tensors,
                                            sanitize=self.sanitize if sanitize is None else sanitize)
        if as_numpy:
            outs = [o.float().numpy() if o.dtype == torch.bfloat16 else o.numpy() for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run_gpu(self, *tensors: torch.Tensor, tiles: str | Path | HardwareConfig = "tiny") -> list[torch.Tensor]:
        """Run the kernel on the GPU fallback backend: its tile IR (tile sizes from the
        `tiles` config, as `target="gpu"` does for models) emitted as Triton kernels
        (`codegen/triton.py`); under Triton's interpreter where there is no CUDA device.
        The Triton sources are kept in `self.triton_sources`."""
        from tilecc.runtime.gpu import prepare_tile_module, run_prepared

        cfg = load_config(tiles)
        self._check_dtypes(tensors)
        shapes = [tuple(int(n) for n in a.shape) for a in tensors]
        key = ("gpu", tuple(shapes), cfg)
        if key not in self._gpu:
            module = build_module(self.ast, shapes, cfg, cfg.name)
            for name, run in default_pipeline(cfg, 0):
                if name in ("plan-sram", "plan-hbm"):
                    run(module)
            self._gpu[key] = prepare_tile_module(module)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        outs, self.triton_sources = run_prepared(self._gpu[key], {}, tuple(t.to(device) for t in tensors), device)
        return [o.cpu() for o in outs]

    # ---- each stage ----------------------------------------------------------------
    def ir(self, stage: str = "tile") -> str:
        """The IR of the last compilation: "tile" (the front end's output), "npu" (after
        npu-insert-sync) or any stage name in `TILE_STAGES`."""
        c = self._last()
        key = {"npu": "npu-insert-sync"}.get(stage, stage)
        if key not in c.stages:
            raise TileccError(f"unknown stage '{stage}' (tile, npu, {', '.join(TILE_STAGES)})")
        return c.stages[key]

    def asm(self) -> str:
        from tilecc.codegen.asm import print_asm

        return print_asm(self._last().program.stream)

    def _last(self) -> Compiled:
        if self.compiled is None:
            raise TileccError(f"kernel {self.name} has not been compiled yet: "
                              "call it or k.compile(*arrays, target=...)")
        return self.compiled

    def as_torch_op(self, qualname: str, target: str = "tiny") -> Any:
        from tilecc.frontend.dsl.torch_op import register

        return register(self, qualname, target)

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.type.dtype}[{', '.join(map(str, p.type.dims))}]" for p in self.ast.params)
        return f"<tilecc.Kernel {self.name}({sig})>"


def _np_dtype(a: Any, name: str) -> torch.dtype:
    arr = np.asarray(a)
    table = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16, np.dtype(np.int32): torch.int32}
    if arr.dtype not in table:
        if arr.dtype == np.float64:
            return torch.float64
        raise InputMismatchError(f"'{name}': numpy dtype {arr.dtype} is not supported "
                                 "(f32, f16, i32; bf16 via float32)")
    return table[arr.dtype]


def _to_torch(a: Any, dtype: str) -> torch.Tensor:
    """A numpy array as the kernel's dtype (bf16 parameters take float32 arrays, rounded)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dtype == "bf16" and t.dtype == torch.float32:
        return t.to(torch.bfloat16)
    return t


def kernel(path_or_source: str | Path, name: str | None = None) -> Kernel:
    """A kernel from a ``.tdsl`` file or from source text (anything containing a newline
    or starting with 'kernel')."""
    text = str(path_or_source)
    if isinstance(path_or_source, Path) or ("\n" not in text and not text.lstrip().startswith("kernel")):
        p = Path(text)
        if not p.is_file():
            raise TileccError(f"tile-DSL file {'is a directory' if p.is_dir() else 'not found'}: {p}")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise TileccError(f"tile-DSL file {p}: cannot be read as text ({why})") from None
        return Kernel(text, str(p), name)
    return Kernel(text, "<string>", name)


__all__ = ["kernel", "Kernel", "compile_kernel", "Compiled", "TORCH_DTYPE"]
