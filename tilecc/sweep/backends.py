"""Where a sweep's tasks run: in this process, in a local process pool, or on Ray.

    backend = make_backend(workers=4, ray=None)      # LocalPool(4); workers=1: InProcess
    for outcomes in backend.run(tasks): ...          # each task's outcomes, as it finishes
    backend.close()

Every backend runs `evaluate.evaluate_task`, the same function, so their results are
identical; only the order in which tasks finish differs (the sweep sorts by point).

`ray` (``--ray local`` starts a local Ray instance; ``--ray ADDRESS`` joins a cluster)
is an optional dependency (``pip install tilecc[sweep]``): one Ray task per task. The
pool uses the ``spawn`` start method (a forked torch is not safe once its threads run).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Iterator
from typing import Any, Protocol

from tilecc.errors import TileccError
from tilecc.sweep.evaluate import Outcome, Task, evaluate_task

__all__ = ["Backend", "InProcess", "LocalPool", "RayBackend", "make_backend", "MissingDependencyError"]


class MissingDependencyError(TileccError):
    """An optional dependency the command needs is not installed."""


def require(module: str, what: str) -> Any:
    """Import the optional dependency `module` or say how to install it, in one line."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{what} needs the optional dependency '{module}' "
                                     f"(pip install 'tilecc[sweep]' or pip install {module})") from None


class Backend(Protocol):
    def run(self, tasks: list[Task]) -> Iterator[list[Outcome]]: ...

    def close(self) -> None: ...


class InProcess:
    def run(self, tasks: list[Task]) -> Iterator[list[Outcome]]:
        for t in tasks:
            yield evaluate_task(t)

    def close(self) -> None:
        pass


class LocalPool:
    def __init__(self, workers: int):
        self.workers = workers
        self._pool: cf.ProcessPoolExecutor | None = None

    def run(self, tasks: list[Task]) -> Iterator[list[Outcome]]:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        futures = [self._pool.submit(evaluate_task, t) for t in tasks]
        for f in cf.as_completed(futures):
            yield f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayBackend:
    def __init__(self, address: str):
        self.ray = require("ray", "--ray")
        if not self.ray.is_initialized():
            try:
                self.ray.init(address=None if address == "local" else address, include_dashboard=False,
                              log_to_driver=False, logging_level="ERROR")
            except Exception as e:  # a bad address, an unreachable cluster: one line
                raise TileccError(f"--ray {address!r}: cannot start or join Ray ({type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
        self._remote = self.ray.remote(evaluate_task)

    def run(self, tasks: list[Task]) -> Iterator[list[Outcome]]:
        pending = [self._remote.remote(t) for t in tasks]
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            yield self.ray.get(ready[0])

    def close(self) -> None:
        self.ray.shutdown()


def make_backend(workers: int, ray: str | None) -> Backend:
    if ray:
        return RayBackend(ray)
    return InProcess() if workers <= 1 else LocalPool(workers)
