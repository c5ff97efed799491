"""Hardware configs: presets load and validate; bad configs name key, value and what is allowed."""

import re
import tomllib

import pytest

from tilecc.errors import ConfigError
from tilecc.simulator.config import PRESET_DIR, from_dict, load_config, preset_names


@pytest.mark.parametrize("name", ["tiny", "edge", "cloud"])
def test_presets_load(name):
    cfg = load_config(name)
    assert cfg.name == name
    assert cfg.matrix.rows <= cfg.sram.partitions


def test_preset_list():
    assert set(preset_names()) >= {"tiny", "edge", "cloud"}


def _tiny() -> dict:
    return tomllib.loads((PRESET_DIR / "tiny.toml").read_text())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["hbm"].update(bytes_per_cycle=0.0), "'hbm.bytes_per_cycle' must be > 0, got 0.0"),
        (lambda d: d["matrix"].update(rows="16"), "'matrix.rows' must be a number, got '16'"),
        (lambda d: d["matrix"].update(rows=16.5), "'matrix.rows' must be an integer, got 16.5"),
        (lambda d: d["sram"].pop("partitions"), "missing key 'sram.partitions'"),
        (lambda d: d["matrix"].update(rows=64), "'matrix.rows' = 64 exceeds 'sram.partitions' = 16"),
        (lambda d: d["dma"].update(queues=-1), "'dma.queues' must be >= 0, got -1"),
        (lambda d: d.update(hbm=5), "'hbm' must be a table"),
        (lambda d: d["matrix"].update(fp8_speedup=0), "'matrix.fp8_speedup' must be > 0, got 0"),
        (lambda d: d["energy"].update(pj_per_mac_int8="low"), "'energy.pj_per_mac_int8' must be a number, got 'low'"),
    ],
)
def test_invalid_configs(edit, message):
    d = _tiny()
    edit(d)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        from_dict(d, "my.toml")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["vector"].update(clock_ghz=0), "'vector.clock_ghz' must be > 0, got 0"),
        (lambda d: d["matrix"].update(clock_ghz=0.0), "'matrix.clock_ghz' must be > 0, got 0.0"),
        (lambda d: d["vector"].update(clock_ghz=-0.96), "'vector.clock_ghz' must be >= 0, got -0.96"),
        (lambda d: d["matrix"].update(clock_ghz="2.4 GHz"), "'matrix.clock_ghz' must be a number, got '2.4 GHz'"),
        (lambda d: d["vector"].pop("clock_ghz"), "missing key 'vector.clock_ghz'"),
        (lambda d: d.update(clock_ghz=0), "'clock_ghz' must be > 0, got 0"),
    ],
)
def test_bad_engine_clocks_name_the_key(edit, message):
    d = _tiny()
    edit(d)
    with pytest.raises(ConfigError, match="^my.toml: " + message.replace("(", r"\(")):
        from_dict(d, "my.toml")


def test_engine_clocks_load():
    cloud = load_config("cloud")
    assert (cloud.clock_ghz, cloud.matrix.clock_ghz, cloud.vector.clock_ghz) == (2.4, 2.4, 0.96)
    for name in ("tiny", "edge"):
        cfg = load_config(name)
        assert cfg.matrix.clock_ghz == cfg.vector.clock_ghz == cfg.clock_ghz


def test_unknown_target():
    with pytest.raises(ConfigError, match="unknown target 'huge' \\(presets: cloud, edge, tiny"):
        load_config("huge")


def test_toml_file_target(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text((PRESET_DIR / "tiny.toml").read_text().replace('name = "tiny"', 'name = "mine"'))
    assert load_config(str(p)).name == "mine"
    p.write_text("name = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(p))


@pytest.mark.parametrize(
    "value, message",
    [
        (-0.5, "'dma.packet_overhead_cycles' must be >= 0, got -0.5"),
        ("72.3", "'dma.packet_overhead_cycles' must be a number, got '72.3'"),
        (True, "'dma.packet_overhead_cycles' must be a number, got True"),
        (float("nan"), "'dma.packet_overhead_cycles' must be a finite number >= 0, got nan"),
        (float("inf"), "'dma.packet_overhead_cycles' must be a finite number >= 0, got inf"),
    ],
)
def test_bad_packet_overhead_names_the_key(value, message):
    d = _tiny()
    d["dma"]["packet_overhead_cycles"] = value
    with pytest.raises(ConfigError, match="^my.toml: " + re.escape(message)):
        from_dict(d, "my.toml")


def test_packet_overhead_replaces_the_efficient_chunk():
    """`dma.packet_overhead_cycles` is a float >= 0 (0: no overhead, every packet at the
    engine's peak); the former `dma.efficient_chunk_bytes` is an unknown key."""
    d = _tiny()
    d["dma"]["packet_overhead_cycles"] = 0
    cfg = from_dict(d, "my.toml")
    assert cfg.dma.packet_overhead_cycles == 0.0 and isinstance(cfg.dma.packet_overhead_cycles, float)
    d["dma"]["efficient_chunk_bytes"] = 64
    with pytest.raises(ConfigError, match="^my.toml: unknown key 'dma.efficient_chunk_bytes'"):
        from_dict(d, "my.toml")


def test_8_bit_rate_and_energy_keys_default_to_the_16_bit_ones():
    """A config written before the per-dtype keys loads: no 8-bit mode, the bf16 MAC energy."""
    from tilecc.simulator.energy import estimate

    d = _tiny()
    for key in ("int8_speedup", "fp8_speedup"):
        d["matrix"].pop(key)
    for key in ("pj_per_mac_int8", "pj_per_mac_fp8"):
        d["energy"].pop(key)
    cfg = from_dict(d, "old.toml")
    assert cfg.matrix.int8_speedup == cfg.matrix.fp8_speedup == 1.0
    assert cfg.energy.pj_per_mac_int8 is None
    e = estimate(cfg, cycles=1.0, macs=10, macs_int8=4, macs_fp8=6)
    assert e.mac_pj == 10 * cfg.energy.pj_per_mac_bf16
    cloud = load_config("cloud")
    assert cloud.matrix.int8_speedup == cloud.matrix.fp8_speedup == 2
