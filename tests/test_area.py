"""The area model (simulator/area.py, the presets' [area] tables): the total is the sum
of the components, each component follows its formula, and bad [area] values are
ConfigErrors naming the key."""

from __future__ import annotations

import copy
import math
import tomllib

import pytest

from tilecc.errors import ConfigError
from tilecc.simulator.area import MIB, area
from tilecc.simulator.config import PRESET_DIR, from_dict, load_config, preset_names
from tilecc.sweep.objectives import Figures, objective_value


@pytest.mark.parametrize("name", preset_names())
def test_total_is_the_sum_of_the_components(name):
    a = area(load_config(name))
    parts = a.to_dict()
    total = parts.pop("total")
    assert total == pytest.approx(sum(parts.values()), rel=1e-12)
    assert set(parts) == {"matrix", "sram", "accumulator", "vector", "hbm_phy", "serdes", "fixed"}
    assert all(v >= 0 for v in parts.values()) and total > 0


def test_components_follow_the_config():
    cfg = load_config("tiny")
    a, t = area(cfg), cfg.area
    assert a.matrix == pytest.approx(16 * 16 * t.mm2_per_mac_bf16)
    assert a.sram == pytest.approx(16 * 65536 / MIB * t.mm2_per_sram_mib)  # 1 MiB
    assert a.accumulator == pytest.approx(16 * 4096 / MIB * t.mm2_per_sram_mib)
    assert a.vector == pytest.approx(16 * t.mm2_per_vector_lane)
    assert a.hbm_phy == pytest.approx(32.0 * 1.0 / t.hbm_phy_gbytes_per_s * t.mm2_per_hbm_phy)  # 32 GB/s
    assert a.serdes == 0.0 and a.fixed == t.fixed_mm2


def _tiny() -> dict:
    return tomllib.loads((PRESET_DIR / "tiny.toml").read_text())


def test_doubling_the_array_and_sram_adds_their_area_only():
    base = area(from_dict(_tiny()))
    d = _tiny()
    d["matrix"]["cols"] = 32
    d["sram"]["bytes_per_partition"] *= 2
    d["accumulator"]["bytes_per_partition"] *= 2
    bigger = area(from_dict(d))
    assert bigger.matrix == pytest.approx(2 * base.matrix)
    assert bigger.sram == pytest.approx(2 * base.sram)
    assert bigger.total - base.total == pytest.approx(base.matrix + base.sram + base.accumulator)


def test_perf_per_mm2_divides_throughput_by_the_area():
    f = Figures(cycles=1000.0, latency_us=2.0, energy_j=1e-6, roofline_cycles=500.0, macs=1e6,
                area_mm2=4.0, bottleneck="matrix")
    assert objective_value("perf_per_mm2", f) == pytest.approx(1e6 / 2.0 / 4.0)
    assert objective_value("roofline_ratio", f) == pytest.approx(2.0)
    assert math.isnan(objective_value("perf_per_mm2", Figures(**{**vars(f), "area_mm2": 0.0})))


@pytest.mark.parametrize("edit,message", [
    (("area", "mm2_per_sram_mib", 0.0), "'area.mm2_per_sram_mib' must be > 0, got 0.0"),
    (("area", "serdes_lanes", 1.5), "'area.serdes_lanes' must be an integer, got 1.5"),
    (("area", "mm2_per_mac_bf16", "small"), "'area.mm2_per_mac_bf16' must be a number, got 'small'"),
    (("area", "fixed_mm2", -1.0), "'area.fixed_mm2' must be >= 0, got -1.0"),
    (("area", "mm2_per_bus", 1.0), "unknown key 'area.mm2_per_bus'"),
])
def test_bad_area_values_name_the_key(edit, message):
    d = copy.deepcopy(_tiny())
    table, key, value = edit
    d[table][key] = value
    with pytest.raises(ConfigError, match="^my.toml: " + message.replace("(", r"\(").replace(".", r"\.")):
        from_dict(d, "my.toml")


def test_a_config_without_an_area_table_simulates_and_the_area_model_names_it():
    d = _tiny()
    del d["area"]
    cfg = from_dict(d, "my.toml")  # [area] is optional: configs written before it still load
    assert cfg.area is None
    with pytest.raises(ConfigError, match="has no \\[area\\] table"):
        area(cfg)
