"""`Reference`: a recorded run of another implementation of a model (the PyTorch
original of a port, another codebase, last month's version), and how its names
and layouts are matched with a MoX's calls. `compare` measures the two
(`yax._compare.compare_reference`); this module knows names, files and shapes only."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import BadArgument, CannotCompare, MissingDependency, WrongType, YaxInputError

_META = "yax_reference"
_VERSION = 1


def _array(x: Any) -> np.ndarray:
    """A host copy of one array: NumPy, JAX, or a PyTorch tensor (bfloat16 exactly, as ml_dtypes' bfloat16)."""
    if type(x).__module__.startswith("torch"):
        import ml_dtypes
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return np.asarray(t.float().numpy().astype(ml_dtypes.bfloat16))
        return np.asarray(t.numpy().copy())
    return np.asarray(x)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def arrays_of(value: Any) -> tuple[np.ndarray, ...]:
    """The arrays in ``value``, in order: an array, or tuples, lists, mappings (and
    ``ModelOutput``-like objects) of them. Anything else (``None``, a cache object) holds none."""
    if _is_array(value):
        return (_array(value),)
    if isinstance(value, Mapping):
        return tuple(a for v in value.values() for a in arrays_of(v))
    if isinstance(value, (tuple, list)):
        return tuple(a for v in value for a in arrays_of(v))
    return ()


class Reference:
    """A recorded run of another implementation: the outputs (and, optionally,
    the inputs) of every module, in the order they finished, keyed by that
    implementation's own names, and optionally its weights.

    Compare a MoX with it as with another MoX: ``yax.compare(reference, mox,
    params, *inputs)`` (either order; the reference is always the original in
    the statistics). Names are matched automatically where the two follow the
    same layout (``h.0.attn`` and ``GPT/h/0/attn``), or by the mapping you pass.

    Args:
      outputs: module name -> what it returned (an array, or a tuple, list or
        dict of arrays). A module called more than once: ``name``, ``name#2``,
        … in call order, as `yax.capture` names calls. ``""`` names the whole model.
      inputs: module name -> its inputs, likewise (optional).
      weights: parameter name -> array (``"h.0.attn.c_attn.weight"``; optional).
      source: what was recorded, for reports.

    Example:
      >>> import numpy as np, yax
      >>> ref = yax.Reference({"fc1": np.ones((2, 3)), "": np.zeros((2, 1))}, source="by hand")
      >>> ref
      Reference(by hand: 2 modules, 0 weights)
      >>> ref.outputs["fc1"][0].shape
      (2, 3)
    """

    __slots__ = ("outputs", "inputs", "weights", "source")
    outputs: dict[str, tuple[np.ndarray, ...]]
    inputs: dict[str, tuple[np.ndarray, ...]]
    weights: dict[str, np.ndarray]
    source: str

    def __init__(self, outputs: Mapping[str, Any], inputs: Mapping[str, Any] | None = None,
                 weights: Mapping[str, Any] | None = None, source: str = "") -> None:
        if not isinstance(outputs, Mapping):
            raise WrongType("outputs", "a mapping of module names to their outputs", outputs)
        object.__setattr__(self, "outputs", {str(k): arrays_of(v) for k, v in outputs.items()})
        object.__setattr__(self, "inputs", {str(k): arrays_of(v) for k, v in (inputs or {}).items()})
        object.__setattr__(self, "weights", {str(k): _array(v) for k, v in (weights or {}).items()})
        object.__setattr__(self, "source", str(source))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("A `Reference` is read-only: build a new one.")

    def __repr__(self) -> str:
        return (f"Reference({self.source or 'recorded'}: {len(self.outputs)} modules, "
                f"{len(self.weights)} weights)")

    # -- recording ------------------------------------------------------------------------

    @classmethod
    def from_torch(cls, module: Any, *args: Any, with_inputs: bool = False, weights: bool = True,
                   **kwargs: Any) -> Reference:
        """Run a ``torch.nn.Module`` once (``module(*args, **kwargs)`` under
        ``torch.no_grad()``) and record what each of its modules returned, with
        forward hooks (removed afterwards, also when the run fails).

        Names are PyTorch's (``named_modules``: ``transformer.h.0.attn``; ``""`` is
        the module itself). With ``with_inputs``, each module's positional inputs too;
        with ``weights`` (default), the ``state_dict``. PyTorch is imported here
        only: yax does not need it otherwise.
        """
        try:
            import torch
        except ImportError as e:  # pragma: no cover - torch is in the dev extras
            raise MissingDependency("`Reference.from_torch`", "PyTorch", "`pip install torch`") from e
        if not isinstance(module, torch.nn.Module):
            raise WrongType("module", "a `torch.nn.Module`", module, "Record other code with `Reference(outputs)`.")
        outs: dict[str, Any] = {}
        ins: dict[str, Any] = {}
        seen: dict[str, int] = {}

        def hook(name: str) -> Callable[..., None]:
            def record(mod: Any, inputs: Any, output: Any) -> None:
                seen[name] = seen.get(name, 0) + 1
                key = name if seen[name] == 1 else f"{name}#{seen[name]}"
                outs[key] = arrays_of(output)
                if with_inputs:
                    ins[key] = arrays_of(inputs)
            return record

        handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules()]
        try:
            with torch.no_grad():
                module(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
        return cls(outs, ins, module.state_dict() if weights else {}, source=f"torch {type(module).__name__}")

    # -- files ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the reference to ``path``: ``.safetensors`` or ``.npz`` (by the suffix).
        bfloat16 arrays are kept exactly (as their bits, with their dtype in the file's metadata)."""
        path = pathlib.Path(path)
        tensors: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        meta: dict[str, Any] = {"version": _VERSION, "source": self.source, "outputs": [], "inputs": [],
                                "weights": list(self.weights)}
        for part, table in (("outputs", self.outputs), ("inputs", self.inputs)):
            for i, (name, arrays) in enumerate(table.items()):
                meta[part].append([name, len(arrays)])
                for j, a in enumerate(arrays):
                    tensors[f"{part}/{i}/{j}"] = a
        for i, a in enumerate(self.weights.values()):
            tensors[f"weights/{i}"] = a
        for k, a in list(tensors.items()):
            if a.dtype.name == "bfloat16":
                dtypes[k] = "bfloat16"
                tensors[k] = a.view(np.uint16)
            tensors[k] = np.ascontiguousarray(tensors[k])
        meta["dtypes"] = dtypes
        if path.suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file(tensors, str(path), metadata={_META: json.dumps(meta)})
        elif path.suffix == ".npz":
            files: dict[str, Any] = {**tensors, _META: np.array(json.dumps(meta))}
            np.savez(path, **files)
        else:
            raise BadArgument("path", "a `.safetensors` or `.npz` file", str(path), "The path `Reference.save` writes")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Reference:
        """Read a reference written by `save`, or any ``.safetensors`` / ``.npz``
        file of arrays keyed by module name (each the output of that module)."""
        path = pathlib.Path(path)
        if not path.exists():
            raise YaxInputError(f"`Reference.load` found no file at `{path}`.")
        meta: dict[str, Any] | None
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as f:
                text = (f.metadata() or {}).get(_META)
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as f:
                tensors = {k: f[k] for k in f.files}
            text = str(tensors.pop(_META)) if _META in tensors else None
        else:
            raise YaxInputError(f"`Reference.load` reads `.safetensors` or `.npz` files, but the path `{path}` "
                                f"ends in `{path.suffix}`.")
        if text is None:  # a plain file of arrays: each key a module, each array its output
            return cls(dict(tensors), source=path.name)
        meta = json.loads(text)
        if meta.get("version") != _VERSION:
            raise YaxInputError(f"`{path}` holds a reference of version {meta.get('version')}; this yax reads "
                                f"version {_VERSION}.")
        import ml_dtypes

        for k, dt in meta["dtypes"].items():
            if dt == "bfloat16":
                tensors[k] = tensors[k].view(ml_dtypes.bfloat16)
        parts = {part: {name: tuple(tensors[f"{part}/{i}/{j}"] for j in range(n))
                        for i, (name, n) in enumerate(meta[part])} for part in ("outputs", "inputs")}
        weights = {name: tensors[f"weights/{i}"] for i, name in enumerate(meta["weights"])}
        return cls(parts["outputs"], parts["inputs"], weights, meta.get("source", path.name))


# -- names ---------------------------------------------------------------------------------

def _split(name: str) -> tuple[tuple[str, ...], int]:
    """``"transformer.h.0.attn#2"`` / ``"GPT/transformer/h/0/attn#2"`` -> (lower-case parts, occurrence)."""
    base, _, n = name.partition("#")
    parts = tuple(p.lower() for p in re.split(r"[./]", base) if p)
    return parts, int(n) if n.isdigit() else 1


def _normal(names: Iterable[str], strip: int) -> dict[tuple[Any, ...], str]:
    """Each name without its first ``strip`` parts -> the name; names that would
    coincide (or are shorter than ``strip``) are left out."""
    out: dict[tuple[Any, ...], str] = {}
    clash: set[tuple[Any, ...]] = set()
    for name in names:
        parts, n = _split(name)
        if len(parts) < strip:
            continue
        k = (parts[strip:], n)
        if k in out:
            clash.add(k)
        out[k] = name
    return {k: v for k, v in out.items() if k not in clash}


#: A user's renaming of the reference's names (`match`): reference name -> model key or name in
#: the model's layout (a dict or a function; ``None``: unchanged), or ``(pattern, replacement)``
#: pairs applied in turn with `re.sub`.
Names = Mapping[str, str] | Sequence[tuple[str, str]] | Callable[[str], str | None] | None


def match(model: Sequence[str], reference: Sequence[str], names: Names = None,
          steps: Mapping[str, int] | None = None) -> dict[str, tuple[str, ...]]:
    """model key -> the reference module names it is compared with: one name, or for a call
    inside a scan of ``steps[key]`` steps one name per step (all of them, in step order).

    ``names`` renames the reference's modules first: a dict or a function gives a name for
    some of them, ``(pattern, replacement)`` pairs are applied in turn with `re.sub`. A
    name that is a model key (``key@step`` for one step of a scanned call) pairs with it;
    the others are matched automatically, where the names are the same once separators
    (``.`` and ``/``), case and a wrapper's prefix of up to three parts on either side are
    set aside (the prefixes that match the most names win). A scanned call's steps are the
    reference's modules whose names hold one index more (``layers.0.attn`` …
    ``layers.L-1.attn`` for ``Model/layers/attn``)."""
    steps = dict(steps or {})
    keys = set(model)
    renamed = {r: _renamed(names, r) for r in reference}
    single: dict[str, str] = {}
    stepped: dict[str, dict[int, str]] = {}
    for r, n in renamed.items():
        base, at, step = n.rpartition("@")
        if n in keys:
            single[n] = r
        elif at and base in steps and step.isdigit():
            stepped.setdefault(base, {})[int(step)] = r
    taken = set(single.values()) | {r for d in stepped.values() for r in d.values()}
    rest_m = [k for k in model if k not in single and k not in stepped and k not in steps]
    rest_r = [r for r in reference if r not in taken]
    single.update(_best(rest_m, rest_r, lambda r: [(renamed[r], None)]))
    scanned = [k for k in model if k in steps and k not in stepped]
    found = _best(scanned, [r for r in rest_r if r not in single.values()], lambda r: _unindexed(renamed[r]))
    for k, named in found.items():
        stepped.setdefault(k, {}).update(named)
    out: dict[str, tuple[str, ...]] = {k: (r,) for k, r in single.items()}
    for k, by_step in stepped.items():
        if sorted(by_step) == list(range(steps.get(k, 0))):
            out[k] = tuple(by_step[i] for i in range(steps[k]))
    if isinstance(names, Mapping) or callable(names):
        used = {r for refs in out.values() for r in refs}
        lost = [(r, n) for r, n in renamed.items() if n != r and r not in used]
        if lost:
            r, n = lost[0]
            close = difflib.get_close_matches(n, list(model), 3)
            raise CannotCompare(
                "compare", "unmatched",
                f"The mapping of names sends the reference's `{r}` to `{n}`, which matches no call of the model"
                + (f"; the closest keys are {', '.join(f'`{c}`' for c in close)}" if close else "")
                + ". Give a key as `yax.capture` names calls (`Model/block/0/attn`, `…#2` for a second call, "
                  "`Model/layers/attn@3` for step 3 of a call inside a scan), or a name in the model's layout.", (r, n))
    order = {k: i for i, k in enumerate(model)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def _renamed(names: Names, r: str) -> str:
    """The reference's name ``r`` as the user's mapping renames it (itself where it does not)."""
    if names is None:
        return r
    if isinstance(names, Mapping):
        return str(names.get(r, r))
    if callable(names):
        got = names(r)
        return r if got is None else str(got)
    if isinstance(names, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in names):
        for pattern, repl in names:
            r = re.sub(pattern, repl, r)
        return r
    raise WrongType("names", "a dict of reference names to model keys, a list of (pattern, replacement) pairs, "
                    "or a function of a reference name", names)


def _unindexed(r: str) -> list[tuple[str, int | None]]:
    """``layers.3.attn`` -> ``[("layers.attn", 3)]``: the name without one index part, for each index part."""
    parts = r.split("#")[0].replace("/", ".").split(".")
    return [(".".join(parts[:i] + parts[i + 1:]), int(p)) for i, p in enumerate(parts) if p.isdigit()]


def _best(model: Sequence[str], reference: Sequence[str],
          forms: Callable[[str], list[tuple[str, int | None]]]) -> dict[str, Any]:
    """The automatic matching (`match`) of names whose reference side is read as ``forms``:
    ``(name, None)`` pairs a key with one name, ``(name, step)`` with one step of it."""
    best: dict[str, Any] = {}
    read = [(r, f, step) for r in reference for f, step in forms(r)]
    for i in range(4):
        nm = _normal(model, i)
        for j in range(4):
            by: dict[tuple[Any, ...], list[tuple[str, int | None]]] = {}
            for r, f, step in read:
                parts, n = _split(f)
                if len(parts) >= j:
                    by.setdefault((parts[j:], n), []).append((r, step))
            got: dict[str, Any] = {}
            for key in nm.keys() & by.keys():
                hits = by[key]
                if all(step is None for _, step in hits):
                    if len(hits) == 1:
                        got[nm[key]] = hits[0][0]
                else:
                    got[nm[key]] = {step: r for r, step in hits}
            if len(got) > len(best):
                best = got
    return best


# -- layouts -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """How a reference's array is laid out against the model's: the model's
    array is the reference's ``transpose(axes)``; ``name`` says it in words."""

    axes: tuple[int, ...]
    name: str
    broadcast: bool = False  #: the reference's array broadcast to the model's shape (after ``axes``)

    def read(self, ref: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The reference's array laid out as the model's of ``shape``."""
        x = np.transpose(ref, self.axes)
        return np.broadcast_to(x, shape) if self.broadcast else x


_CHANNELS_LAST = {3: "NCL ↔ NLC", 4: "NCHW ↔ NHWC", 5: "NCDHW ↔ NDHWC"}
_WEIGHTS = {2: "(out, in) ↔ (in, out)", 3: "(out, in, W) ↔ (W, in, out)", 4: "(out, in, H, W) ↔ (H, W, in, out)",
            5: "(out, in, D, H, W) ↔ (D, H, W, in, out)"}


def layouts(ndim: int, weight: bool) -> list[Layout]:
    """The known permutations from a reference's layout to a model's, for an
    array of ``ndim`` axes: channels first to channels last for activations,
    PyTorch's (out, in, *window) to Flax's (*window, in, out) for weights."""
    if weight:
        if ndim in _WEIGHTS:
            return [Layout((*range(2, ndim), 1, 0), _WEIGHTS[ndim])]
        return []
    if ndim in _CHANNELS_LAST:
        return [Layout((0, *range(2, ndim), 1), _CHANNELS_LAST[ndim])]
    return []


def fits(model_shape: tuple[int, ...], ref: np.ndarray, weight: bool) -> list[Layout | None]:
    """The ways a reference's array can be read as a model array of ``model_shape``:
    as it is (``None``), in a known layout (`layouts`), or broadcast along axes of length 1."""
    shape = tuple(np.shape(ref))
    out: list[Layout | None] = [None] if shape == tuple(model_shape) else []
    out += [lay for lay in layouts(len(shape), weight) if tuple(shape[a] for a in lay.axes) == tuple(model_shape)]
    if not out and not weight and len(shape) == len(model_shape) and all(
            r in (1, m) for r, m in zip(shape, model_shape)):
        axes = [i for i, (r, m) in enumerate(zip(shape, model_shape)) if r != m]
        out.append(Layout(tuple(range(len(shape))), f"broadcast along axes {tuple(axes)}", broadcast=True))
    return out


def pair(model: Sequence[Any], reference: Sequence[np.ndarray], weight: bool = False
         ) -> list[tuple[int, int, list[Layout | None]]]:
    """Pairs ``(model index, reference index, ways)`` in order: each model array with
    the next reference array that `fits` it, and every way it fits (as it is first)."""
    out = []
    j = 0
    for i, m in enumerate(model):
        for jj in range(j, len(reference)):
            ways = fits(tuple(m.shape), reference[jj], weight)
            if ways:
                out.append((i, jj, ways))
                j = jj + 1
                break
    return out


#: Parameter leaf names of PyTorch -> those Flax gives the same tensor.
_LEAVES = {"weight": ("kernel", "scale", "embedding", "weight", "w"), "bias": ("bias", "b"),
           "running_mean": ("mean",), "running_var": ("var",)}


def weight_names(model: Sequence[str], reference: Sequence[str], names: Names = None) -> dict[str, str]:
    """model parameter path (``params/h/0/attn/c_attn/kernel``) -> reference weight name
    (``transformer.h.0.attn.c_attn.weight``): the module parts (renamed by ``names``, as
    `match` renames modules) matched as `match` matches calls, the leaf by `_LEAVES`."""
    def module(p: str) -> str:
        return p.replace("/", ".").rsplit(".", 1)[0] if ("." in p or "/" in p) else ""

    def leaf(p: str) -> str:
        return re.split(r"[./]", p)[-1]

    as_named = {r: _renamed(names, module(r)) for r in reference}
    # matched per collection (``params/…`` and ``batch_stats/…`` name the same modules), then together
    refs = list(dict.fromkeys(as_named.values()))
    mine = list(dict.fromkeys(module(p) for p in model))
    mods = {k: v[0] for k, v in match(mine, refs).items()}
    for top in dict.fromkeys(re.split(r"[./]", m)[0] for m in mine):
        group = [m for m in mine if re.split(r"[./]", m)[0] == top]
        mods.update({k: v[0] for k, v in match(group, refs).items()})
    out: dict[str, str] = {}
    by_module: dict[str, list[str]] = {}
    for r in reference:
        by_module.setdefault(as_named[r], []).append(r)
    for p in model:
        for r in by_module.get(mods.get(module(p), "\0"), []):
            if leaf(p).lower() in _LEAVES.get(leaf(r), (leaf(r).lower(),)) and r not in out.values():
                out[p] = r
                break
    return out
