"""The system description: the `[system]` TOML table and the short command-line form load
and validate; bad input raises `ConfigError` naming the key, the value and the rule."""

from __future__ import annotations

import pytest

from tilecc.errors import ConfigError
from tilecc.simulator.interconnect.system import (
    LINK_PRESETS,
    LinkConfig,
    load_system,
    parse_short,
    system_from_dict,
)

GOOD = """
[system]
name = "pod"
topology = "torus:4x4"
chips = 16
cores_per_chip = 8
chip = "cloud"

[system.link]
preset = "tpu-v5e-ici"
latency_ns = 750
"""


def test_toml_file(tmp_path):
    path = tmp_path / "pod.toml"
    path.write_text(GOOD)
    s = load_system(str(path))
    assert (s.name, s.chips, s.cores_per_chip, s.topology.spec) == ("pod", 16, 8, "torus:4x4")
    assert s.link == LinkConfig(**{**LINK_PRESETS["tpu-v5e-ici"], "latency_ns": 750.0})
    assert s.chip_config(15).name == "cloud"


def test_chips_may_differ():
    s = system_from_dict({"topology": "ring:3", "chip": ["cloud", "edge", "tiny"]})
    assert [s.chip_config(i).name for i in range(3)] == ["cloud", "edge", "tiny"]
    with pytest.raises(ConfigError, match="chip 3 does not exist"):
        s.chip_config(3)


def test_short_form():
    s = parse_short("fattree:k=4,levels=2,oversubscription=2;chip=edge;cores=2;link=nvlink4;bandwidth_gbs=100")
    assert (s.chips, s.cores_per_chip, s.chip_targets) == (16, 2, ("edge",))
    assert s.topology.oversubscription == 2.0
    assert s.link.bandwidth_gbs == 100.0 and s.link.switch_latency_ns == LINK_PRESETS["nvlink4"]["switch_latency_ns"]
    assert load_system("ring:4").link == LinkConfig(**LINK_PRESETS["trn2-neuronlink"])


def test_presets_are_valid():
    for name in LINK_PRESETS:
        assert system_from_dict({"topology": "switch:4", "link": {"preset": name}}).link.bandwidth_gbs > 0


@pytest.mark.parametrize("data, message", [
    ({"topology": "ring:4", "colour": 1}, "unknown key 'system.colour'"),
    ({}, "missing key 'system.topology'"),
    ({"topology": "ring:1"}, "'system.topology' = 'ring:1': the ring size must be >= 2, got 1"),
    ({"topology": "ring:4", "chips": 8}, "'system.chips' = 8 does not match 'system.topology' = 'ring:4', which has 4 chips"),
    ({"topology": "ring:4", "cores_per_chip": 0}, "'system.cores_per_chip' must be a whole number in 1..1024, got 0"),
    ({"topology": "ring:4", "chip": "nosuch"}, "'system.chip' = 'nosuch': unknown target 'nosuch'"),
    ({"topology": "ring:4", "chip": ["cloud"] * 3}, "'system.chip' lists 3 configs for 4 chips"),
    ({"topology": "ring:4", "chip": ["cloud", "cloud", 5, "cloud"]}, "'system.chip[2]' must be a preset name"),
    ({"topology": "ring:4", "link": {"preset": "infiniband"}}, "'system.link.preset' = 'infiniband' is not a link preset"),
    ({"topology": "ring:4", "link": {"bandwidth_gbs": 0}}, "'system.link.bandwidth_gbs' must be > 0, got 0.0"),
    ({"topology": "ring:4", "link": {"latency_ns": -1}}, "'system.link.latency_ns' must be a finite number >= 0, got -1"),
    ({"topology": "ring:4", "link": {"latency_ns": "fast"}}, "'system.link.latency_ns' must be a number, got 'fast'"),
    ({"topology": "ring:4", "link": {"jitter_ns": 1}}, "unknown key 'system.link.jitter_ns'"),
    ({"topology": "ring:4", "link": 3}, "'system.link' must be a table, got 3"),
    ("ring:4", "'system' must be a table"),
])
def test_bad_systems_name_key_value_and_rule(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")) as e:
        system_from_dict(data, "pod.toml")
    assert str(e.value).startswith("pod.toml: ")


@pytest.mark.parametrize("text, message", [
    ("ring:4;cores", "'cores' is not KEY=VALUE"),
    ("ring:4;speed=3", "'speed=3' is not KEY=VALUE"),
    ("ring:4;cores=two", "'system.cores_per_chip' must be a whole number in 1..1024, got 'two'"),
    ("ring:4;bandwidth_gbs=x", "'system.link.bandwidth_gbs' must be a number, got 'x'"),
    ("nosuch.toml", "system file 'nosuch.toml' does not exist"),
])
def test_bad_short_forms(text, message):
    with pytest.raises(ConfigError, match=message):
        load_system(text)


def test_bad_files(tmp_path):
    (tmp_path / "bad.toml").write_text("[system\n")
    (tmp_path / "none.toml").write_text("name = 'x'\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_system(str(tmp_path / "bad.toml"))
    with pytest.raises(ConfigError, match=r"missing table '\[system\]'"):
        load_system(str(tmp_path / "none.toml"))
    with pytest.raises(ConfigError, match="is a directory"):
        (tmp_path / "d.toml").mkdir()
        load_system(str(tmp_path / "d.toml"))


def test_the_docs_example_loads(tmp_path):
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs/system.md").read_text(encoding="utf-8")
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pod.toml").write_text(block)
    s = load_system(str(tmp_path / "pod.toml"))
    assert (s.chips, s.cores_per_chip, s.link.bandwidth_gbs) == (16, 8, 160.0)
