"""The root MoXes that `make_mox` and `sub` made and that still live.

A call node cut from one MoX and used as a replacement in another reads its
module's variables from the root it was cut from (they are that root's
inputs, read like a closure), and nothing in the node points back there:
`yax.rewrite` looks the root up here to name those variables. Held weakly,
so a MoX lives exactly as long as its user keeps it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()  # traces may run in several threads at once


def note(root: Any) -> Any:
    """Remember ``root`` while it lives; returns it."""
    with _lock:
        _live.add(root)
    return root


def live() -> list[Any]:
    """The roots remembered that still live."""
    with _lock:
        return list(_live)
