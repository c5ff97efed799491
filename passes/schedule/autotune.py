"""Autotuning: rank a kernel's candidate schedules by measuring them, remember the winner.

Generic over kernels: a kernel kind (a name), a JSON-able *signature* identifying one
instance (shapes, dtypes, operand layout, the kernel's version tag), a list of
candidate parameter dicts (JSON-able, in the order to try them) and a `measure`
function (parameters -> cycles; e.g. build the kernel alone for that candidate and
simulate it timing-only). The matmul kernel's use is `lower_matmul.tuning_policy`;
attention or elementwise kernels can call `tune` the same way.

API::

    tuner = Autotuner(cfg)                       # cache: $TILECC_CACHE_DIR or ~/.cache/tilecc
    tuner = Autotuner(cfg, "/tmp/c", max_candidates=4)   # measure at most 4 candidates
    best = tuner.tune("matmul", signature, candidates, measure, validate=None)
    best.params, best.cycles, best.cached        # the winner; cached: no search was run
    tuner.searches, tuner.evaluations, tuner.hits  # counters (tests, reports)

`tune` measures every candidate in order (a failing candidate, `TileccError`, counts as
infinitely slow), keeps the fastest (ties: the earlier one) and stores it. The cache:

- location: the `cache_dir` argument, else ``$TILECC_CACHE_DIR``, else
  ``~/.cache/tilecc`` (`os.path.expanduser`);
- one JSON file per hardware config, ``autotune-<config hash>.json``, where the hash is
  a SHA-256 of every config field except its name (so a different config misses);
- an entry's key is the kernel kind, the canonical JSON of its signature and the
  compiler version tag (`VERSION` plus the signature's own kernel version), so a new
  compiler or kernel version misses too;
- writes are atomic: the merged file is written to a temporary file in the same
  directory and moved over the old one with `os.replace` (readers see the old or the
  new file, never half of one);
- a file that does not parse or has the wrong structure is ignored with a
  `warnings.warn` and rewritten by the next store; an unwritable directory is warned
  about and the winner is still used.

Entries are looked up in memory first, so a model with many identical kernels reads the
file once. Measuring is deterministic (the simulator is), so the winner depends only on
the candidates, the config and the compiler.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilecc.errors import TileccError
from tilecc.fsutil import atomic_write
from tilecc.simulator.config import HardwareConfig
from tilecc.version import __version__

FORMAT = 1
VERSION = f"tilecc-{__version__}/autotune-1"  # compiler version tag of every cache entry
ENV_DIR = "TILECC_CACHE_DIR"


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(os.path.expanduser(env)) if env else Path(os.path.expanduser("~/.cache/tilecc"))


def config_hash(cfg: HardwareConfig) -> str:
    """SHA-256 (hex) of every field of the config except its name."""
    data = dataclasses.asdict(cfg)
    data.pop("name", None)
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_key(kind: str, signature: Mapping[str, Any]) -> str:
    return f"{kind}|{VERSION}|{json.dumps(signature, sort_keys=True, separators=(',', ':'))}"


@dataclass(frozen=True)
class TuneResult:
    params: dict[str, Any]
    cycles: float
    cached: bool  # True: found in the cache, nothing was measured
    evaluated: int  # candidates measured by the search that found it


class Autotuner:
    def __init__(self, cfg: HardwareConfig, cache_dir: str | os.PathLike | None = None, *,
                 max_candidates: int | None = None):
        self.cfg = cfg
        self.max_candidates = max_candidates  # measure at most this many (the first ones)
        self.cache_dir = Path(os.path.expanduser(str(cache_dir))) if cache_dir is not None else default_cache_dir()
        self.hash = config_hash(cfg)
        self.searches = 0  # tune calls that ran a search
        self.evaluations = 0  # candidates measured
        self.hits = 0  # tune calls answered from the cache
        self._memo: dict[str, TuneResult] = {}

    @property
    def cache_file(self) -> Path:
        return self.cache_dir / f"autotune-{self.hash[:24]}.json"

    # -- the cache file -----------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        """The entries of the cache file ({} when missing or corrupt, with a warning)."""
        path = self.cache_file
        try:
            text = path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            warnings.warn(f"autotune cache {path} cannot be read ({e}); tuning without it", stacklevel=3)
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            return self._corrupt(f"not valid JSON: {e.msg} at line {e.lineno}")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return self._corrupt(f"not a format-{FORMAT} autotune cache")
        if data.get("config_hash") != self.hash:
            return self._corrupt("it was written for another hardware config")
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(_valid_entry(e) for e in entries.values()):
            return self._corrupt("malformed entries")
        return entries

    def _corrupt(self, why: str) -> dict[str, Any]:
        warnings.warn(f"autotune cache {self.cache_file} is corrupt ({why}); ignoring it, it will be rewritten",
                      stacklevel=4)
        return {}

    def _write(self, key: str, entry: dict[str, Any]) -> None:
        entries = self._read_quiet()
        entries[key] = entry
        data = {"format": FORMAT, "config_hash": self.hash, "config": self.cfg.name, "version": VERSION,
                "entries": {k: entries[k] for k in sorted(entries)}}
        text = json.dumps(data, indent=1, sort_keys=True)
        try:
            atomic_write(self.cache_file, text.encode(), ".autotune-")
        except OSError as e:
            warnings.warn(f"autotune cache {self.cache_file} cannot be written ({e}); the result is not kept",
                          stacklevel=3)

    def _read_quiet(self) -> dict[str, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._read()

    # -- tuning -------------------------------------------------------------------------

    def lookup(self, kind: str, signature: Mapping[str, Any],
               validate: Callable[[Mapping[str, Any]], bool] | None = None) -> TuneResult | None:
        key = entry_key(kind, signature)
        if key in self._memo:
            return self._memo[key]
        e = self._read().get(key)
        if e is None:
            return None
        if validate is not None and not validate(e["params"]):
            warnings.warn(f"autotune cache {self.cache_file}: the {kind} entry for {dict(signature)} is not a valid "
                          f"candidate ({e['params']}); searching again", stacklevel=3)
            return None
        res = TuneResult(dict(e["params"]), float(e["cycles"]), True, int(e["evaluated"]))
        self._memo[key] = res
        return res

    def tune(
        self,
        kind: str,
        signature: Mapping[str, Any],
        candidates: Sequence[Mapping[str, Any]],
        measure: Callable[[Mapping[str, Any]], float],
        validate: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> TuneResult:
        """The fastest candidate (from the cache when this kernel was tuned before; a
        cached winner that `validate` rejects is searched again)."""
        if not candidates:
            raise TileccError(f"autotune {kind}: no candidates to rank")
        if self.max_candidates is not None:
            candidates = list(candidates)[: max(1, self.max_candidates)]
        hit = self.lookup(kind, signature, validate)
        if hit is not None:
            self.hits += 1
            return hit
        self.searches += 1
        best_i, best = -1, math.inf
        for i, cand in enumerate(candidates):
            self.evaluations += 1
            try:
                cycles = float(measure(cand))
            except TileccError:
                cycles = math.inf
            if cycles < best:
                best_i, best = i, cycles
        if best_i < 0:
            raise TileccError(f"autotune {kind}: every candidate failed for {dict(signature)}")
        params = dict(candidates[best_i])
        res = TuneResult(params, best, False, len(candidates))
        key = entry_key(kind, signature)
        self._memo[key] = res
        self._write(key, {"kind": kind, "signature": dict(signature), "params": params, "cycles": best,
                          "evaluated": len(candidates)})
        return res


def _valid_entry(e: Any) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("params"), dict)
            and isinstance(e.get("cycles"), (int, float)) and isinstance(e.get("evaluated"), int))
