"""The compile cache: whole compiled Programs on disk, keyed by what determines them.

    cache = CompileCache()                  # $TILECC_CACHE_DIR/programs or ~/.cache/tilecc/programs
    key = cache.key(gp, cfg, {"opt_level": 2, "autotune": False})
    program = cache.get(key)                # None: a miss (or a corrupt entry, warned about)
    cache.put(key, program)

`tilecc.compile` uses it (`cache=False` turns it off, `TILECC_COMPILE_CACHE=0` in the
environment too). An entry's key is a SHA-256 over

- the exported graph in a canonical form (`exported_digest`): the torch.export graph's
  code, each node's op, target, arguments and result shapes and dtypes, the graph
  signature, and each parameter's, buffer's and constant's name, dtype, shape and
  bytes, in sorted order; a hit skips the decompositions, the import and the passes.
  (A dynamic-shape model compiles per shape from the graph IR: there the key is the
  printed graph IR, names, dtypes and weight bytes, `graph_digest`);
- the hardware config (every field, canonical JSON);
- the options (`opt_level`, `autotune`);
- the compiler version: `tilecc.__version__`, the program format version, and a
  SHA-256 of the tilecc sources themselves, so an edited compiler never reads programs
  an older one wrote.

An entry is one file, ``<key>.tpg``, in the Program file format (runtime/program.py),
whose header carries a CRC-32 of the body. Writes go to a unique temporary file in the
same directory and are moved into place with `os.replace`, so a reader sees a whole
old entry, a whole new one or none; two processes compiling the same model at once
both write whole files and the last rename wins (both are the same bytes). A reader
that finds a truncated, corrupt or foreign entry warns and returns None, and the
compiler rebuilds and rewrites it. An unwritable directory is warned about and the
compiled program is still returned.

The directory is bounded: after each write, while the entries exceed
``$TILECC_CACHE_MAX_GB`` (default 4 GiB; 0 turns the bound off) the least recently used
entries are deleted (a hit refreshes an entry's modification time), so a cache that
keeps whole programs with their weights does not fill the disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.errors import ConfigError, ProgramFormatError
from tilecc.fsutil import atomic_write
from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.graph import GraphProgram
from tilecc.ir.meta_weights import MetaWeight
from tilecc.runtime.program import PROGRAM_VERSION, Program
from tilecc.simulator.config import HardwareConfig

ENV_DIR = "TILECC_CACHE_DIR"
ENV_SWITCH = "TILECC_COMPILE_CACHE"  # "0": compile caching off by default
# set by tests to plant a miscompilation (passes/break_pass.py): never cache those
ENV_BREAK = "TILECC_TEST_BREAK_PASS"
SUFFIX = ".tpg"


def default_cache_dir() -> Path:
    """``$TILECC_CACHE_DIR``, else the user's cache directory (``$XDG_CACHE_HOME/tilecc``
    or ``~/.cache/tilecc``)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(os.path.expanduser(env))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(os.path.expanduser("~/.cache"))
    return base / "tilecc"


ENV_MAX_GB = "TILECC_CACHE_MAX_GB"


def max_bytes_from_env() -> int:
    """The cache directory's bound in bytes (``$TILECC_CACHE_MAX_GB``, default 4; 0: none)."""
    raw = os.environ.get(ENV_MAX_GB, "4").strip()
    try:
        gb = float(raw)
    except ValueError:
        raise ConfigError(f"'{ENV_MAX_GB}' = {raw!r} is not a number of GiB (0 turns the bound off)") from None
    if not gb >= 0:
        raise ConfigError(f"'{ENV_MAX_GB}' = {raw!r} must be >= 0 GiB (0 turns the bound off)")
    return int(gb * (1 << 30))


def enabled_by_default() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off") \
        and not os.environ.get(ENV_BREAK)


@lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """tilecc's version, the program format version and a hash of the package sources
    (those actually imported: tilecc/sources.py)."""
    import tilecc
    from tilecc.sources import compiler_source_hash

    return f"{tilecc.__version__}/program-{PROGRAM_VERSION}/{compiler_source_hash()}"


