"""The multi-chip axes of a sweep: system keys by their dotted path, a base system, and the
parallelism knobs; how a point's values become the system one model replica runs on.

    [sweep]
    base = "tiny"                          # every chip's config (with the swept config keys)
    system = "ring:4;link=nvlink4"         # optional: the base system, short form or a TOML
                                           #   file with a [system] table (docs/system.md)
    [sweep.grid]
    "system.chips" = [1, 2, 4]             # resizes the base's ring / switch (1: one chip)
    "system.link.bandwidth_gbs" = [50.0, 450.0]
    tp = [2]                               # default: the replica's chips / pp
    pp = [1]                               # pipeline stages (runtime/pipeline_run.py)
    micro_batches = [2]                    # a pipeline's micro-batches (pp > 1 only)
    dp = [1, 2]                            # inference replicas (see below)

System keys are those of the `[system]` table (simulator/interconnect/system.py):
`system.topology`, `system.chips`, `system.cores_per_chip`, `system.link.preset` and
`system.link.<key>` for every `LinkConfig` key; each value is validated by the system
config's own validator, so an error is the TOML's ("'system.link.bandwidth_gbs' must be
> 0, got -1.0"), prefixed by the sweep key and value. `system.chip` (the chips' config is
`sweep.base` with the swept config keys) and `system.name` are not sweep keys. The knobs
`topology` ("ring" | "switch": the family, sized to the chips), `link_bandwidth_gbs` and
`link_latency_ns` are aliases of `system.topology`'s family, `system.link.bandwidth_gbs`
and `system.link.latency_ns`.

A point's deployment (`resolve`): the base system's table with the point's system keys;
its chips are the topology's (`system.chips` alone resizes a ring or switch), else
`system.chips`, else tp x pp; `tp` defaults to chips / pp; tp x pp must equal the chips.
One chip is no system (the single-chip path). A link preset swept replaces only the link
keys the base and the point do not set.

`dp` (inference only, honest by construction): dp replicas of the tp x pp system, each
serving batch / dp of the workload's inputs (their first dimension; of `batch` in a decode
point). Replicas do not communicate, so one replica is simulated (its program and timing
are its peers', the simulator's timing does not depend on the data) and its outputs are
checked against eager on its share. A point's latency is one replica's (the whole batch
is done then), its energy and area are all dp replicas' (every chip), so throughput,
perf_per_watt and perf_per_mm2 count every chip. Training (gradient all-reduce) is not
swept.

The runtime decides which combinations it runs (`tilecc.system_api.parse_parallel`, which
another slice extends); `check_combinations` asks it for every distinct combination of a
grid's parallelism and chip values and refuses the spec, in one line, where it says no
(tp x pp today; a decode phase on more than one chip per replica; cores_per_chip > 1,
which the system runtime does not read).
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tilecc.errors import ConfigError, TileccError
from tilecc.simulator.interconnect.system import LinkConfig, short_table, system_from_dict
from tilecc.simulator.interconnect.topology import MAX_CHIPS, parse_topology

__all__ = ["ALIASES", "AXES", "COMBINATION_KEYS", "Deployment", "PARALLEL_KNOBS", "check_parallel_value",
           "check_system_value", "is_system_key", "resolve", "unsupported"]

PARALLEL_KNOBS = ("tp", "pp", "micro_batches", "dp")
ALIASES = {"link_bandwidth_gbs": "system.link.bandwidth_gbs", "link_latency_ns": "system.link.latency_ns"}
TOPOLOGY_FAMILIES = ("ring", "switch")  # the `topology` knob: a family sized to the chips
LINK_KEYS = ("preset", *(f.name for f in fields(LinkConfig)))
AXES = ("system.topology", "system.chips", "system.cores_per_chip", *(f"system.link.{k}" for k in LINK_KEYS))
# the keys that decide a point's parallelism (`check_combinations` walks their values)
COMBINATION_KEYS = ("tp", "pp", "micro_batches", "dp", "phase", "topology", "system.topology", "system.chips")
MAX_COMBINATIONS = 4096  # more distinct combinations than this: checked per point instead


def is_system_key(key: str) -> bool:
    return key.startswith("system.")


def check_parallel_value(key: str, value: Any) -> str | None:
    """None if `value` is valid for the parallelism knob `key`, else what is allowed."""
    top = 65536 if key == "micro_batches" else 1024
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= top
    return None if ok else f"'{key}' takes a whole number in 1..{top}"


def check_system_value(key: str, value: Any) -> str | None:
    """None if `value` is valid at the system key `key`, else the system config's own
    message (or the key's rule)."""
    if key not in AXES:
        if key in ("system.chip", "system.name"):
            return (f"'{key}' is not a sweep key (the chips' config is 'sweep.base' with the swept config keys)"
                    if key == "system.chip" else "the system's name is not a design parameter")
        allowed = ", ".join(AXES)
        return f"unknown key '{key}' (system keys: {allowed})"
    try:
        if key == "system.chips":
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CHIPS
            return None if ok else f"'system.chips' takes a whole number in 1..{MAX_CHIPS}"
        if key == "system.topology":
            parse_topology(value, "system.topology")
        elif key.startswith("system.link."):
            _validate({"topology": "ring:2", "link": {key.split(".")[2]: value}})
        else:
            _validate({"topology": "ring:2", key.split(".")[1]: value})
    except ConfigError as e:
        return str(e)
    if key == "system.cores_per_chip" and value != 1:
        return "not supported yet: the system runtime runs one core per chip (it does not read cores_per_chip)"
    return None


def base_table(value: Any, spec_dir: Path) -> dict[str, Any]:
    """`[sweep] system`: the short form or a .toml file with a [system] table, as its
    (validated) table without `chip`; ConfigError naming what is wrong."""
    if not isinstance(value, str) or not value:
        raise ConfigError("expected a system in short form (\"ring:4;link=nvlink4\") or a .toml file")
    if value.endswith(".toml"):
        path = Path(value)
        path = path if path.is_absolute() or path.exists() else spec_dir / path
        if not path.is_file():
            raise ConfigError("no such file")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot be read as TOML ({e})") from None
        if not isinstance(data.get("system"), dict):
            raise ConfigError("missing table '[system]'")
        table = data["system"]
    else:
        table = short_table(value)
    if "chip" in table:
        raise ConfigError("sets 'system.chip': in a sweep every chip's config is 'sweep.base' with the swept "
                          "config keys")
    _validate(table)
    if table.get("cores_per_chip", 1) != 1:
        raise ConfigError(f"'system.cores_per_chip' = {table['cores_per_chip']!r}: not supported yet (the system "
                          "runtime runs one core per chip)")
    return table


@dataclass(frozen=True)
class Deployment:
    """How a point runs: the system one replica runs on (None: one chip), its tensor and
    pipeline parallelism, and the replicas."""

    system: dict[str, Any] | None = None  # the replica's [system] table, without `chip`
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    dp: int = 1

    @property
    def replica_chips(self) -> int:
        return self.tp * self.pp

    @property
    def chips(self) -> int:
        return self.dp * self.tp * self.pp

    def parallel(self) -> dict[str, int]:
        """The `parallel=` of `tilecc.compile` (tilecc/system_api.py) for one replica."""
        p = {"tp": self.tp} if self.tp > 1 else {}
        if self.pp > 1:
            p.update(pp=self.pp, micro_batches=self.micro_batches)
        return p


def resolve(point: dict[str, Any], base: dict[str, Any] | None) -> Deployment:
    """The point's deployment (see the module docstring); ConfigError if its system or its
    tp x pp do not hold together (a failed point, with that line)."""
    table = copy.deepcopy(base or {})
    for key, value in point.items():
        dotted = ALIASES.get(key, key)
        if is_system_key(dotted):
            *parents, last = dotted.split(".")[1:]
            node = table
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
    pp = int(point.get("pp", 1))
    chips = _chips(table, point)
    tp = int(point.get("tp", max(1, chips // pp) if chips else 1))
    chips = chips or tp * pp
    if tp * pp != chips:
        raise ConfigError(f"tp x pp = {tp} x {pp} = {tp * pp} must equal the system's {chips} chip(s)")
    dp = int(point.get("dp", 1))
    if chips == 1:
        return Deployment(None, 1, 1, 1, dp)
    family = point.get("topology")
    if family is not None:
        table["topology"] = f"{family}:{chips}"
    table.setdefault("topology", f"ring:{chips}")
    _validate(table)
    micro = int(point.get("micro_batches", 1)) if pp > 1 else 1
    return Deployment(table, tp, pp, micro, dp)


def _validate(table: dict[str, Any]) -> None:
    """The system config's validation of `table` (its messages, without a source prefix);
    the chip is the sweep's, so any valid one stands in."""
    try:
        system_from_dict({**table, "chip": "tiny"})
    except ConfigError as e:
        raise ConfigError(str(e).removeprefix("<dict>: ")) from None


def _chips(table: dict[str, Any], point: dict[str, Any]) -> int:
    """The replica's chips the table fixes (0: it does not)."""
    if "chips" in table and "topology" in table and "system.topology" not in point and "system.chips" in point:
        kind = str(table["topology"]).partition(":")[0]
        if parse_topology(table["topology"], "system.topology").n_chips == table["chips"]:
            return int(table["chips"])
        if kind not in TOPOLOGY_FAMILIES:
            raise ConfigError(f"'system.chips' = {table['chips']} cannot resize 'system.topology' = "
                              f"{table['topology']!r} (a ring or a switch only: sweep 'system.topology')")
        if table["chips"] == 1:
            del table["topology"]
        else:
            table["topology"] = f"{kind}:{table['chips']}"
    if "topology" in table:
        return parse_topology(table["topology"], "system.topology").n_chips
    return int(table.get("chips", 0))


def unsupported(d: Deployment, phase: str) -> str | None:
    """Why the runtime does not run deployment `d` (None: it does)."""
    if phase == "decode" and d.replica_chips > 1:
        return "phase \"decode\" runs each replica on one chip (tp = pp = 1; dp replicas allowed)"
    if phase == "train" and d.chips > 1:
        return ("phase \"train\" runs on one chip (tp = pp = dp = 1; a sharded training step: "
                "tilecc.compile(..., parallel={'dp': N}, {'tp': T}, {'pp': P} or dp with tp or pp).train)")
    if d.system is None:
        return None
    from tilecc.simulator.interconnect.system import load_system
    from tilecc.system_api import parse_parallel

    try:
        parse_parallel(d.parallel(), load_system(f"ring:{d.replica_chips};chip=tiny"))
    except TileccError as e:
        return str(e)
    return None


def check_combinations(grid: dict[str, list[Any]], base: dict[str, Any] | None) -> str | None:
    """The first combination of the grid's parallelism / chip values the runtime does not
    run, said in one line (None: all run, or too many to walk: then per point)."""
    keys = [k for k in grid if k in COMBINATION_KEYS]
    size = 1
    for k in keys:
        size *= len(grid[k])
    if size > MAX_COMBINATIONS:
        return None
    for combo in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        try:
            d = resolve(point, base)
        except ConfigError:
            continue  # an invalid system: a failed point, with its reason
        why = unsupported(d, str(point.get("phase", "forward")))
        if why:
            named = ", ".join(f"{k} = {v!r}" for k, v in point.items())
            return f"the combination {named} is not supported yet: {why}"
    return None
