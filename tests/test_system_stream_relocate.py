"""runtime/system_stream.py relocates a segment's records by their start address; a
record whose HBM bytes cross the edge of an input / output region would be split between
two places, so it is refused with a clear error instead (`_check_spans`)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tilecc.errors import TileccError
from tilecc.runtime.system_stream import _check_spans
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import DType, Mem, Opcode, stream_of


def _load(hbm: int, nbytes: int) -> dict:
    cols = nbytes // 4
    return {"opcode": Opcode.DMA_LOAD, "queue": 0, "rows": 1, "cols": cols, "hbm_rs": cols, "hbm_cs": 1,
            "a_mem": Mem.HBM, "a_addr": hbm, "a_dtype": DType.F32, "o_mem": Mem.SRAM, "o_addr": 0,
            "o_dtype": DType.F32}


def _prog(*records: dict):
    return types.SimpleNamespace(stream=stream_of(*records), config=load_config("tiny"))


@pytest.mark.parametrize("start, nbytes, ok", [
    (0x1000, 0x100, True),     # inside the region [0x1000, 0x1400)
    (0x1300, 0x100, True),     # ends exactly at its edge
    (0x1300, 0x200, False),    # runs past its end
    (0x0f00, 0x200, False),    # starts before it and runs into it
    (0x2000, 0x400, True),     # outside every region (moved by the segment's base)
])
def test_records_crossing_a_region_edge_are_refused(start, nbytes, ok):
    prog = _prog(_load(start, nbytes))
    starts, ends = np.array([0x1000], np.int64), np.array([0x1400], np.int64)
    if ok:
        _check_spans(prog, starts, ends)
    else:
        with pytest.raises(TileccError, match="cross the edge"):
            _check_spans(prog, starts, ends)
