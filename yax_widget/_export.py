"""Saving the explorer's current model to run without yax: the function as
`jax.export` serialises it, the parameters as arrays named by their tree
paths, and beside them a README and a manifest saying how to call it.

The exported function takes the parameters as a flat list (so that any
model's variables, nnx states included, serialise without registering their
classes) and then the inputs the way the explorer was given them: positional
ones in their places, keyword ones as keywords with the user's names. It
returns the output's leaves (Hugging Face output classes do not serialise).
Keeping keyword inputs keywords is what makes a mix-up impossible: a
T5 opened with ``input_ids=ids, decoder_input_ids=dec`` takes both by name,
where a flat list would take them in the alphabetical order `jax.tree_util`
flattens a dict in, and ``(ids, dec)`` would silently give other logits.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import keyword
import os
import pathlib
import re
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

import yax
from yax.errors import WrongType
from yax.internal import call_signature, check_target, staged, type_str

if TYPE_CHECKING:
    from ._session import Session

# Names the generated snippet uses itself; an input named so is renamed in the snippet only.
_SNIPPET_NAMES = {"jax", "np", "exported", "npz", "params", "param", "outputs"}


@dataclasses.dataclass(frozen=True)
class _Input:
    """One argument the explorer's model was called with, after the parameters."""

    name: str  #: the keyword as the user wrote it, or the parameter a positional input fills
    keyword: bool
    leaves: tuple[int, ...]  #: its leaves' indices among the leaves of ``(args, kwargs)``
    traced: tuple[int, ...]  #: those the MoX traced (the others are fixed in the export)
    paths: tuple[str, ...]  #: each leaf's key path inside the input (``""`` for an array)
    whole: bool  #: passed as given (an array, or a tuple/list/dict of them); else a list of its traced leaves
    value: Any = dataclasses.field(repr=False, default=None)  #: the example's value

    @property
    def fixed(self) -> bool:
        return not self.traced


def input_names(given: Any, n: int, has_params: bool) -> tuple[str, ...]:
    """Names for the ``n`` positional inputs after the parameters: the
    parameters of the model's own call they fill (``x`` of ``MLP.__call__(self,
    x)``, ``input_ids`` of a Hugging Face model), else ``input1``, ``input2``...

    Example:
      >>> input_names(lambda params, ids, mask: None, 2, True)
      ('ids', 'mask')
    """
    fn: Any = given
    skip = 1 if has_params else 0  # a function of (params, *inputs), or of the inputs
    if isinstance(given, yax.Mox):
        fn = None
    elif (found := call_signature(given)) is not None:  # a model object: its frontend says what names the inputs
        fn, skip = found
    names: list[str] = []
    try:
        params = list(inspect.signature(fn).parameters.values()) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    for k in range(n):
        name = positional[k] if k < len(positional) else f"input{k + 1}"
        names.append(name if name not in names else f"input{k + 1}")
    return tuple(names)


