"""The Program: a compiled model as one self-contained value.

A Program holds the instruction stream, the HBM layout of its inputs, outputs and
weights (with the weights' bytes), the hardware config it was compiled for, and the
work figures the roofline bound needs. It saves to and loads from one file:

    offset  size  field
    0       8     magic b"TILECCPG"
    8       4     format version (u32, PROGRAM_VERSION)
    12      4     CRC-32 of everything after the 40-byte header (u32)
    16      8     metadata length M (u64): UTF-8 JSON
    24      8     stream length S (u64): the instruction stream, `codegen.binary` encoding
    32      8     weights length W (u64): weight bytes, at the offsets the metadata names
    40      M+S+W the three sections in that order

Loading checks the magic, version, lengths and checksum and raises
`ProgramFormatError` with what is wrong.

Versions: 2 (the metadata's `work` holds the workload's intrinsic work under
`simulator.roofline.WORK_KEYS`, counted on the graph before any pass, and the program's
own under `program_*` keys); 1 (its `work` was the program's own, compulsory bytes
included): refused, with a request to recompile.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.codegen.binary import decode_stream, encode_stream
from tilecc.errors import ProgramFormatError, TimingOnlyError
from tilecc.simulator.config import HardwareConfig, from_dict
from tilecc.simulator.isa import ITEMSIZE, DType
from tilecc.simulator.roofline import WORK_KEYS

MAGIC = b"TILECCPG"
PROGRAM_VERSION = 2
# the work figures a version-2 file must hold (runtime/compiler.py PROGRAM_WORK_KEYS)
_WORK_KEYS = WORK_KEYS + ("program_macs_16", "program_macs_fp32", "program_vector_element_cycles",
                          "program_hbm_bytes")
_HEADER = struct.Struct("<8sII QQQ")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    offset: int  # byte offset in HBM
    shape: tuple[int, ...]
    dtype: DType  # the element type in HBM
    # the user-facing torch dtype when it differs from `dtype`'s ("int64", "bool" for an
    # I32 tensor); the executor converts at the boundary. "" means `dtype`'s own.
    torch_dtype: str = ""

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ITEMSIZE[self.dtype]

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "offset": self.offset, "shape": list(self.shape), "dtype": self.dtype.name}
        if self.torch_dtype:
            d["torch_dtype"] = self.torch_dtype
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> TensorSpec:
        return TensorSpec(
            d["name"], int(d["offset"]), tuple(d["shape"]), DType[d["dtype"]], str(d.get("torch_dtype", ""))
        )


@dataclass
class Program:
    stream: np.ndarray
    kernels: list[tuple[str, int, int]]  # (name, first record, record count)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[TensorSpec]
    weight_data: dict[str, np.ndarray]  # name -> stored bytes (uint8)
    hbm_size: int
    config: HardwareConfig
    work: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def hbm_image(self) -> np.ndarray:
        """A fresh HBM image with the weights in place."""
        hbm = np.zeros(self.hbm_size, dtype=np.uint8)
        for spec in self.weights:
            data = self.weight_data.get(spec.name)
            if data is None:  # a timing-only program's weight without values
                continue
            hbm[spec.offset : spec.offset + data.size] = data
        return hbm

    # ---- serialisation -------------------------------------------------------------
    def to_bytes(self) -> bytes:
        meta = {
            "kernels": [list(k) for k in self.kernels],
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "weights": [s.to_json() for s in self.weights],
            "hbm_size": self.hbm_size,
            "config": asdict(self.config),
            "work": self.work,
            "meta": self.meta,
        }
        meta_b = json.dumps(meta, sort_keys=True).encode()
        stream_b = encode_stream(self.stream)
        blob = b"".join(self.weight_data[s.name].tobytes() for s in self.weights)
        body = meta_b + stream_b + blob
        header = _HEADER.pack(MAGIC, PROGRAM_VERSION, zlib.crc32(body), len(meta_b), len(stream_b), len(blob))
        return header + body

    @staticmethod
    def from_bytes(data: bytes, source: str = "<bytes>") -> Program:
        if len(data) < _HEADER.size:
            raise ProgramFormatError(
                f"{source}: truncated program file ({len(data)} bytes, the header alone is {_HEADER.size})"
            )
        magic, version, crc, m, s, w = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ProgramFormatError(f"{source}: not a tilecc program file (magic {magic!r})")
        if version != PROGRAM_VERSION:
            old = (" (an older tilecc's: its roofline figures were the program's own work; "
                   "recompile the model)" if version == 1 else "")
            raise ProgramFormatError(
                f"{source}: program format version {version}, this tilecc reads version "
                f"{PROGRAM_VERSION}{old}"
            )
        body = data[_HEADER.size :]
        if len(body) != m + s + w:
            raise ProgramFormatError(
                f"{source}: truncated or padded program file: sections need {m + s + w} bytes "
                f"after the header, found {len(body)}"
            )
        if zlib.crc32(body) != crc:
            raise ProgramFormatError(f"{source}: checksum mismatch: the program file is corrupt")
        try:
            meta = json.loads(body[:m])
            missing = [k for k in _WORK_KEYS if k not in meta["work"]]
            if missing:
                raise ProgramFormatError(f"work figures lack {', '.join(missing)}")
            try:
                stream = decode_stream(body[m : m + s])
            except ProgramFormatError as e:
                raise ProgramFormatError(f"instruction stream section: {e}") from None
            weights = [TensorSpec.from_json(d) for d in meta["weights"]]
            blob = np.frombuffer(body[m + s :], dtype=np.uint8)
            weight_data: dict[str, np.ndarray] = {}
            pos = 0
            for spec in weights:
                weight_data[spec.name] = blob[pos : pos + spec.nbytes].copy()
                pos += spec.nbytes
            return Program(
                stream=stream,
                kernels=[(k[0], int(k[1]), int(k[2])) for k in meta["kernels"]],
                inputs=[TensorSpec.from_json(d) for d in meta["inputs"]],
                outputs=[TensorSpec.from_json(d) for d in meta["outputs"]],
                weights=weights,
                weight_data=weight_data,
                hbm_size=int(meta["hbm_size"]),
                config=from_dict(meta["config"], f"{source} (embedded config)"),
                work=meta["work"],
                meta=meta["meta"],
            )
        except ProgramFormatError as e:
            raise ProgramFormatError(f"{source}: {e}") from None
        except (KeyError, ValueError, TypeError) as e:
            raise ProgramFormatError(f"{source}: malformed metadata ({type(e).__name__}: {e})") from None

    @property
    def timing_only(self) -> bool:
        """Compiled without weight values (a meta-device model): it can be timed, not run."""
        return bool(self.meta.get("timing_only"))

    def save(self, path: str | Path) -> None:
        if self.timing_only:
            raise TimingOnlyError(
                f"{path}: this program was compiled from a model on the meta device and holds no weight "
                "values; a program file holds them, so it cannot be saved (compile the model again to time it)")
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        tmp.replace(path)

    @staticmethod
    def load(path: str | Path) -> Program:
        p = Path(path)
        if not p.is_file():
            raise ProgramFormatError(f"{path}: {'a directory, not' if p.is_dir() else 'no such'} program file")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise ProgramFormatError(f"{path}: cannot be read ({e.strerror or e})") from None
        return Program.from_bytes(data, str(path))
