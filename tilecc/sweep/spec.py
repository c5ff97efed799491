"""The sweep spec: a TOML file naming the workloads, the base config, the objectives,
the search strategy and the space, validated before anything runs.

    [sweep]
    workload = "examples/mlp.py:mlp"      # FILE.py:FACTORY, or a list of them
    base = "tiny"                         # a preset or a hardware TOML (relative to the spec)
    system = "ring:4;link=nvlink4"        # optional: a base system (tilecc/sweep/systems.py)
    objectives = ["latency", "energy"]    # names in tilecc/sweep/objectives.py
    strategy = "grid"                     # grid | random (n = ...) | nsga2 (trials = ...)
    seed = 0                              # random and nsga2 draws
    calibration_points = 4                # --fidelity estimate: points also simulated
    [sweep.grid]
    "matrix.rows" = [16, 32]              # a config key by its dotted TOML path -> values
    "sram.bytes_per_partition" = [65536, 131072]

Every error is a `SweepSpecError` of one line naming the key and the value. A swept
key must exist in the base config and every value must have the type of the base's
value; whether a combination is a valid config (`matrix.rows` <= `sram.partitions`) is
decided per point, and a point that is not is a failed point with the reason.

Workload knobs (`weights = ["native", "int8"]`, `phase = ["decode"]` with `batch` and
`prompt_len`: tilecc/sweep/knobs.py) are swept like config keys but change the model or
what is run, not the config.

Multi-chip deployments are swept with the system keys by their dotted path
(`"system.chips"`, `"system.link.bandwidth_gbs"`, ...), the knobs `tp`, `pp`,
`micro_batches` and `dp`, and `system = "..."` beside `base` (a base system, short form or
TOML): tilecc/sweep/systems.py. A combination the runtime does not run (tp x pp today) is
refused here, in one line, before anything runs.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tilecc.errors import ConfigError, TileccError
from tilecc.simulator.config import PRESET_DIR, HardwareConfig, from_dict
from tilecc.sweep.knobs import check_knob, effective_knobs, is_knob
from tilecc.sweep.objectives import OBJECTIVES
from tilecc.sweep.systems import ALIASES, Deployment, base_table, check_combinations, resolve

__all__ = ["SweepSpec", "SweepSpecError", "load_spec", "STRATEGIES"]

STRATEGIES = ("grid", "random", "nsga2")
SWEEP_KEYS = ("workload", "base", "system", "objectives", "strategy", "n", "trials", "seed", "calibration_points",
              "grid")
MAX_POINTS = 1_000_000  # a grid larger than this is refused (use random or nsga2)


class SweepSpecError(TileccError):
    """A sweep spec that cannot run: names the spec file, the key and the value."""


@dataclass(frozen=True)
class SweepSpec:
    path: str
    workloads: tuple[str, ...]  # FILE.py:FACTORY, the file resolved
    base: str  # the base target as written
    base_data: dict[str, Any]  # the base config's TOML tables
    objectives: tuple[str, ...]
    strategy: str
    n: int  # random: points drawn
    trials: int  # nsga2: trials
    seed: int
    calibration_points: int
    grid: dict[str, list[Any]]  # dotted key -> values, in the spec's order
    system: str = ""  # the base system as written ("": none)
    system_data: dict[str, Any] | None = None  # its [system] table (tilecc/sweep/systems.py)

    @property
    def keys(self) -> list[str]:
        return list(self.grid)

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid, the last key varying fastest."""
        return [dict(zip(self.grid, combo)) for combo in itertools.product(*self.grid.values())]

    def points(self) -> list[dict[str, Any]]:
        """The points of a grid or random sweep (nsga2 draws its own, tilecc/sweep/execute.py)."""
        if self.strategy == "grid":
            return self.grid_points()
        size = _grid_size(self.grid)
        rng = random.Random(self.seed)
        picks = sorted(rng.sample(range(size), min(self.n, size)))
        return [self.point_at(i) for i in picks]

    def point_at(self, index: int) -> dict[str, Any]:
        """The grid's `index`-th combination (the order of `grid_points`), without listing them."""
        point: dict[str, Any] = {}
        for key in reversed(self.grid):
            values = self.grid[key]
            index, r = divmod(index, len(values))
            point[key] = values[r]
        return {k: point[k] for k in self.grid}

    def config(self, point: dict[str, Any], where: str) -> HardwareConfig:
        """The base config with `point`'s values (ConfigError naming `where` if invalid)."""
        return from_dict(apply_point(self.base_data, config_part(point)), where)

    def deployment(self, point: dict[str, Any]) -> Deployment:
        """How `point` runs over chips (ConfigError if its system does not hold together)."""
        return resolve(point, self.system_data)

    def fingerprint(self) -> str:
        """What a resumed sweep must match (the spec's meaning, not its text)."""
        d = asdict(self)
        d.pop("path")
        return json.dumps(d, sort_keys=True, default=str)


