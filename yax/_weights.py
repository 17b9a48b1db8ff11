"""Save a model's weights to a file and load them back: `save_weights` and `load_weights`.

The file is a `safetensors <https://github.com/huggingface/safetensors>`_ file (it needs the
``safetensors`` package). Each array is stored under its path in the pytree, the keys joined with
``/``:

- linen variables ``{"params": {"Dense_0": {"kernel": ...}}}``: ``params/Dense_0/kernel``;
- a Hugging Face Flax model's bare parameter dict: ``transformer/h/0/attn/c_attn/kernel``;
- an ``nnx.State`` (from ``nnx.state(model)`` or ``nnx.split(model)``): the attribute path,
  ``layers/0/kernel``, without the ``.value`` of the nnx ``Variable`` holding the array.

A MoX names modules by the same paths (a node's ``scope``, after the collection for linen), so the
weights of the module at ``Model/Block_0/Dense_0`` are the keys that begin with
``params/Block_0/Dense_0/``. JAX PRNG key arrays (an nnx ``RngKey``) cannot be stored as they are:
the file holds their `jax.random.key_data`, its metadata records which keys are key arrays and their
implementation, and `load_weights` rebuilds them. The metadata also says ``"format": "yax.weights"``
and ``"version": "1"``.

`save_weights` gathers every array to the host and writes one file: it is made for a model's weights
(keeping a LoRA rewrite's adapters, handing weights to another program). For checkpoints of sharded
training (arrays larger than one host's memory, asynchronous saves, optimizer state, restarts), Orbax
(``orbax-checkpoint``) stays the tool to use.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._files import check_target, fspath, open_regular, read_into, staged
from ._vocab import key_name, type_str
from .errors import (
    BadWeightsFile,
    CannotSaveLeaves,
    MissingDependency,
    WeightsDoNotFit,
    YaxInputError,
    _count,
)

FORMAT, VERSION = "yax.weights", "1"
_KEY_ARRAYS = "key_arrays"  # the metadata entry: JSON ``{key: implementation name}`` of the key arrays

# The dtypes safetensors stores, by NumPy name and safetensors code.
_CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
          "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "bfloat16": "BF16",
          "float32": "F32", "float64": "F64", "complex64": "C64", "float8_e4m3fn": "F8_E4M3",
          "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
          "float8_e8m0fnu": "F8_E8M0"}
_DTYPES = {code: np.dtype(getattr(ml_dtypes, name, None) or name) for name, code in _CODES.items()}
_RESERVED = "__metadata__"  # the header's entry for the metadata: no array can have this key


def _safetensors() -> Any:
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise MissingDependency("`save_weights` and `load_weights`", "the `safetensors` package",
                                "`pip install safetensors`") from None
    return safetensors


def key_of(keypath: tuple[Any, ...]) -> str:
    """The file key of a leaf: its path's keys joined with ``/``, without the ``.value`` that an
    nnx ``Variable`` adds at the end (``['layers'][0]['kernel'].value`` -> ``layers/0/kernel``)."""
    keys = list(keypath)
    if keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name == "value":
        keys.pop()
    return "/".join(map(key_name, keys))


def _flat(tree: Any, arg: str, saved: bool = False) -> tuple[list[tuple[str, Any]], Any]:
    """``([(key, leaf)], treedef)`` of ``tree`` (the argument ``arg``); refuses two leaves with one key
    and, when the tree is to be ``saved``, a leaf whose key safetensors keeps for the metadata."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    seen: dict[str, Any] = {}
    for kp, _ in with_paths:
        k = key_of(kp)
        if saved and k == _RESERVED:
            raise CannotSaveLeaves(
                arg, "reserved", [k],
                f"The leaf `{arg}{jax.tree_util.keystr(kp)}` would be stored under the key `{_RESERVED}`, which "
                "safetensors reserves for a file's metadata: the file would hold two entries of that name, and no "
                "reader could open it. Nothing was written. Try renaming it (`metadata`), or nesting it under "
                "another key.")
        if k in seen:
            raise CannotSaveLeaves(
                arg, "same key", [f"{arg}{jax.tree_util.keystr(seen[k])}", f"{arg}{jax.tree_util.keystr(kp)}"],
                f"Two leaves of `{arg}`, `{arg}{jax.tree_util.keystr(seen[k])}` and "
                f"`{arg}{jax.tree_util.keystr(kp)}`, have the same key `{k}` (a leaf's key is its path "
                "joined with `/`, so a dict key holding `/` can collide with a nested path). Try renaming "
                "one of them.")
        seen[k] = kp
    return [(key_of(kp), leaf) for kp, leaf in with_paths], treedef