def export(ex: Session, stem: str | pathlib.Path, overwrite: bool = False) -> dict:
    """Write ``{stem}.jax_exported``, (when the model has parameters)
    ``{stem}.params.npz``, ``{stem}.README.md`` and ``{stem}.manifest.json``;
    returns ``{"files": [paths], "bytes": [sizes]}`` in that order.

    The exported function is called ``exported.call(*params, *positional,
    **keywords)``: the parameter leaves in the ``.npz``'s order (each named by
    `jax.tree_util.keystr` of its path), then the inputs as the explorer was
    given them, with the same names and of the example's shapes. Inputs that
    are Python values (``deterministic=True``) are fixed in the export. The
    README says the exact call; the manifest says the same for programs.
    Existing files are refused, naming them, unless ``overwrite``. bfloat16 and float8
    parameters, which NumPy has no dtype for, are stored as their bits (``name#bfloat16``,
    unsigned integers of their width) and the README's snippet views them as what they are.

    The files are written beside their paths and renamed when all four are whole: a failure
    (a full disk) leaves none of them, and the paths are free for a retry.
    """
    if ex.abstract:
        raise yax.errors.AbstractParams("export")
    if not isinstance(stem, (str, os.PathLike)):
        raise WrongType("stem", "the stem of the export's files' names", stem, "Try `ex.export('my_model')`.",
                        show=True)
    stem = pathlib.Path(stem)
    if not re.fullmatch(r"[\w.\-]+", stem.name):
        raise yax.YaxInputError(f"`export` expected a file name of letters, digits, `_`, `.` and `-` for its "
                                f"files, not {stem.name!r}. Try `ex.export('my_model')`.")
    for p in _paths(stem):  # before the export is computed: a folder that is not there, a name too long
        check_target(str(p), "the export", yax.YaxInputError, replace=True)
    there = taken(stem)
    if there and not overwrite:
        raise yax.YaxInputError(f"`export` would replace {', '.join(map(str, there))}, which exist. Choose another "
                                f"name, or pass `overwrite=True` to replace them.")
    if not (ex.args or ex.kwargs):
        raise yax.YaxInputError("The explorer has no example inputs, so the exported function's argument shapes "
                                "are unknown. Open it with inputs: `Explorer(model, variables, batch)`.")
    mox = ex.mox
    args, kwargs = ex.call_args()
    flat, tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    if tree != mox.in_tree:
        raise yax.YaxInputError("The explorer's example inputs differ in structure from what its model was traced "
                                "with, so no export can take them. Open the explorer again with the model's inputs.")
    example = [x for _, x in flat]
    traced = set(mox.dyn_in)
    params, inputs = _groups(ex, flat, traced)
    f = yax.to_function(mox)
    out_paths: list[str] = []

    def call(*xs: Any, **kw: Any) -> list:
        leaves = list(example)  # the untraced leaves (Python values) stay as they were
        for i, x in zip(params, xs):
            leaves[i] = x
        given = iter(xs[len(params):])
        for g in inputs:
            if not g.fixed:
                _place(g, kw[g.name] if g.keyword else next(given), leaves)
        a, k = jax.tree_util.tree_unflatten(tree, leaves)
        out = jax.tree_util.tree_flatten_with_path(f(*a, **k))[0]
        out_paths[:] = [jax.tree_util.keystr(p) for p, _ in out]
        return [x for _, x in out]

    pos = [_value(g, example) for g in inputs if not g.fixed and not g.keyword]
    kws = {g.name: _value(g, example) for g in inputs if not g.fixed and g.keyword}
    exported = jax.export.export(jax.jit(call))(*[example[i] for i in params], *pos, **kws)

    function, npz, readme, meta = _paths(stem)
    files = [function, npz] if ex.has_params else [function]
    named = [_array(jax.tree_util.keystr(flat[i][0][2:]), example[i]) for i in params]  # the path inside params
    manifest = _manifest(files, named, inputs, example, flat, exported, out_paths)
    program = exported.serialize()
    with staged("the export", yax.YaxInputError, replace=overwrite) as stage:
        with open(stage(str(function)), "wb") as fh:
            fh.write(program)
        if ex.has_params:
            with open(stage(str(npz)), "wb") as fh:
                np.savez(fh, **dict(named))
        with open(stage(str(readme)), "w", encoding="utf-8") as fh:
            fh.write(_readme(stem.name, manifest))
        with open(stage(str(meta)), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=1) + "\n")
    files += [readme, meta]
    return {"files": [str(p) for p in files], "bytes": [p.stat().st_size for p in files]}


def _paths(stem: pathlib.Path) -> list[pathlib.Path]:
    """The function, parameter, README and manifest files of an export to ``stem``."""
    return [stem.with_name(stem.name + s) for s in (".jax_exported", ".params.npz", ".README.md", ".manifest.json")]


def taken(stem: pathlib.Path) -> list[pathlib.Path]:
    """The files an export to ``stem`` would write that exist already."""
    return [p for p in _paths(stem) if p.exists()]


def export_next(ex: Session) -> dict:
    """`export` to ``yax_model_step{K}`` (K: the current step) in the working directory, with
    ``_2``, ``_3``… added when files of that name exist (none is replaced): the Export button."""
    stem, k = f"yax_model_step{ex.index}", 2
    while taken(pathlib.Path(stem)):
        stem, k = f"yax_model_step{ex.index}_{k}", k + 1
    return export(ex, stem)


def _groups(ex: Session, flat: list, traced: set[int]) -> tuple[list[int], list[_Input]]:
    """The traced parameter leaves' indices, and the inputs in the user's order:
    positional ones first (as Python requires), then the keywords as given."""
    by: dict[tuple, list[int]] = {}
    for i, (path, _) in enumerate(flat):
        by.setdefault((path[0].idx, _key(path[1])), []).append(i)
    first = 1 if ex.has_params else 0
    params = [i for i in by.get((0, 0), []) if i in traced] if first else []
    names = ex.input_names
    used = set(ex.kwargs)
    inputs = []
    for k in range(first, len(ex.args)):
        name = names[k - first]
        if name in used:  # a keyword of the same name was given too: the positional one is renamed
            name = f"input{k - first + 1}"
        used.add(name)
        inputs.append(_input(name, False, by.get((0, k), []), flat, traced, ex.args[k]))
    inputs += [_input(name, True, by.get((1, name), []), flat, traced, v) for name, v in ex.kwargs.items()]
    return params, inputs


