"""The frontends of this folder, registered (`yax.frontends.register`) when yax is imported.

Each module here whose name does not start with ``_`` defines a module-level ``frontend``; the
registry (`yax.frontends`) sits below them all and imports none, so this module, which
`yax/__init__.py` imports, finds them instead.
"""

from __future__ import annotations

import importlib
import pkgutil

from . import Frontend, __path__, register

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        _f = getattr(importlib.import_module(f"{__package__}.{_info.name}"), "frontend", None)
        if isinstance(_f, Frontend):
            register(_f)
