"""What the explorer's "copy as code" writes to trace a module system's model
again: a table each module system (a frontend, or a plug-in for one) registers
into (`register_script`), as LoRA adapters are (`yax._lora`). A system that
registers nothing gets `Script()`: ``mox = yax.make_mox(model)(*inputs)``,
its parameters being the first input. Nothing here imports yax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence


def usual_names(n_inputs: int, has_params: bool) -> list[str]:
    """The usual names of a model and its ``n_inputs`` inputs, for a script
    written without the user's own names (``model, variables, batch``)."""
    first = ["variables"] if has_params else []
    rest = ["x" if not has_params else "batch"] + [f"input{i}" for i in range(2, n_inputs + 1)]
    return ["fn" if not has_params else "model", *(first + rest)[:n_inputs]]


def make_mox_lines(model: str, inputs: Sequence[str], kwargs: str, has_params: bool) -> list[str]:
    """``mox = yax.make_mox(model)(*inputs)`` (and ``params = inputs[0]``, with ``has_params``)."""
    lines = [f"mox = yax.make_mox({model})({', '.join(inputs)}{kwargs})"]
    return lines + ([f"params = {inputs[0]}"] if has_params and inputs else [])


@dataclasses.dataclass(frozen=True)
class Script:
    """How copy-as-code writes one module system's model.

    ``names(n_inputs, has_params)``: the usual names of the model and its inputs;
    ``lines(model, inputs, kwargs, has_params)``: the lines making ``mox`` (and
    ``params``) from the model given as ``model`` and its inputs as ``inputs``
    (their expressions; ``kwargs``: ``", k=v"`` text), as the system traced them;
    ``homes``: ``(module, alias)`` where users import its modules from
    (``("flax.linen", "nn")``), for the expressions the script writes."""

    names: Callable[[int, bool], list[str]] = usual_names
    lines: Callable[[str, Sequence[str], str, bool], list[str]] = make_mox_lines
    homes: tuple[tuple[str, str], ...] = ()


#: Each module system's `Script`, by frontend name (`register_script`).
SCRIPTS: dict[str, Script] = {}


def register_script(system: str, script: Script) -> None:
    """Say how copy-as-code writes the models of ``system`` (a frontend's name)."""
    SCRIPTS[system] = script


def script_of(system: str | None) -> Script:
    """The `Script` of ``system``: the registered one, else the default."""
    return SCRIPTS.get(system or "", Script())
