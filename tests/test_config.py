"""Hardware configs: presets load and validate; bad configs name key, value and what is allowed."""

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
    ],
)
def test_invalid_configs(edit, message):
    d = _tiny()
    edit(d)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        from_dict(d, "my.toml")


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
