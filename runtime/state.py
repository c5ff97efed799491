"""Program state: registered buffers a model updates in place (static KV caches).

The importer turns a buffer that forward() mutates into an input and an output both
named ``buffer:<name>`` (`frontend/torch_export.STATE_PREFIX`), and a user input it
mutates into an output ``mutated:<name>``. The program stays a pure function; a
`ModelState` carries the buffers between calls, as eager PyTorch's module does:

    state = ModelState(source=ep)                  # buffers start as they were at export
    args = state.program_inputs(program, user_inputs)
    outputs = state.absorb(program, run(args), user_inputs)  # the user's outputs only

After `absorb`, `state.buffers[name]` holds the value forward() left in the buffer,
and a mutated user input has been updated in place (``tensor.copy_``), like eager.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from tilecc.errors import InputMismatchError
from tilecc.frontend.torch_export import MUTATED_INPUT_PREFIX, STATE_PREFIX
from tilecc.runtime.program import Program


@dataclass
class ModelState:
    buffers: dict[str, torch.Tensor] = field(default_factory=dict[str, torch.Tensor])
    # where a buffer not yet in `buffers` takes its first value (a copy): the export
    source: ExportedProgram | None = None

    def buffer(self, name: str) -> torch.Tensor | None:
        if name not in self.buffers and self.source is not None:
            data = self.source.state_dict.get(name)
            if data is None:
                data = self.source.constants.get(name)
            if isinstance(data, torch.Tensor):
                self.buffers[name] = data.detach().clone()
        return self.buffers.get(name)

    def program_inputs(self, program: Program, inputs: tuple) -> tuple:
        """The program's inputs: the user's, in order, with the state buffers in their places."""
        user = iter(inputs)
        n_user = sum(not s.name.startswith(STATE_PREFIX) for s in program.inputs)
        if len(inputs) != n_user:
            names = ", ".join(s.name for s in program.inputs if not s.name.startswith(STATE_PREFIX))
            raise InputMismatchError(f"the program takes {n_user} input(s) ({names}), got {len(inputs)}")
        out = []
        for spec in program.inputs:
            if not spec.name.startswith(STATE_PREFIX):
                out.append(next(user))
                continue
            name = spec.name[len(STATE_PREFIX) :]
            value = self.buffer(name)
            if value is None:
                raise InputMismatchError(
                    f"the program updates buffer '{name}', but this model holds no value for it "
                    "(a program loaded from a file starts without its buffers: set "
                    f"compiled.state.buffers['{name}'])"
                )
            out.append(value)
        return tuple(out)

    def absorb(self, program: Program, outputs: list[torch.Tensor], inputs: tuple) -> list[torch.Tensor]:
        """Keep the buffers' new values, update mutated user inputs in place, and
        return the user's outputs."""
        user_names = [s.name for s in program.inputs if not s.name.startswith(STATE_PREFIX)]
        result = []
        for spec, value in zip(program.outputs, outputs, strict=True):
            if spec.name.startswith(STATE_PREFIX):
                self.buffers[spec.name[len(STATE_PREFIX) :]] = value
            elif spec.name.startswith(MUTATED_INPUT_PREFIX):
                name = spec.name[len(MUTATED_INPUT_PREFIX) :]
                if name in user_names:
                    inputs[user_names.index(name)].copy_(value)
            else:
                result.append(value)
        return result


__all__ = ["ModelState"]