def _is_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _kind(x: Any) -> str:
    return f"a `jax.ShapeDtypeStruct` {type_str(x)}" if isinstance(x, jax.ShapeDtypeStruct) else f"`{type(x).__name__}`"


def save_weights(params: Any, path: str | os.PathLike[str]) -> None:
    """Write the arrays of ``params`` to the safetensors file ``path``, each under its path in the
    tree joined with ``/``.

    ``params`` is any pytree of arrays: linen variables (keys such as ``params/Dense_0/kernel``), a
    Hugging Face Flax model's ``params`` (``transformer/h/0/attn/c_attn/kernel``), an ``nnx.State``
    (``layers/0/kernel``, without the nnx ``Variable``'s ``.value``). These are the paths a MoX
    names modules by (a node's ``scope``, after the collection for linen). Every array is gathered
    to the host (`numpy.asarray`); PRNG key arrays are stored as their key data, with their
    implementation in the file's metadata; bfloat16 and float8 arrays as they are. Load the file
    with `load_weights`.

    Args:
      params: the pytree of arrays to save.
      path: the file to write (replaced if it exists). The file is written beside it under another
        name and renamed when whole, so a failure (a full disk) leaves no part of it, and a file
        that was there as it was. A new file gets the mode ``open`` gives (0666 less the umask); a
        replaced one keeps its own.

    Raises:
      YaxInputError: a leaf is not an array (a Python number or string, an abstract
        `jax.ShapeDtypeStruct`), has a dtype safetensors cannot store, two leaves have the
        same key or one has the key ``__metadata__``; ``path`` is not a path, is a folder or
        named pipe, or is in a folder that does not exist; or writing the file failed.
      YaxDependencyError: ``safetensors`` is not installed.

    Example:
      >>> import os, tempfile, jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> from safetensors import safe_open
      >>> m = nn.Sequential([nn.Dense(3)]); x = jnp.ones((2, 4)); v = m.init(jax.random.key(0), x)
      >>> folder = tempfile.TemporaryDirectory(); path = os.path.join(folder.name, "w.safetensors")
      >>> yax.save_weights(v, path)
      >>> with safe_open(path, "np") as f:
      ...     sorted(f.keys()), f.metadata()["format"]
      (['params/layers_0/bias', 'params/layers_0/kernel'], 'yax.weights')
      >>> folder.cleanup()
    """
    safetensors = _safetensors()
    where = fspath(path, "`save_weights`", '`yax.save_weights(params, "weights.safetensors")`', YaxInputError)
    flat, _ = _flat(params, "params", saved=True)
    odd = [k for k, x in flat if not isinstance(x, (jax.Array, np.ndarray, np.generic))]
    not_arrays = [f"`{k}` ({_kind(x)})" for k, x in flat if k in odd]
    if not_arrays:
        raise CannotSaveLeaves(
            "params", "not arrays", odd,
            f"`save_weights` stores arrays, but {_count(len(not_arrays), 'leaf', 'leaves')} of `params` "
            f"{'is not an array' if len(not_arrays) == 1 else 'are not arrays'}: "
            f"{', '.join(not_arrays)}. Try converting them with `jnp.asarray`, or saving a tree without them.")
    odd = [k for k, x in flat if not _is_key(x) and np.dtype(x.dtype).name not in _CODES]
    unstorable = [f"`{k}` ({type_str(x)})" for k, x in flat if k in odd]
    if unstorable:
        raise CannotSaveLeaves(
            "params", "dtype", odd,
            f"safetensors cannot store the dtype of {_count(len(unstorable), 'leaf', 'leaves')} of `params`: "
            f"{', '.join(unstorable)}. It stores {', '.join(_CODES)}. Try casting them (`x.astype(jnp.float32)`) before saving.")
    check_target(where, "the weights", YaxInputError, replace=True, inside="weights.safetensors")
    tensors, impls = {}, {}
    for k, x in flat:
        if _is_key(x):
            impls[k] = str(jax.random.key_impl(x))
            x = jax.random.key_data(x)
        a = np.asarray(x)  # gathers a jax array to the host
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        # safetensors writes an array's buffer as it lies in memory, whatever its strides
        # (and `np.ascontiguousarray` would make a scalar an array of one)
        tensors[k] = a if a.flags.c_contiguous else a.copy(order="C")
    metadata = {"format": FORMAT, "version": VERSION}
    if impls:
        metadata[_KEY_ARRAYS] = json.dumps(impls, sort_keys=True)
    with staged("the weights", YaxInputError, replace=True) as stage:
        temp = stage(where)
        try:
            safetensors.numpy.save_file(tensors, temp, metadata=metadata)
        except safetensors.SafetensorError as e:  # how safetensors reports a failed write (a full disk)
            raise OSError(0, str(e)) from e