def _key(k: Any) -> Any:
    return k.idx if hasattr(k, "idx") else k.key


def _input(name: str, keyword: bool, leaves: list[int], flat: list, traced: set[int], value: Any) -> _Input:
    mine = tuple(i for i in leaves if i in traced)
    paths = tuple(jax.tree_util.keystr(flat[i][0][2:]) for i in leaves)
    whole = mine == tuple(leaves) and _plain(jax.tree_util.tree_structure(value))
    return _Input(name, keyword, tuple(leaves), mine, paths, whole, value)


def _plain(tree: Any) -> bool:
    """Whether a pytree's containers serialise with `jax.export`: tuples, lists,
    ``None`` and dicts with string keys (no registered class)."""
    data = tree.node_data()
    if data is None:  # a leaf
        return True
    kind, keys = data
    if kind not in (tuple, list, dict, type(None)) or (kind is dict and not all(isinstance(k, str) for k in keys)):
        return False
    return all(_plain(c) for c in tree.children())


def _value(g: _Input, example: list) -> Any:
    """The input as the exported function takes it (the example's values)."""
    return g.value if g.whole else [example[i] for i in g.traced]


def _place(g: _Input, value: Any, leaves: list) -> None:
    """Put the input's traced leaves, as the exported function got them, in ``leaves``."""
    got = [value] if g.paths == ("",) else (jax.tree_util.tree_leaves(value) if g.whole else list(value))
    for i, x in zip(g.traced, got):
        leaves[i] = x


def _spec(x: Any) -> dict:
    shape, dtype = tuple(np.shape(x)), getattr(x, "dtype", None) or np.asarray(x).dtype
    s = jax.ShapeDtypeStruct(shape, dtype)
    return {"type": type_str(s), "shape": list(shape), "dtype": str(np.dtype(dtype)) if not
            jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) else str(dtype)}


def _manifest(files: list[pathlib.Path], named: list[tuple[str, Any]], inputs: list[_Input], example: list,
              flat: list, exported: Any, out_paths: list[str]) -> dict:
    ins = []
    for g in inputs:
        if g.fixed:
            continue
        entry: dict[str, Any] = {"name": g.name, "variable": _var(g.name),  # the README snippet's variable
                                 "passed": "keyword" if g.keyword else "positional"}
        if g.paths == ("",):
            entry.update(_spec(example[g.leaves[0]]))
        else:
            entry["as"] = "pytree" if g.whole else "list"
            entry["leaves"] = [{"path": p, **_spec(example[i])} for i, p in zip(g.leaves, g.paths)
                               if g.whole or i in g.traced]
        ins.append(entry)
    fixed = [{"name": g.name, "passed": "keyword" if g.keyword else "positional",
              "value": _short(g.value)}
             for g in inputs if g.fixed]
    outs = [{"path": p, **_spec(a)} for p, a in zip(out_paths, exported.out_avals)]
    return {
        "format": "yax-export/1",
        "function": files[0].name,
        "params": files[1].name if len(files) > 1 else None,
        "params_count": len(named),
        "params_key_data": [n for n, _ in named if n.endswith("#key_data")],
        "params_bits": {n: dtype for n, _ in named if (dtype := _bits_of(n))},
        "inputs": ins,
        "fixed": fixed,
        "outputs": outs,
        "call": _call_line(ins, bool(named)),
    }


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _var(name: str) -> str:
    """The snippet's variable for an input: its name, unless the snippet uses that name
    itself or it is no Python identifier (a keyword given as ``**{"a b": x}``)."""
    if name.isidentifier() and not keyword.iskeyword(name) and name not in _SNIPPET_NAMES:
        return name
    var = re.sub(r"\W", "_", name)
    return ("_" + var if not var[:1].isalpha() else var) + "_"


def _call_line(ins: list[dict], has_params: bool) -> str:
    def arg(i: dict) -> str:  # an input holding a class `jax.export` cannot serialise: the list of its arrays
        v = _var(i["name"])
        return f"[{', '.join(v + x['path'] for x in i['leaves'])}]" if i.get("as") == "list" else v

    parts = (["*params"] if has_params else []) + [arg(i) for i in ins if i["passed"] == "positional"]
    for i in ins:
        if i["passed"] == "keyword":
            parts.append(f"{i['name']}={arg(i)}" if i["name"].isidentifier() and not keyword.iskeyword(i["name"])
                         else f"**{{{i['name']!r}: {arg(i)}}}")
    return f"outputs = exported.call({', '.join(parts)})"


