"""The model zoo (examples/zoo.py): real models from `transformers`, `timm` and
`torchvision` (decoder LMs of nine families and an MoE, encoders, seq2seq, audio
encoders, CNNs, vision transformers), each compiled for `tiny`, run sanitised on the
simulator and compared with eager. Any exception fails the test; one that is not a
`TileccError` (an internal error reaching the user) is named as such. The `FAST`
subset runs in the default profile, the rest under ``-m slow``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import zoo  # noqa: E402
from helpers import run_and_compare  # noqa: E402

from tilecc.errors import InternalError, TileccError  # noqa: E402


def test_the_zoo_is_broad():
    kinds = {m.kind for m in zoo.ZOO}
    assert len(zoo.ZOO) >= 30 and {"decoder", "moe", "encoder", "seq2seq", "audio", "cnn", "vit"} <= kinds
    assert len([m for m in zoo.ZOO if m.kind in ("decoder", "moe")]) >= 8
    assert {m.source for m in zoo.ZOO} == {"transformers", "timm", "torchvision"}
    assert set(zoo.FAST) <= {m.name for m in zoo.ZOO}


@pytest.mark.parametrize(
    "m", [pytest.param(m, id=m.name, marks=() if m.name in zoo.FAST else pytest.mark.slow) for m in zoo.ZOO]
)
def test_zoo_model_matches_eager(m: zoo.ZooModel):
    model, inputs = m.factory()
    try:
        run_and_compare(model, inputs, target="tiny")
    except TileccError as e:
        if isinstance(e, InternalError):
            pytest.fail(f"{m.name}: an internal error reached the user: {e}")
        raise
    except AssertionError:
        raise  # a mismatch with eager (run_and_compare's own check)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{m.name}: {type(e).__name__} is not a TileccError: {e}")