def _found(code: str, shape: tuple[int, ...], impl: str | None) -> Any:
    """The type a file entry loads as (a `jax.ShapeDtypeStruct`), or a string saying why it cannot."""
    if code not in _DTYPES:
        return f"{code}[{','.join(map(str, shape))}] (a safetensors dtype yax does not read)"
    data = jax.ShapeDtypeStruct(shape, _DTYPES[code])
    if impl is None:
        return data
    try:
        return jax.eval_shape(lambda d: jax.random.wrap_key_data(d, impl=impl), data)
    except (TypeError, ValueError, KeyError):  # an unknown implementation, or data of another shape
        return f"{type_str(data)} (marked as the data of `{impl}` keys, which it cannot be)"


def load_weights(path: str | os.PathLike[str], *, like: Any) -> Any:
    """The weights saved with `save_weights` in ``path``, as a pytree of the structure of ``like``.

    Every key of ``like`` must be in the file with the same shape and dtype, and every key in the
    file must be in ``like``. All of this is checked before any array is read, and every problem
    is reported at once. The result has ``like``'s containers (dicts, a ``FrozenDict``, an
    ``nnx.State``) holding jax arrays, placed with ``like``'s leaves' shardings where they have
    one; PRNG key arrays come back as key arrays. Every leaf has ``like``'s dtype and the saved
    bits (NaN payloads, ``-0.0``, subnormals): a 64-bit leaf (``int64``, ``uint64``, ``float64``)
    that JAX cannot hold because x64 is off comes back as the NumPy array it was saved as, on the
    host, rather than narrowed to 32 bits (`jax.enable_x64` makes it a jax array).

    Args:
      path: a safetensors file written by `save_weights` (or any safetensors file whose keys are
        paths joined with ``/``).
      like: a pytree of arrays or `jax.ShapeDtypeStruct` (``jax.eval_shape(model.init, ...)``)
        saying which arrays to expect.

    Returns:
      A new pytree with ``like``'s structure and the file's arrays: jax arrays, or NumPy arrays
      for 64-bit leaves while x64 is off.

    Raises:
      WeightsDoNotFit: (a `YaxInputError`) keys missing from the file, keys the file has and
        ``like`` lacks, or leaves of another shape or dtype; nothing is loaded.
      YaxInputError: ``path`` is no regular file (missing, a folder, a named pipe: refused without
        opening it) or not a safetensors file, its metadata is malformed, or a leaf of ``like`` is
        not an array.
      YaxDependencyError: ``safetensors`` is not installed.

    Example:
      >>> import os, tempfile, jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((2, 4)); v = m.init(jax.random.key(0), x)
      >>> folder = tempfile.TemporaryDirectory(); path = os.path.join(folder.name, "w.safetensors")
      >>> yax.save_weights(v, path)
      >>> like = jax.eval_shape(m.init, jax.random.key(0), x)  # shapes and dtypes only
      >>> loaded = yax.load_weights(path, like=like)
      >>> bool((m.apply(loaded, x) == m.apply(v, x)).all())
      True
      >>> folder.cleanup()
    """
    safetensors = _safetensors()
    where = fspath(path, "`load_weights`", '`yax.load_weights("weights.safetensors", like=params)`', YaxInputError)
    flat, treedef = _flat(like, "like")
    odd = [k for k, x in flat if not isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))]
    not_arrays = [f"`{k}` ({_kind(x)})" for k, x in flat if k in odd]
    if not_arrays:
        raise CannotSaveLeaves(
            "like", "not arrays", odd,
            f"`like` should hold arrays or `jax.ShapeDtypeStruct`s, but {_count(len(not_arrays), 'leaf', 'leaves')} "
            f"of it {'is' if len(not_arrays) == 1 else 'are'} neither: {', '.join(not_arrays)}. Try passing the "
            "parameters of the model the weights were saved from, or `jax.eval_shape` of its `init`.")
    with open_regular(where, "weights", YaxInputError) as fh:  # refuses a named pipe without waiting on it
        try:
            # safetensors checks the header (offsets inside the file, sizes that fit the shapes); the arrays
            # are read from `fh` below, each once, straight into the array that is returned
            with safetensors.safe_open(where, framework="np") as f:
                meta = f.metadata() or {}
                codes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in codes}
        except (safetensors.SafetensorError, OSError) as e:
            raise BadWeightsFile(
                where, "not safetensors", str(e),
                f"`{where}` could not be read as a safetensors file: {e}. Try a file written by `yax.save_weights` "
                "(or another safetensors writer).") from e
        if meta.get("format") == FORMAT and meta.get("version") != VERSION:
            raise BadWeightsFile(
                where, "version", repr(meta.get("version")),
                f"`{where}` holds yax weights of format version {meta.get('version')!r}, but this yax reads "
                f"version {VERSION!r}. Try loading it with the version of yax that saved it.")
        impls = _key_arrays(meta, where, codes)
        found = {k: _found(c, shapes[k], impls.get(k)) for k, c in codes.items()}
        wanted = dict(flat)
        mismatched = []
        for k, x in flat:
            got = found.get(k)
            if got is not None and (isinstance(got, str) or got.shape != x.shape or got.dtype != x.dtype):
                mismatched.append((k, type_str(x), got if isinstance(got, str) else type_str(got)))
        missing = [k for k, _ in flat if k not in found]
        extra = [k for k in found if k not in wanted]
        if missing or extra or mismatched:
            raise WeightsDoNotFit(where, missing, extra, mismatched)
        arrays = _read(fh, where, codes, shapes)
    leaves: list[Any] = []
    for k, x in flat:
        a = arrays[k]
        if k in impls:
            a = jax.random.wrap_key_data(a, impl=impls[k])
        elif not _held(a.dtype):
            # JAX would narrow it (int64 2**40+3 to the int32 3, float64 rounded to float32) after the
            # dtype check passed: the saved values, as NumPy holds them, are what `like` asked for
            leaves.append(a)  # read into an array of its own, no view of anything
            continue
        sharding = getattr(x, "sharding", None)
        leaves.append(jax.device_put(a, sharding) if sharding is not None else jnp.asarray(a))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _key_arrays(meta: dict[str, str], where: str, codes: dict[str, str]) -> dict[str, str]:
    """The metadata's ``{key: implementation name}`` of the file's PRNG key arrays; refuses
    anything else (a hostile file's ``{"w": null}`` would make a uint32 leaf a key)."""
    text = meta.get(_KEY_ARRAYS)
    if text is None:
        return {}

    def refused(found: str) -> YaxInputError:
        return BadWeightsFile(
            where, "key arrays", found,
            f"The metadata of `{where}` lists its PRNG key arrays under `{_KEY_ARRAYS}`, which should be a JSON "
            f"object giving each one's implementation (such as `{{\"rngs/key\": \"threefry2x32\"}}`), but {found}. "
            "Nothing was loaded. Try a file written by `yax.save_weights`: this one was not, or was changed since.")

    try:
        impls = json.loads(text)
    except json.JSONDecodeError as e:
        raise refused(f"it is not JSON ({e.msg} at character {e.pos})") from None
    except RecursionError:
        raise refused("it is nested too deeply to read") from None
    if not isinstance(impls, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(impls), "a number")
        raise refused(f"it is JSON {kind}")
    for k, impl in impls.items():
        if k not in codes:
            raise refused(f"it marks `{k[:80]}`, which the file does not hold")
        if not isinstance(impl, str):
            shown = "null" if impl is None else f"a JSON {type(impl).__name__.replace('dict', 'object')}"
            raise refused(f"`{k[:80]}` is marked as a PRNG key array of the implementation `{shown}`, which names "
                          "no implementation")
    return impls