def _readme(stem: str, m: dict) -> str:
    """The README beside the files: the exact call, the inputs in the user's order, the outputs."""
    lines = [f"# `{stem}`: a model exported by the yax explorer", "",
             f"`{m['function']}` is the model as `jax.export` serialised it"
             + (f"; `{m['params']}` holds its {m['params_count']} parameter arrays, in the order the "
                "function takes them." if m["params"] else "."),
             "It runs with JAX and NumPy alone. From the folder holding these files, with the inputs below bound "
             "to the names shown:", "", "```python", "import jax", "import numpy as np", "",
             f"with open({m['function']!r}, 'rb') as fh:", "    exported = jax.export.deserialize(fh.read())"]
    if m["params"]:
        lines.append(f"npz = np.load({m['params']!r})")
        if m["params_bits"]:
            lines += _param_function(m)
        elif m["params_key_data"]:
            lines.append("params = [jax.random.wrap_key_data(npz[k]) if k.endswith('#key_data') else npz[k] "
                         "for k in npz.files]  # PRNG keys are stored as their key data")
        else:
            lines.append("params = [npz[k] for k in npz.files]")
    lines += [m["call"], "```", "", "## Inputs", "",
              "In the order the model was called with them. Keyword inputs are keywords of `exported.call`, "
              "with the same names; positional ones come after the parameters in this order. The shapes and "
              "dtypes are fixed: the ones listed.", "",
              "| # | name | passed as | type |", "|---|---|---|---|"]
    for k, i in enumerate(m["inputs"], 1):
        how = f"keyword `{i['name']}=`" if i["passed"] == "keyword" else "positional"
        if "leaves" not in i:
            lines.append(f"| {k} | `{_var(i['name'])}` | {how} | `{i['type']}` |")
            continue
        what = ("the same tuple/list/dict of arrays" if i["as"] == "pytree"
                else "the list of these arrays, in this order (as the call above writes it)")
        lines.append(f"| {k} | `{_var(i['name'])}` | {how}: {what} | |")
        lines += [f"|  | `{_var(i['name'])}{x['path']}` | | `{x['type']}` |" for x in i["leaves"]]
    if m["fixed"]:
        lines += ["", "Fixed when the model was exported (Python values, not inputs of the function): "
                  + ", ".join(f"`{f['name']}` = `{f['value']}`" for f in m["fixed"]) + "."]
    lines += ["", "## Outputs", "", "`outputs` is a list of arrays, the leaves of what the model returns:", "",
              "| index | leaf of the model's output | type |", "|---|---|---|"]
    lines += [f"| `outputs[{k}]` | `{o['path'] or '(the output itself)'}` | `{o['type']}` |"
              for k, o in enumerate(m["outputs"])]
    lines += ["", f"`{stem}.manifest.json` says the same for programs.", ""]
    return "\n".join(lines)


def _param_function(m: dict) -> list[str]:
    """The snippet's lines that load the parameters when some are stored as their bits."""
    dtypes = sorted(set(m["params_bits"].values()))
    lines = ["", f"def param(k):  # NumPy has no {', '.join(dtypes)}: such arrays are stored as their bits",
             "    a = npz[k]"]
    if m["params_key_data"]:
        lines += ["    if k.endswith('#key_data'):  # PRNG keys are stored as their key data",
                  "        return jax.random.wrap_key_data(a)"]
    for dtype in dtypes:
        lines += [f"    if k.endswith('#{dtype}'):", f"        return a.view(jax.numpy.{dtype})"]
    return lines + ["    return a", "", "", "params = [param(k) for k in npz.files]"]


def _bits_of(name: str) -> str | None:
    """The dtype a parameter named ``name`` in the ``.npz`` is the bits of (``bfloat16``), if any.
    A name ends in ``]`` or an attribute name, so a ``#dtype`` after it is the export's own."""
    dtype = name.rpartition("#")[2] if "#" in name else ""
    return dtype if dtype != "key_data" and _is_bits(dtype) else None


def _is_bits(dtype: str) -> bool:
    """Whether ``dtype`` (a name) is one JAX has and NumPy does not: stored as its bits (``|V2`` otherwise)."""
    found = getattr(jax.numpy, dtype, None) if dtype.isidentifier() else None
    return isinstance(found, type) and np.dtype(found).kind == "V"


def _array(name: str, v: Any) -> tuple[str, np.ndarray]:
    """A leaf as a numpy array: a typed PRNG key as its key data, a bfloat16 or float8 array as
    its bits (unsigned integers of its width: NumPy's `.npz` would keep them as void ``|V2``,
    which JAX refuses), its name saying so."""
    if isinstance(v, jax.Array) and jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
        return f"{name}#key_data", np.asarray(jax.random.key_data(v))
    a = np.asarray(v)
    if _is_bits(a.dtype.name):
        return f"{name}#{a.dtype.name}", a.view(np.dtype(f"u{a.dtype.itemsize}"))
    return name, a
