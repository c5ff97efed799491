"""The system description: chips, cores per chip, per-chip hardware configs, the topology
and the link model, from a TOML `[system]` table or a short command-line form.

    [system]                              # in a .toml file
    topology = "torus:4x4"                # ring:N, torus:AxB[xC], switch:N, fattree:k=K,levels=L,...
    chips = 16                            # optional: must equal the topology's chip count
    cores_per_chip = 8
    chip = "cloud"                        # a preset or .toml path, or a list: one per chip
    [system.link]
    preset = "trn2-neuronlink"            # optional: the defaults of the keys below
    bandwidth_gbs = 160.0                 # GB/s per link, per direction
    latency_ns = 500.0                    # per link crossed
    hop_latency_ns = 100.0                # per chip a route passes through (forwarding)
    switch_latency_ns = 300.0             # per switch a route passes through
    pj_per_byte = 10.0                    # link energy, pJ per byte per link crossed
    static_watts = 0.5                    # per link (one direction), paid for the whole run

    "torus:4x4;chip=cloud;cores=8;link=trn2-neuronlink;bandwidth_gbs=100"   # the short form

Errors are `ConfigError`s naming the key, the value and the rule, like the hardware config.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.errors import ConfigError
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.interconnect.topology import Topology, parse_topology


@dataclass(frozen=True)
class LinkConfig:
    bandwidth_gbs: float  # GB/s (1e9 bytes/s) per link and direction: bytes per ns
    latency_ns: float  # per link a route crosses
    hop_latency_ns: float = 0.0  # per chip a route passes through (forwarding on a torus / ring)
    switch_latency_ns: float = 0.0  # per switch a route passes through
    pj_per_byte: float = 0.0  # energy per byte per link crossed
    static_watts: float = 0.0  # per directed link, for the whole run

    def path_latency_ns(self, hops: np.ndarray, switches: np.ndarray) -> np.ndarray:
        """The fixed part (alpha) of a transfer over `hops` links through `switches` switches
        (routing.path_stats); 0 for a local copy."""
        chips_between = np.maximum(hops - 1 - switches, 0)
        return hops * self.latency_ns + chips_between * self.hop_latency_ns + switches * self.switch_latency_ns


# link presets: per-direction bandwidth of ONE link; latencies are tilecc's assumptions (no
# vendor publishes them per link); energies are assumptions (~1.25 pJ/bit for short-reach SerDes)
LINK_PRESETS: dict[str, dict[str, float]] = {
    # AWS Neuron docs, Trainium2 architecture: NeuronLink-v3 1.28 TB/s per device over 4 links
    # (NKI Trainium2 guide: "4 NeuronLink-v3"); taken as both directions: 1280 / 4 / 2 = 160 GB/s
    "trn2-neuronlink": dict(bandwidth_gbs=160.0, latency_ns=500.0, hop_latency_ns=100.0, switch_latency_ns=0.0,
                            pj_per_byte=10.0, static_watts=0.5),
    # Cloud TPU v5e docs: 400 GB/s bidirectional ICI per chip, 2-D torus (4 links): 50 GB/s
    "tpu-v5e-ici": dict(bandwidth_gbs=50.0, latency_ns=1000.0, hop_latency_ns=100.0, switch_latency_ns=0.0,
                        pj_per_byte=10.0, static_watts=0.5),
    # Cloud TPU v5p docs: 1200 GB/s bidirectional ICI per chip, 3-D torus (6 links): 100 GB/s
    "tpu-v5p-ici": dict(bandwidth_gbs=100.0, latency_ns=1000.0, hop_latency_ns=100.0, switch_latency_ns=0.0,
                        pj_per_byte=10.0, static_watts=0.5),
    # NVIDIA H100: NVLink 4, 18 links x 25 GB/s per direction = 450 GB/s per GPU per direction
    # (900 GB/s total) into the NVSwitch fabric: one chip-to-switch link of 450 GB/s
    "nvlink4": dict(bandwidth_gbs=450.0, latency_ns=500.0, hop_latency_ns=0.0, switch_latency_ns=300.0,
                    pj_per_byte=10.0, static_watts=2.0),
}
DEFAULT_LINK_PRESET = "trn2-neuronlink"


@dataclass(frozen=True)
class SystemConfig:
    topology: Topology
    link: LinkConfig
    cores_per_chip: int = 1
    chip_targets: tuple[str, ...] = ("cloud",)  # one per chip, or one for all
    name: str = "system"

    @property
    def chips(self) -> int:
        return self.topology.n_chips

    def chip_config(self, chip: int) -> HardwareConfig:
        """The hardware config of chip `chip` (chips may differ)."""
        if not 0 <= chip < self.chips:
            raise ConfigError(f"chip {chip} does not exist in system '{self.name}' (chips 0..{self.chips - 1})")
        return load_config(self.chip_targets[chip if len(self.chip_targets) > 1 else 0])


def parse_link(data: object, key: str = "system.link") -> LinkConfig:
    """A `[system.link]` table (an optional `preset`, then the keys of LinkConfig)."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{key}' must be a table, got {data!r}")
    preset = data.get("preset", DEFAULT_LINK_PRESET)
    if preset not in LINK_PRESETS:
        raise ConfigError(f"'{key}.preset' = {preset!r} is not a link preset (allowed: {', '.join(LINK_PRESETS)})")
    values: dict[str, Any] = dict(LINK_PRESETS[preset])
    allowed = ["preset"] + [f.name for f in fields(LinkConfig)]
    for name, value in data.items():
        if name not in allowed:
            raise ConfigError(f"unknown key '{key}.{name}' (allowed in this section: {', '.join(sorted(allowed))})")
        if name != "preset":
            values[name] = _number(f"{key}.{name}", value)
    if values["bandwidth_gbs"] <= 0:
        raise ConfigError(f"'{key}.bandwidth_gbs' must be > 0, got {values['bandwidth_gbs']!r}")
    return LinkConfig(**values)


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"'{key}' must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"'{key}' must be a finite number >= 0, got {value!r}")
    return float(value)