def exported_digest(ep: Any) -> str:
    """SHA-256 of a canonical serialisation of a (static-shape) torch ExportedProgram:
    the graph's code, every node's op, target, arguments and result shapes and dtypes,
    the graph signature (which placeholders are inputs, parameters, buffers,
    constants) and the bytes of every parameter, buffer and constant, in sorted order.
    Source locations are left out: they do not change the compiled program."""
    import torch

    h = hashlib.sha256()
    h.update(ep.graph_module.code.encode())
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        meta = [(str(v.dtype), [str(d) for d in v.shape]) if isinstance(v, torch.Tensor) else repr(v) for v in vals]
        h.update(repr((node.op, str(node.target), str(node.args), str(node.kwargs), meta)).encode())
    h.update(str(ep.graph_signature).encode())
    tensors = {**{f"state:{k}": v for k, v in ep.state_dict.items()},
               **{f"const:{k}": v for k, v in ep.constants.items()}}
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            h.update(f"{name}={t!r}".encode())
            continue
        if t.is_meta:  # no values (ir/meta_weights.py): the program depends on the shape only
            h.update(json.dumps([name, str(t.dtype), list(t.shape), "meta"]).encode())
            continue
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(json.dumps([name, str(t.dtype), list(tensors[name].shape)]).encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def graph_digest(gp: GraphProgram) -> str:
    """SHA-256 of a canonical serialisation of the graph program (IR text, names,
    dtypes and weight bytes)."""
    h = hashlib.sha256()
    h.update(str(gp.module).encode())
    h.update(json.dumps([gp.input_names, gp.output_names, gp.input_dtypes, gp.output_dtypes]).encode())
    for name in sorted(gp.weights):
        if isinstance(gp.weights[name], MetaWeight):
            h.update(json.dumps([name, str(gp.weights[name].dtype), list(gp.weights[name].shape), "meta"]).encode())
            continue
        held: object = gp.weights[name]
        if isinstance(held, Bf16Weight):  # its bits (reading it as float32 would copy it)
            bits = held.bits
            h.update(json.dumps([name, "bf16", list(bits.shape)]).encode())
            h.update(np.ascontiguousarray(bits).tobytes())
            continue
        w = np.ascontiguousarray(np.asarray(gp.weights[name]))
        h.update(json.dumps([name, str(w.dtype), list(w.shape)]).encode())
        h.update(w.tobytes())
    return h.hexdigest()


class CompileCache:
    def __init__(self, cache_dir: str | os.PathLike | None = None):
        base = Path(os.path.expanduser(str(cache_dir))) if cache_dir is not None else default_cache_dir()
        self.dir = base / "programs"
        self.hits = 0
        self.misses = 0
        self.rebuilt = 0  # corrupt entries found (and rebuilt by the caller)

    def key(self, graph: Any, cfg: HardwareConfig, options: dict[str, Any]) -> str:
        """The entry key of `graph` (a torch ExportedProgram or a GraphProgram)."""
        parts = {
            "graph": graph_digest(graph) if isinstance(graph, GraphProgram) else "export:" + exported_digest(graph),
            "config": json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str),
            "options": json.dumps(options, sort_keys=True, default=str),
            "compiler": compiler_fingerprint(),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def get(self, key: str) -> Program | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as e:
            warnings.warn(f"compile cache entry {path} cannot be read ({e}); compiling", stacklevel=3)
            self.misses += 1
            return None
        try:
            program = Program.from_bytes(data, str(path))
        except ProgramFormatError as e:
            warnings.warn(f"compile cache entry is corrupt ({e}); rebuilding it", stacklevel=3)
            self.rebuilt += 1
            self.misses += 1
            return None
        self.hits += 1
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return program

    def put(self, key: str, program: Program) -> None:
        try:
            atomic_write(self.path(key), program.to_bytes(), f".{key[:16]}-")
        except OSError as e:
            warnings.warn(f"compile cache {self.dir} cannot be written ({e}); the program is not kept",
                          stacklevel=3)
            return
        self.evict(keep=key)

    def evict(self, keep: str = "", max_bytes: int | None = None) -> int:
        """Delete the least recently used entries (oldest modification time; `get`
        refreshes it) until the directory holds at most `max_bytes` (default
        ``$TILECC_CACHE_MAX_GB``); the entry `keep` stays. Returns the entries deleted."""
        limit = max_bytes_from_env() if max_bytes is None else max_bytes
        if limit <= 0:
            return 0
        entries = []
        for p in self.dir.glob(f"*{SUFFIX}"):
            try:
                st = p.stat()
            except OSError:  # removed by another process meanwhile
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        deleted = 0
        for _, size, p in sorted(entries):
            if total <= limit:
                break
            if p.stem == keep:
                continue
            try:
                p.unlink()
            except OSError:
                continue
            total -= size
            deleted += 1
        return deleted

def resolve(cache: bool | str | os.PathLike | CompileCache | None) -> CompileCache | None:
    """The cache `tilecc.compile(cache=...)` means: None -> the default (on unless
    ``TILECC_COMPILE_CACHE=0``), False -> none, True -> the default directory, a path
    -> that directory, a CompileCache -> itself."""
    if os.environ.get(ENV_BREAK):  # a planted miscompilation must never be cached
        return None
    if isinstance(cache, CompileCache):
        return cache
    if cache is None:
        return CompileCache() if enabled_by_default() else None
    if cache is False:
        return None
    if cache is True:
        return CompileCache()
    return CompileCache(cache)


def compile_cached(graph: Any, cfg: HardwareConfig, cache: Any, *, stats: Any = None,
                   opt_level: int = 2, autotune: Any = False) -> Program:
    """`compile_graph` through the cache `cache` means (see `resolve`). `graph` is a
    GraphProgram or a static-shape torch ExportedProgram (keyed before it is imported,
    so a hit skips the decompositions and the import too). An `Autotuner` instance
    passed as `autotune` bypasses the cache: its caller wants it consulted."""
    from tilecc.passes.schedule.autotune import Autotuner
    from tilecc.runtime.compiler import compile_graph

    def build() -> Program:
        if isinstance(graph, GraphProgram):
            gp = graph
        else:
            from tilecc.frontend.torch_export import import_exported_program

            # lives only for this compile: its weights are views of the model's (the Program
            # copies what it keeps), not a second copy of every weight
            gp = import_exported_program(graph, borrow_weights=True)
        return compile_graph(gp, cfg, stats=stats, opt_level=opt_level, autotune=autotune)

    cc = None if isinstance(autotune, Autotuner) else resolve(cache)
    if cc is None:
        return build()
    try:
        key = cc.key(graph, cfg, {"opt_level": opt_level, "autotune": bool(autotune)})
    except (RuntimeError, TypeError, ValueError) as e:  # a tensor that has no plain bytes (sparse, ...)
        warnings.warn(f"compile cache: this model cannot be keyed ({type(e).__name__}: {e}); compiling "
                      "without the cache", stacklevel=3)
        return build()
    program = cc.get(key)
    if program is not None:
        if stats is not None:
            stats.cache = "hit"
        return program
    program = build()
    if program.timing_only:  # no weight bytes to store (a meta-device model): not cached
        return program
    cc.put(key, program)
    if stats is not None:
        stats.cache = "miss"
    return program
