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
        names = sorted({name for name, _ in ops})
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
