"""The plain-JAX frontend, named ``"jax"``: any JAX function (``lambda x: jnp.sin(x)``,
a Hugging Face wrapper's ``__call__``) traced as it is.

Written through the recipe in docs/architecture.md ("how to add a
frontend"): it has no modules, so it only says what it accepts (any
callable, last of all frontends), traces a bare activation as an
``activation`` node, and installs the one hook plain JAX code needs: the
public activation names (``jax.nn.gelu``) pointed at their marking wrappers.
Variables of the modules such a function calls are placed by their own
frontend (`yax.frontends.variables`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import _activations
from .._scripts import Script, register_script
from . import Frontend


class JaxFrontend(Frontend):
    name = "jax"  # not "function", which is the kind of a node a rewrite puts in
    order = 100  # accepts every callable: asked last
    activation_homes = ("jax.nn",)

    def hooks(self, rec: Any) -> Any:
        return _activations.patched_names(rec)

    def accepts(self, fn: Any) -> bool:
        return callable(fn)

    def prepare(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
        return _activations.marking(fn), args, kwargs, None  # a bare activation is a node too



def _lines(model: str, inputs: Sequence[str], kwargs: str, has_params: bool) -> list[str]:
    call = (", ".join(inputs) + kwargs).removeprefix(", ")  # `fn(x=...)`: keyword inputs only, no comma first
    return [f"mox = yax.make_mox({model})({call})"] + ([f"params = {inputs[0]}"] if has_params and inputs else [])


frontend = JaxFrontend()
register_script(frontend.name, Script(lines=_lines))
