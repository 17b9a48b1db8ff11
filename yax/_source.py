"""Where in the user's code each node of a MoX comes from: a file and a line.

JAX keeps, with every equation it traces, the Python traceback at that moment
(``eqn.source_info.traceback``). The *user's frame* is the innermost frame of
that traceback whose code is not JAX's, Flax's (or Equinox's), yax's or the
Python standard library's: the line of the user's model that made the
equation. Hugging Face ``modeling_flax_*.py`` files are the user's code here:
they are the model's own source, as a model in a notebook would be.

* An equation's location is the user's frame of its own traceback. A
  ``dot_general`` inside ``nn.Dense`` is made in Flax's ``linear.py``, which is
  skipped, so it lands on the user's line calling the ``Dense``.
* A call node's location is the line that called the module: the user's frame
  of the marker equation yax puts at the call's entry (`yax._record`), whose
  traceback goes through the caller. (Not its first equation's: a module whose
  first equation comes from a sub-module would point into that sub-module's
  call instead of its own.)
* A node whose traceback has no user frame (an equation JAX made inside a
  ``custom_jvp`` rule or a jitted library function it traced earlier, a root,
  a node built by hand) has no location: ``None``, never a guess.

Everything here reads public objects: the traceback JAX hands over has
``raw_frames()`` (code objects and bytecode offsets, cheap) and ``frames``
(the same as Python objects, slow); the line of an offset comes from the code
object (``co_lines``, PEP 626). A traceback of any other shape gives no
location rather than an error.
"""

from __future__ import annotations

import functools
import importlib.util
import linecache
import os
import re
import sysconfig
import types
from collections.abc import Iterator
from typing import Any, NamedTuple

#: Packages whose frames are never the user's: JAX and yax itself, and the module systems' own
#: libraries, which each frontend names (`Frontend.libraries`) and its registration adds here
#: (`add_libraries`).
LIBRARIES: tuple[str, ...] = ("jax", "jaxlib", "yax", "yax_widget")


def add_libraries(names: tuple[str, ...]) -> None:
    """Count frames of the packages ``names`` as never the user's (a module system's library)."""
    global LIBRARIES
    new = tuple(n for n in names if n not in LIBRARIES)
    if new:
        LIBRARIES = (*LIBRARIES, *new)
        _skipped.cache_clear()
        is_user_file.cache_clear()


class Location(NamedTuple):
    """A line of the user's code: ``path`` as Python knows it (absolute for a
    file; ``<ipython-input-…>`` or a kernel's temporary name for a notebook
    cell) and ``line``, from 1. ``str()`` gives ``file:line`` with the file's
    base name, as queries (``@file``) and printouts show it."""

    path: str
    line: int

    @property
    def file(self) -> str:
        """The base name of ``path`` (``"model.py"``): what ``@file`` holds."""
        return os.path.basename(self.path) or self.path

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _spellings(dirs: list[str]) -> tuple[str, ...]:
    """Each directory as Python spells it in ``co_filename`` (sys.path's spelling) and resolved,
    ending in a separator (so that ``.../jax`` is no prefix of ``.../jax_triton``)."""
    out = {p.rstrip(os.sep) + os.sep for d in dirs for p in (os.path.abspath(d), os.path.realpath(d))}
    return tuple(sorted(out))


@functools.cache
def _skipped() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The libraries' directories, and the standard library's."""
    libs: list[str] = []
    for name in LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        libs += list(getattr(spec, "submodule_search_locations", None) or ())
    paths = sysconfig.get_paths()
    std = [p for p in (paths.get("stdlib"), paths.get("platstdlib"), os.path.dirname(functools.__file__)) if p]
    return _spellings(libs), _spellings(std)


_SITE = re.compile(r"[/\\](site|dist)-packages[/\\]")


@functools.cache
def is_user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not in `LIBRARIES` or the
    standard library (a package installed under it, in its ``site-packages``,
    is not the standard library), nor frozen import machinery."""
    if filename.startswith("<frozen "):
        return False
    if not os.path.isabs(filename):
        return True  # a notebook cell (`<ipython-input-…>`), code run from a string
    libs, std = _skipped()
    for name in {filename, os.path.realpath(filename)}:
        if name.startswith(libs) or (name.startswith(std) and not _SITE.search(name)):
            return False
    return True


@functools.lru_cache(maxsize=8192)
def _line(code: types.CodeType, offset: int) -> int | None:
    """The line of the instruction at bytecode ``offset`` of ``code``."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def _frames(tb: Any) -> Iterator[tuple[str, int | None]]:
    """``(file, line)`` of the user's frames of a JAX traceback, innermost first."""
    raw = getattr(tb, "raw_frames", None)
    if callable(raw):
        codes, offsets = raw()
        for code, offset in zip(codes, offsets):
            if is_user_file(code.co_filename):
                yield code.co_filename, _line(code, offset)
        return
    for f in getattr(tb, "frames", None) or ():  # the slower public view of the same frames
        if is_user_file(f.file_name):
            yield f.file_name, f.line_num


def from_source_info(source_info: Any) -> Location | None:
    """The user's line in JAX's ``source_info`` of an equation, or ``None``."""
    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return None
    try:
        for path, line in _frames(tb):
            if isinstance(line, int) and line > 0 and isinstance(path, str) and path:
                return Location(path, line)
    except Exception:  # a traceback of another shape (another jaxlib): no location, never a failed trace or query
        return None
    return None


def location(node: Any) -> Location | None:
    """Where ``node`` (an `Equation` or a call `Mox`) comes from in the
    user's code, or ``None`` where JAX recorded no line of it (see the module
    docstring for which line that is)."""
    return from_source_info(getattr(node, "source_info", None))


def lines_around(loc: Location, radius: int = 8) -> list[tuple[int, str]] | None:
    """``(number, text)`` of the lines of ``loc``'s file from ``radius``
    before its line to ``radius`` after, as the file reads now; ``None``
    where neither the disk nor Python's line cache (which holds IPython's
    cells) has the file, or it has no such line."""
    linecache.checkcache(loc.path)
    lines = linecache.getlines(loc.path)
    if not 0 < loc.line <= len(lines):
        return None
    lo, hi = max(1, loc.line - radius), min(len(lines), loc.line + radius)
    return [(i, lines[i - 1].rstrip("\r\n")) for i in range(lo, hi + 1)]
