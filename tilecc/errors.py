"""The tilecc exception hierarchy.

Every error tilecc raises on bad input derives from `TileccError`, and its message
names the cause and the place (a source location, a config key, an instruction index).
The CLI prints ``error: <message>`` on one line and exits with status 2.
"""

from __future__ import annotations


class TileccError(Exception):
    """Base class of every error tilecc reports to a user."""


class UnsupportedOpError(TileccError):
    """The model contains operators tilecc cannot compile.

    `ops` lists (op name, source location) pairs: all of them, not only the first.
    """

    def __init__(self, ops: list[tuple[str, str]]):
        self.ops = ops
        names = sorted({name.split(" (")[0] for name, _ in ops})  # the reasons follow, with the places
        places = "; ".join(f"{name} at {loc}" for name, loc in ops)
        super().__init__(
            f"{len(ops)} unsupported op(s) ({', '.join(names)}): {places}"
        )


class ConfigError(TileccError):
    """An invalid hardware configuration: names the key, the value and what is allowed."""


class ShapeError(TileccError):
    """Operand shapes that an op cannot take (shape inference or verification)."""


class InputMismatchError(TileccError):
    """Inputs passed at call time do not match what the program was compiled for."""


class ProgramFormatError(TileccError):
    """A program file or instruction stream that is truncated, corrupt or of another version."""


class AsmSyntaxError(TileccError):
    """Malformed assembly text (line:column)."""


class CompileError(TileccError):
    """The compiler could not lower a valid program (names the op and the reason)."""


class SramOverflowError(CompileError):
    """On-chip buffers of a kernel do not fit the target's memory."""


class TensorTooLargeError(CompileError):
    """A tensor dimension cannot be tiled onto the target (e.g. a row too long for SRAM)."""


class SimulatorError(TileccError):
    """The simulator stopped on an invalid program (names the instruction)."""


class DeadlockError(SimulatorError):
    """Engines wait on semaphores that can never reach the awaited values."""


class MemoryAccessError(SimulatorError):
    """An instruction accesses memory out of bounds."""


class ModelLoadError(TileccError):
    """A `FILE.py:FACTORY` spec that cannot be loaded or does not return (model, inputs)."""


class ExportError(TileccError):
    """torch.export (or its decompositions) failed on the model; wraps the torch error."""


class RaceError(SimulatorError):
    """Two engine queues access overlapping bytes, at least one writing, with no ordering
    (queue order, semaphore or barrier) between them. Names both instructions and the
    overlapping memory range; `instructions` holds the two indices, lower first."""

    def __init__(self, message: str, instructions: tuple[int, int] | None = None):
        super().__init__(message)
        self.instructions = instructions


class UninitializedReadError(SimulatorError):
    """An instruction reads on-chip memory (SRAM or accumulator) that nothing wrote before
    it in simulated time. Names the instruction and the never-written range;
    `instruction` holds its index."""

    def __init__(self, message: str, instruction: int | None = None):
        super().__init__(message)
        self.instruction = instruction
