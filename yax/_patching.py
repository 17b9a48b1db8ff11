"""Methods of a module system's classes wrapped for as long as any trace runs, in any thread.

Frontends whose modules have no interception API of their own (nnx, Equinox) wrap their classes'
methods so that each call is recorded (`_record.marked_call`). Traces may run in several threads at
once: the first one to start wraps, a later one wraps the classes defined since, and the last one to
finish gives every class its own functions back. `Patches` is that bookkeeping, written once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: ``(class, attribute name, the class's own function)``
Target = tuple[type, str, Callable[..., Any]]


class Patches:
    """The wrapped methods of one frontend, shared by every trace running at once.

    ``find()`` (called with `lock` held) names what is not wrapped yet; ``wrap(name, fn)`` makes
    the wrapper; ``put(cls, name, fn)`` sets an attribute (``setattr``, or ``type.__setattr__``
    where a class's own ``__setattr__`` refuses). `lock` also guards what else the frontend's
    traces share (nnx's stamps)."""

    def __init__(self, put: Callable[[type, str, Any], None] = setattr):
        self.lock = threading.Lock()
        self._put = put
        self._users = 0  # traces running with the methods wrapped, in all threads
        self._undo: list[Target] = []

    @contextlib.contextmanager
    def wrapped(self, find: Callable[[], Iterable[Target]],
                wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
        """The methods ``find`` names wrapped by ``wrap`` for the duration of one trace."""
        with self.lock:
            self._users += 1
            try:
                for cls, name, fn in find():
                    self._undo.append((cls, name, fn))
                    self._put(cls, name, wrap(name, fn))
            except BaseException:
                self._leave()
                raise
        try:
            yield
        finally:
            with self.lock:
                self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if not self._users:
            for cls, name, fn in reversed(self._undo):
                self._put(cls, name, fn)
            self._undo.clear()