SYSTEM_KEYS = ("name", "topology", "chips", "cores_per_chip", "chip", "link")


def system_from_dict(data: object, source: str = "<dict>") -> SystemConfig:
    """A `[system]` table, validated (`ConfigError` "SOURCE: 'system.KEY' ...")."""
    try:
        return _system(data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _system(data: object) -> SystemConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"'system' must be a table, got {data!r}")
    for name in data:
        if name not in SYSTEM_KEYS:
            raise ConfigError(f"unknown key 'system.{name}' (allowed in this section: {', '.join(SYSTEM_KEYS)})")
    if "topology" not in data:
        raise ConfigError("missing key 'system.topology'")
    topo = parse_topology(data["topology"], "system.topology")
    chips = data.get("chips", topo.n_chips)
    if isinstance(chips, bool) or not isinstance(chips, int) or chips != topo.n_chips:
        raise ConfigError(f"'system.chips' = {chips!r} does not match 'system.topology' = "
                          f"{data['topology']!r}, which has {topo.n_chips} chips")
    cores = data.get("cores_per_chip", 1)
    if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= 1024:
        raise ConfigError(f"'system.cores_per_chip' must be a whole number in 1..1024, got {cores!r}")
    targets = _chip_targets(data.get("chip", "cloud"), topo.n_chips)
    name = data.get("name", "system")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"'system.name' must be a non-empty string, got {name!r}")
    return SystemConfig(topo, parse_link(data.get("link", {})), cores, targets, name)


def _chip_targets(value: object, n: int) -> tuple[str, ...]:
    """`chip`: one target for every chip, or a list with one per chip; each loads and validates."""
    items: list[object] = list(value) if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) != n:
        raise ConfigError(f"'system.chip' lists {len(value)} configs for {n} chips (one per chip, or a single one)")
    for i, item in enumerate(items):
        key = f"system.chip[{i}]" if isinstance(value, list) else "system.chip"
        if not isinstance(item, str) or not item:
            raise ConfigError(f"'{key}' must be a preset name or a .toml path, got {item!r}")
    names = [str(item) for item in items]
    for item in dict.fromkeys(names):  # each distinct config once, in order
        try:
            load_config(item)
        except ConfigError as e:
            raise ConfigError(f"'system.chip' = {item!r}: {e}") from None
    return tuple(names)


SHORT_KEYS = {"chip": "chip", "cores": "cores_per_chip", "name": "name", "link": "link.preset"}


def parse_short(text: str) -> SystemConfig:
    """The command-line form: ``TOPOLOGY[;key=value]...`` with keys chip, cores, name,
    link (a link preset) and the keys of `[system.link]` (bandwidth_gbs, latency_ns, ...)."""
    return system_from_dict(short_table(text), f"system '{text}'")


def short_table(text: str) -> dict[str, Any]:
    """The short form as the `[system]` table it stands for (not yet validated: the keys
    it names only; `tilecc sweep` edits the table before validating it)."""
    topology, *items = text.split(";")
    data: dict[str, Any] = {"topology": topology.strip(), "link": {}}
    link_keys = {f.name for f in fields(LinkConfig)}
    for item in items:
        name, eq, value = (s.strip() for s in item.partition("="))
        if not eq or (name not in SHORT_KEYS and name not in link_keys):
            allowed = ", ".join(list(SHORT_KEYS) + sorted(link_keys))
            raise ConfigError(f"system '{text}': {item!r} is not KEY=VALUE with KEY one of {allowed}")
        target = SHORT_KEYS.get(name, f"link.{name}")
        if target == "cores_per_chip" or target.startswith("link.") and target != "link.preset":
            value = _parse_number(name, value)
        if target.startswith("link."):
            data["link"][target[5:]] = value
        else:
            data[target] = value
    return data


def _parse_number(name: str, value: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value  # reported by the validator with its key


def load_system(spec: str | Path | SystemConfig) -> SystemConfig:
    """A SystemConfig, a .toml file with a `[system]` table, or the short form."""
    if isinstance(spec, SystemConfig):
        return spec
    text = str(spec)
    if not text.endswith(".toml"):
        return parse_short(text)
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"system file '{text}' {'is a directory' if path.is_dir() else 'does not exist'}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as TOML text ({e})") from None
    if "system" not in data:
        raise ConfigError(f"{path}: missing table '[system]'")
    return system_from_dict(data["system"], str(path))
