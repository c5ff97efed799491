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


class InternalError(CompileError):
    """A compiler bug reached the user after every fallback (passes/fallback.py): names
    the phase, the op and its location, and asks for a report. The zoo and fuzz tests
    fail on it."""


class SramOverflowError(CompileError):
    """On-chip buffers of a kernel do not fit the target's memory; `kernel` names it."""

    def __init__(self, message: str, kernel: str | None = None):
        super().__init__(message)
        self.kernel = kernel


class HbmOverflowError(CompileError):
    """The program's tensors do not fit the target's HBM (names the bytes needed)."""


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


class DslError(TileccError):
    """An error in a tile-DSL kernel. The first line reads ``file:line:column: <what>``;
    two more lines show the source line and a caret under the column. `where` holds
    (file, line, column) and `headline` the first line alone."""

    def __init__(self, headline: str, where: tuple[str, int, int] | None = None, excerpt: str = ""):
        self.headline = headline
        self.where = where
        super().__init__(headline + (f"\n{excerpt}" if excerpt else ""))


class DslSyntaxError(DslError):
    """Malformed tile-DSL source: names what was expected, in words."""


class DslNameError(DslError):
    """A read of a name the kernel never defined (or a name used as the wrong kind)."""


class DslTypeError(DslError):
    """Operands whose dtypes an operation cannot combine."""


class DslShapeError(DslError):
    """Tile shapes an operation cannot combine, or a tile the target cannot hold (a
    partition dimension larger than the target's)."""


class DslMatmulError(DslError):
    """Matmul operands the matrix engine cannot take (space, dtype, layout or size)."""


class DslMemoryError(DslError, SramOverflowError):
    """A kernel's on-chip buffers do not fit the target; names the buffers live at the
    peak, largest first, with their lines."""


class DslRaceError(DslError):
    """A store whose elements are written by several iterations of a parallel loop."""


class QuantizationError(TileccError):
    """Weight quantisation that cannot be applied: an unknown weight format, or a model
    with no linear layer to quantise."""