def config_part(point: dict[str, Any]) -> dict[str, Any]:
    """The point's config keys (its workload knobs and system keys, tilecc/sweep/knobs.py,
    left out)."""
    return {k: v for k, v in point.items() if not is_knob(k)}


def knob_part(point: dict[str, Any]) -> dict[str, Any]:
    """The point's workload knobs that change its result (tilecc/sweep/knobs.py)."""
    return effective_knobs({k: v for k, v in point.items() if is_knob(k)})


def apply_point(base: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for dotted, value in config_part(point).items():
        *parents, last = dotted.split(".")
        table = data
        for p in parents:
            table = table[p]
        table[last] = value
    return data


def _grid_size(grid: dict[str, list[Any]]) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec (see the module docstring)."""
    p = Path(path)
    if p.suffix != ".toml":
        raise SweepSpecError(f"'{path}': a sweep spec is a .toml file")
    if not p.is_file():
        raise SweepSpecError(f"'{path}': {'is a directory' if p.is_dir() else 'no such file'}")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SweepSpecError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SweepSpecError(f"{path}: cannot be read as TOML text ({getattr(e, 'strerror', None) or e})") from None
    try:
        return _parse(data, p)
    except SweepSpecError as e:
        raise SweepSpecError(f"{path}: {e}") from None


def _parse(data: dict[str, Any], path: Path) -> SweepSpec:
    extra = sorted(set(data) - {"sweep"})
    if extra:
        raise SweepSpecError(f"unknown table or key '{extra[0]}' (a spec holds one [sweep] table)")
    sw = data.get("sweep")
    if not isinstance(sw, dict):
        raise SweepSpecError("no [sweep] table")
    for key in sw:
        if key not in SWEEP_KEYS:
            raise SweepSpecError(f"unknown key 'sweep.{key}' (allowed: {', '.join(SWEEP_KEYS)})")
    workloads = _workloads(sw.get("workload"), path)
    base_value = sw.get("base", "tiny")
    if not isinstance(base_value, str) or not base_value:
        raise SweepSpecError(f"'sweep.base' = {base_value!r}: expected a preset name or a .toml path")
    base_data = _base_data(base_value, path)
    system_value = sw.get("system")
    system_data = None
    if system_value is not None:
        try:
            system_data = base_table(system_value, path.parent)
        except ConfigError as e:
            raise SweepSpecError(f"'sweep.system' = {system_value!r}: {e}") from None
    objectives = _objectives(sw.get("objectives", ["latency", "energy"]))
    strategy = sw.get("strategy", "grid")
    if strategy not in STRATEGIES:
        raise SweepSpecError(f"'sweep.strategy' = {strategy!r} is not a strategy (allowed: {', '.join(STRATEGIES)})")
    n = _count(sw, "n", 16 if strategy == "random" else 0, strategy == "random")
    trials = _count(sw, "trials", 32 if strategy == "nsga2" else 0, strategy == "nsga2")
    seed = _count(sw, "seed", 0, False, minimum=0)
    calibration = _count(sw, "calibration_points", 4, False, minimum=0)
    if strategy == "nsga2" and len(workloads) > 1:
        raise SweepSpecError(f"'sweep.workload' = {sw.get('workload')!r}: strategy \"nsga2\" optimises one workload")
    grid = _grid(sw.get("grid"), base_data)
    why = check_combinations(grid, system_data)
    if why:
        raise SweepSpecError(f"'sweep.grid': {why}")
    if strategy == "grid" and _grid_size(grid) > MAX_POINTS:
        raise SweepSpecError(f"'sweep.grid' has {_grid_size(grid):,} points (more than {MAX_POINTS:,}: "
                             "use strategy = \"random\" or \"nsga2\")")
    return SweepSpec(str(path), workloads, base_value, base_data, objectives, strategy, n, trials, seed,
                     calibration, grid, system_value or "", system_data)


def _resolve(text: str, spec_path: Path) -> Path:
    """A path as written: relative to the current directory, else to the spec's."""
    p = Path(text)
    if p.is_absolute() or p.exists():
        return p
    return spec_path.parent / p


def _workloads(value: Any, spec_path: Path) -> tuple[str, ...]:
    if value is None:
        raise SweepSpecError("missing key 'sweep.workload' (FILE.py:FACTORY, or a list of them)")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise SweepSpecError("'sweep.workload' = []: name at least one FILE.py:FACTORY")
    out = []
    for w in items:
        if not isinstance(w, str) or ":" not in w or not w.rpartition(":")[0].endswith(".py"):
            raise SweepSpecError(f"'sweep.workload' = {w!r}: expected FILE.py:FACTORY")
        file, _, factory = w.rpartition(":")
        resolved = _resolve(file, spec_path)
        if not resolved.is_file():
            raise SweepSpecError(f"'sweep.workload' = {w!r}: no such file '{file}'")
        if not factory.isidentifier():
            raise SweepSpecError(f"'sweep.workload' = {w!r}: '{factory}' is not a Python name")
        out.append(f"{resolved}:{factory}")
    if len(set(out)) != len(out):
        raise SweepSpecError(f"'sweep.workload' = {value!r} names a workload twice")
    return tuple(out)


def _base_data(base: str, spec_path: Path) -> dict[str, Any]:
    if base.endswith(".toml"):
        path = _resolve(base, spec_path)
    else:
        path = PRESET_DIR / f"{base}.toml"
        if not path.is_file():
            names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))
            raise SweepSpecError(f"'sweep.base' = {base!r} is no preset (presets: {names}; or a .toml file)")
    if not path.is_file():
        raise SweepSpecError(f"'sweep.base' = {base!r}: no such file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        from_dict(data, str(path))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
        raise SweepSpecError(f"'sweep.base' = {base!r}: cannot be read as TOML ({e})") from None
    except ConfigError as e:
        raise SweepSpecError(f"'sweep.base' = {base!r}: {e}") from None
    return data


def _objectives(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SweepSpecError(f"'sweep.objectives' = {value!r}: expected a non-empty list of names")
    for name in value:
        if name not in OBJECTIVES:
            raise SweepSpecError(f"'sweep.objectives' has unknown objective {name!r} "
                                 f"(allowed: {', '.join(OBJECTIVES)})")
    if len(set(value)) != len(value):
        raise SweepSpecError(f"'sweep.objectives' = {value!r} names an objective twice")
    return tuple(value)


def _count(sw: dict[str, Any], key: str, default: int, used: bool, minimum: int = 1) -> int:
    if key not in sw:
        return default
    value = sw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > MAX_POINTS:
        raise SweepSpecError(f"'sweep.{key}' = {value!r}: expected an integer in [{minimum}, {MAX_POINTS}]")
    if not used and key in ("n", "trials"):
        raise SweepSpecError(f"'sweep.{key}' = {value!r} does not apply to strategy "
                             f"{sw.get('strategy', 'grid')!r}")
    return value


def _grid(value: Any, base: dict[str, Any]) -> dict[str, list[Any]]:
    if not isinstance(value, dict) or not value:
        raise SweepSpecError("missing or empty [sweep.grid] (dotted config key = [values])")
    grid: dict[str, list[Any]] = {}
    for key, values in value.items():
        if isinstance(values, dict):  # an unquoted dotted key: [sweep.grid] matrix.rows = [...]
            raise SweepSpecError(f"'sweep.grid.{key}' is a table: quote dotted keys (\"{key}.<name>\" = [...])")
        knob = is_knob(key)
        base_value = None if knob else _check_key(key, base)
        if not isinstance(values, list) or not values:
            raise SweepSpecError(f"'sweep.grid.\"{key}\"' = {values!r}: expected a non-empty list of values")
        for v in values:
            if knob:
                why = check_knob(key, v)
                if why:
                    raise SweepSpecError(f"'sweep.grid.\"{key}\"' has value {v!r}: {why}")
            else:
                _check_type(key, v, base_value)
        if len({json.dumps(v) for v in values}) != len(values):
            raise SweepSpecError(f"'sweep.grid.\"{key}\"' = {values!r} lists a value twice")
        grid[key] = list(values)
    for alias, dotted in [*ALIASES.items(), ("topology", "system.topology")]:
        if alias in grid and dotted in grid:
            raise SweepSpecError(f"'sweep.grid' sweeps both '{alias}' and '{dotted}' (one names the other's key: "
                                 "keep one)")
    return grid


def _check_key(key: str, base: dict[str, Any]) -> Any:
    """The base config's value at dotted `key` (SweepSpecError if the config has none)."""
    table: Any = base
    for part in key.split("."):
        if not isinstance(table, dict) or part not in table:
            raise SweepSpecError(f"'sweep.grid.\"{key}\"': unknown config key '{key}' (not in the base config)")
        table = table[part]
    if isinstance(table, dict):
        raise SweepSpecError(f"'sweep.grid.\"{key}\"': '{key}' is a table of the config, not a value")
    if key == "name":
        raise SweepSpecError("'sweep.grid.\"name\"': the config's name is not a design parameter")
    return table


def _check_type(key: str, value: Any, base_value: Any) -> None:
    ok: bool
    if isinstance(base_value, bool):
        ok = isinstance(value, bool)
    elif isinstance(base_value, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(base_value, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(base_value))
    if not ok:
        kind = "an integer" if isinstance(base_value, int) else type(base_value).__name__
        raise SweepSpecError(f"'sweep.grid.\"{key}\"' has value {value!r}: '{key}' takes {kind} "
                             f"(the base has {base_value!r})")