def _read(fh: Any, where: str, codes: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Each entry of the file ``fh`` as a NumPy array, read once, straight into it (float8 and
    bfloat16 too: safetensors' NumPy loader has no such dtypes). The header is read again from
    ``fh``: it is what safetensors checked, unless the file was replaced meanwhile (refused)."""
    changed = BadWeightsFile(where, "changed", "", f"`{where}` changed while it was being read. Nothing was "
                             "loaded. Try again once nothing writes to it.")
    try:
        fh.seek(0)
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(min(size, 100_000_000)))
        base, places = 8 + size, {}
        for k, code in codes.items():
            entry = header[k]
            begin, end = (int(i) for i in entry["data_offsets"])
            if entry["dtype"] != code or tuple(entry["shape"]) != shapes[k]:
                raise changed
            places[k] = (base + begin, end - begin)
    except (ValueError, TypeError, KeyError, RecursionError):
        raise changed from None
    arrays = {}
    for k, (start, length) in sorted(places.items(), key=lambda item: item[1]):  # in the order of the file
        a = np.empty(shapes[k], _DTYPES[codes[k]])
        if a.nbytes != length:
            raise changed
        if a.nbytes:
            try:
                whole = read_into(fh, start, a.reshape(-1).view(np.uint8))
            except OSError as e:
                raise BadWeightsFile(where, "unreadable", str(e.strerror or e),
                                     f"`{where}` could not be read: {e.strerror or e}. Nothing was loaded. Try "
                                    "again, or copy the file to a disk that reads.") from e
            if not whole:
                raise changed
        arrays[k] = a
    return arrays


def _held(dtype: np.dtype[Any]) -> bool:
    """Whether JAX holds arrays of ``dtype`` as they are: 64-bit ones only with x64 on."""
    return bool(jax.dtypes.canonicalize_dtype(dtype) == dtype)
