"""The semi-public layer of yax: what ``yax_widget``, the tests and the
benches use beyond the public API (like ``jax.extend`` or
``equinox.internal``). Nothing outside ``yax`` imports a private module;
these names are stable between the two, but not promised to users.

Contents:
  node lookup      `node_index` (one per MoX: every node's number, which is its element id in the
                   XML view, its node and parent by number, call keys, positions), `node_ids`,
                   `view` (the XML view: ``.nodes``, ``.ids``; cached), `build_view`,
                   `to_xml_text`/`from_xml_text` (how the view escapes text XML cannot hold)
  node kinds       `Kind`, `CALL_KINDS`, `FN_KINDS`, `param_copies` (sets of a scanned call's parameters)
  formatting       `type_str`, `value_str`, `shown_params`, `key_attrs`, `shown_attrs`,
                   `precisions` (the dtypes each call computes with, `yax.Policy` by ``id(node)``),
                   `is_mixed` (whether a MoX's calls use more than one floating dtype)
  fit checks       `misfit`, `is_decider`, `is_module`
  measuring        `Measured`, `measure`, `compare_measured`, `paired_outputs`,
                   `compiled_programs`, `eager_is_cheaper`,
                   `compare_gradients` (`compare`'s ``grad_of``), `model_jit` (``jax.jit`` as yax
                   compiles a whole model: XLA:CPU's memory-minimising scheduler)
  call keys        `call_keys` (compare's boundary names), `keyed` (diff's), `capture_keys`
                   (the keys `capture` gives every call and equation)
  folding          `structure_keys` (equal for calls of the same structure: the tree's ×N rows)
  cost             `all_flops` (every node's FLOPs of matrix products and convolutions, ``None``
                   where not known before running: `flops_unknown_why` says why), `how` (how a
                   higher-order equation runs what it holds: `yax._calls.HIGHER_ORDER`; `is_scan`,
                   `is_loop`, `is_branch` ask it)
  caches           `memo` (what is derived from a MoX, computed once and kept while it lives: the
                   one home of per-MoX caches), `kept` (what is kept under a name, building nothing)
  sharding         `call_specs` (how the parameters each call reads are laid out: the view's
                   ``@sharding``), `spread` (whether a value is held on several devices)
  values           `ValueStats` (statistics of one array), `capture_programs` (the jitted
                   programs `capture`/`patch` keep per MoX, with their trace counts),
                   `capturable_calls` (the calls whose values `capture` can bring out),
                   `results_of` (a call's result pytree from its flat outputs, as `capture` gives it)
  source lines     `Location` (what ``node.source`` gives), `lines_around` (the lines of a file around one,
                   read from the disk or Python's line cache)
  tracing          `trace_target` (a MoX and the arguments it is evaluated with),
                   `variables_argument` (which of them `yax.sub`'s ``params=`` takes)
  frontends        `Frontend`, `register`, `frontends` (all, in order), `frontend_named`,
                   `Adapters`/`register_adapters`/`ADAPTERS` (a module system's LoRA adapters),
                   `Script`/`register_script`/`script_of` (what copy-as-code writes for its models),
                   `unwrap_target` (a model holding its own variables as a function of them)
  files            `check_target` (a path a file can be written to, else a sentence), `staged`
                   (files written whole beside their paths and renamed at the end, or not at all)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._calls import how as how
from ._calls import index as node_index
from ._calls import is_branch as is_branch
from ._calls import is_loop as is_loop
from ._calls import is_scan as is_scan
from ._calls import kept as kept
from ._calls import memo as memo
from ._calls import param_copies as param_copies
from ._capture import ValueStats as ValueStats
from ._capture import capturable_calls as capturable_calls
from ._capture import capture_keys as capture_keys
from ._capture import capture_programs as capture_programs
from ._capture import results_of as results_of
from ._compare import Measured as Measured
from ._compare import call_keys as call_keys
from ._compare import compare_gradients as compare_gradients
from ._compare import compare_measured as compare_measured
from ._compare import compiled_programs as compiled_programs
from ._compare import eager_is_cheaper as eager_is_cheaper
from ._compare import measure as measure
from ._compare import paired_outputs as paired_outputs
from ._diff import keyed as keyed
from ._files import check_target as check_target
from ._files import staged as staged
from ._fold import structure_keys as structure_keys
from ._ir import CALL_KINDS as CALL_KINDS
from ._ir import FN_KINDS as FN_KINDS
from ._ir import Kind as Kind
from ._ir import ModuleInfo as ModuleInfo
from ._jit import model_jit as model_jit
from ._lora import ADAPTERS as ADAPTERS
from ._lora import Adapters as Adapters
from ._lora import register_adapters as register_adapters
from ._precision import is_mixed as is_mixed
from ._precision import precisions as precisions
from ._print import key_attrs as key_attrs
from ._print import shown_attrs as shown_attrs
from ._print import shown_params as shown_params
from ._record import CallInfo as CallInfo
from ._record import marked_call as marked_call
from ._record import recorder as recorder
from ._scripts import Script as Script
from ._scripts import register_script as register_script
from ._scripts import script_of as script_of
from ._sharding import call_specs as call_specs
from ._sharding import is_sharded as is_sharded
from ._sharding import reduced_stats as reduced_stats
from ._sharding import spec_of as spec_of
from ._sharding import spec_text as spec_text
from ._sharding import spread as spread
from ._sharding import to_host as to_host
from ._source import Location as Location
from ._source import lines_around as lines_around
from ._summary import all_flops as all_flops
from ._summary import flops_unknown_why as flops_unknown_why
from ._trace import trace_target as trace_target
from ._view import build_view as build_view
from ._view import from_xml_text as from_xml_text
from ._view import to_xml_text as to_xml_text
from ._view import view as view
from ._vocab import type_str as type_str
from ._vocab import value_str as value_str
from .frontends import Frontend as Frontend
from .frontends import register as register
from .rewrite import is_decider as is_decider
from .rewrite import is_module as is_module
from .rewrite import misfit as misfit


def node_ids(mox: Any) -> dict[int, int]:
    """``id(node)`` -> the node's number: its element id in the XML view of ``mox`` (`node_index`), without
    building the document: opening a model does not wait for the XML of every equation (on a 70B
    structure the document took seconds; the first query builds it)."""
    return node_index(mox).ids


def variables_argument(mox: Any, args: tuple[Any, ...]) -> Any:
    """The argument of ``args`` that `yax.sub`'s ``params=`` takes for
    ``mox`` (the variables or state), or ``None`` when there is none: the
    root's frontend's answer, else the first frontend that recognises one (a
    plain function taking a linen variables dict), as `frontends.variables`
    places them."""
    from .frontends import first_answer

    return first_answer(mox, lambda f: f.variables_argument(mox, args))


def frontends() -> list[Frontend]:
    """Every frontend, in the order they are asked (`yax.frontends.registry`)."""
    from .frontends import registry

    return list(registry())


def frontend_named(name: str | None) -> Frontend:
    """The frontend called ``name`` (the plain-function one for ``None`` or an unknown name)."""
    from .frontends import get

    return get(name)


def call_signature(target: Any) -> tuple[Callable[..., Any], int] | None:
    """The function naming the inputs of a model object and how many of its leading
    parameters are no input (`Frontend.call_signature`), or ``None`` for a function."""
    from .frontends import call_signature as ask

    return ask(target)


def unwrap_target(target: Any, args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...], Frontend] | None:
    """``(function, arguments, frontend)`` for a model object holding its own
    variables (a Hugging Face Flax wrapper): a function of ``(variables,
    *args)`` and the arguments it takes (`Frontend.unwrap`); else ``None``."""
    from .frontends import unwrap

    return unwrap(target, args)
