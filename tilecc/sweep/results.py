"""`DIR/results.csv`, written as each point finishes, so that an interrupted sweep
resumes (`--resume`) without losing a finished point.

    store = ResultStore.open(out_dir, spec, resume=True)   # reads back what a previous run finished
    store.done                                             # {(workload, index): row}
    store.append(row)                                      # one line, flushed and fsync'ed
    store.finish(rows)                                     # the final table, sorted, with `pareto`

Columns: `point` (the index in the sweep's order), `workload` (only when the spec has
several), one per swept key named as in the spec, one per objective named as in the
spec, `bottleneck`, `pareto` (empty until the sweep finishes) and `failure` (the reason
a point has no figures). Values are kept as the text first written, so a resumed
sweep's final table is byte-identical to an uninterrupted one's.

`DIR/spec.json` holds the spec's meaning (`SweepSpec.fingerprint`): resuming into a
directory of another spec is an error, as is starting afresh over existing results.
A line cut short by the interruption (no newline) is dropped and its point rerun.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tilecc.errors import TileccError
from tilecc.fsutil import atomic_write
from tilecc.sweep.spec import SweepSpec

__all__ = ["ResultStore", "SweepOutputError", "columns", "write_file"]

RESULTS = "results.csv"
SPEC = "spec.json"
FSYNC_S = 0.5  # seconds between fsyncs of results.csv while a sweep runs


class SweepOutputError(TileccError):
    """The output directory cannot take this sweep's results."""


def write_file(path: Path, data: bytes, prefix: str) -> None:
    """`atomic_write`, readable by others as a normal output file is."""
    atomic_write(path, data, prefix)
    os.chmod(path, 0o644)


def columns(spec: SweepSpec) -> list[str]:
    cols = ["point"] + (["workload"] if len(spec.workloads) > 1 else []) + spec.keys + list(spec.objectives)
    return cols + ["bottleneck", "pareto", "failure"]


def _line(cols: list[str], row: dict[str, str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([row.get(c, "") for c in cols])
    return buf.getvalue()


@dataclass
class ResultStore:
    dir: Path
    cols: list[str]
    done: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)
    _file: TextIO | None = None
    _synced: float = 0.0

    @staticmethod
    def open(out_dir: str | Path, spec: SweepSpec, fidelity: str, resume: bool) -> ResultStore:
        d = Path(out_dir)
        if d.exists() and not d.is_dir():
            raise SweepOutputError(f"--out '{out_dir}' is a file, not a directory")
        fingerprint = json.dumps({"spec": json.loads(spec.fingerprint()), "fidelity": fidelity}, sort_keys=True)
        store = ResultStore(d, columns(spec))
        results = d / RESULTS
        if results.exists() and not resume:
            raise SweepOutputError(f"'{results}' exists: pass --resume to continue that sweep, or another --out")
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SweepOutputError(f"--out '{out_dir}': cannot create the directory ({e.strerror})") from None
        if resume and results.exists():
            old = (d / SPEC).read_text(encoding="utf-8") if (d / SPEC).exists() else ""
            if old != fingerprint:
                raise SweepOutputError(f"--resume: '{d}' holds the results of another spec or fidelity")
            store._read(results)
        else:
            write_file(d / SPEC, fingerprint.encode(), ".spec-")
            write_file(results, _line(store.cols, {c: c for c in store.cols}).encode(), ".results-")
        return store

    def _read(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        if not text.endswith("\n"):  # the last line was cut short: drop it, its point reruns
            text = text[: text.rfind("\n") + 1]
        rows = list(csv.reader(io.StringIO(text)))
        if not rows or rows[0] != self.cols:
            raise SweepOutputError(f"--resume: '{path}' has other columns than this spec's")
        for r in rows[1:]:
            row = dict(zip(self.cols, r))
            self.done[(row.get("workload", ""), int(row["point"]))] = row
        path.write_text(text, encoding="utf-8")

    def append(self, row: dict[str, str]) -> None:
        """Add one finished point to the file: written through to the OS at once (an
        interrupted or killed sweep keeps it), fsync'ed at most every `FSYNC_S` seconds
        (the estimate tier writes hundreds of rows a second) and when the store closes."""
        if self._file is None:
            self._file = open(self.dir / RESULTS, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._file.write(_line(self.cols, row))
        self._file.flush()
        now = time.monotonic()
        if now - self._synced >= FSYNC_S:
            os.fsync(self._file.fileno())
            self._synced = now
        self.done[(row.get("workload", ""), int(row["point"]))] = row

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def finish(self, rows: list[dict[str, str]]) -> None:
        """Replace the file by the final table (rows in sweep order, `pareto` filled)."""
        self.close()
        text = _line(self.cols, {c: c for c in self.cols}) + "".join(_line(self.cols, r) for r in rows)
        write_file(self.dir / RESULTS, text.encode(), ".results-")
