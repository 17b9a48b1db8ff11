"""Requests from the front-end and their replies (docs/widget.md, "Requests").

A request is ``{"type": ..., "rid": int, ...}``; its reply is ``{"type":
"ok", "rid", ...}`` or ``{"type": "error", "rid", "message"}``, exactly one
per request. The front-end is never trusted: `handle` checks the shape of
every message, each handler checks its own fields, node ids must name a
node of the current model and replacements are chosen by the name Python
registered. A request that fails validation changes nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yax
from yax.internal import CALL_KINDS, misfit, view

from ._payloads import equation_rows

if TYPE_CHECKING:
    from ._explorer import Explorer

MAX_QUERY = 4000  # characters of an XPath the front-end may send
_log = logging.getLogger("yax_widget")


class RequestError(Exception):
    """A malformed or refused request from the front-end: replied to, nothing changes."""


def handle(ex: Explorer, content: Any) -> None:
    """Answer one custom message from the front-end with one reply."""
    rid = content.get("rid") if isinstance(content, dict) else None
    if not isinstance(rid, int) or isinstance(rid, bool):
        rid = None
    try:
        if rid is None:
            raise RequestError("A request must be an object with an integer `rid`.")
        kind = content.get("type")
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise RequestError(f"Unknown request type {str(content.get('type'))[:40]!r}.")
        reply = handler(ex, content)
    except (RequestError, yax.YaxError) as e:
        ex.send({"type": "error", "rid": rid, "message": str(e)})
        return
    except Exception as e:  # a bug or a failure below yax (XLA): the front-end still gets its reply
        _log.exception("The explorer's request %r failed", str(content.get("type"))[:40])
        ex._status = {"busy": False, "message": "failed"}
        ex.send({"type": "error", "rid": rid, "message": f"The request failed with {type(e).__name__}: "
                                                         f"{str(e)[:500]} (the kernel's log has the traceback)."})
        return
    ex.send({"type": "ok", "rid": rid, **reply})


# -- validation -----------------------------------------------------------------------

def _node(ex: Explorer, content: dict, field: str = "id", kinds: tuple = (*CALL_KINDS, "equation")) -> Any:
    """The node of the current model whose id is ``content[field]``, of one of ``kinds``."""
    i = content.get(field)
    nodes = view(ex.mox).nodes
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(nodes):
        raise RequestError(f"`{field}` must be the id of a node of the current model, not {str(i)[:40]!r}.")
    node = nodes[i]
    kind = "equation" if isinstance(node, yax.Equation) else node.kind
    if kind not in kinds:
        raise RequestError(f"Node {i} is a `{kind}` node, which cannot be used here.")
    return node


def _plain(v: Any) -> Any:
    """A query's non-node result (a number, string or boolean) as JSON."""
    return v if isinstance(v, (str, bool, int)) else float(v) if isinstance(v, float) and math.isfinite(v) else str(v)


# -- the handlers: (explorer, request) -> the reply's payload ---------------------------

def _query(ex: Explorer, content: dict) -> dict:
    xpath = content.get("xpath")
    if not isinstance(xpath, str) or len(xpath) > MAX_QUERY:
        raise RequestError(f"`xpath` must be a string of at most {MAX_QUERY} characters.")
    ex._query = xpath
    if not xpath.strip():  # the box was cleared: no highlight, no error
        ex._query_error, ex._matches, ex._selection, ex._query_result = "", [], [], {}
        return {"count": 0}
    res = ex._run_query(xpath)
    return {"count": len(ex._matches) if isinstance(res, list) else _plain(res)}


def _expand(ex: Explorer, content: dict) -> dict:
    node = _node(ex, content, kinds=CALL_KINDS)
    ids = view(ex.mox).ids
    return {"id": ids[id(node)], "rows": equation_rows(node, ids)}


def _fits(ex: Explorer, content: dict) -> dict:
    node = _node(ex, content)
    fits, refused = [], {}
    for item in ex._items.values():
        # with the explorer's parameters, misfit places variables exactly as the drop's `sub` does
        why = misfit(item.repl, node, ex.mox, cache=ex._fit_cache, params=ex.params)
        if why is None:
            fits.append(item.name)
        else:
            refused[item.name] = why
    return {"id": content["id"], "fits": fits, "refused": refused}


def _substitute(ex: Explorer, content: dict) -> dict:
    name = content.get("name")
    if not isinstance(name, str) or name not in ex._items:
        raise RequestError(f"`name` must be a registered replacement ({', '.join(ex._items)}), "
                           f"not {str(name)[:40]!r}.")
    target = content.get("target")
    node = "query" if target == "query" else _node(ex, content, "target")
    try:
        desc = ex.substitute(node, name)
    except yax.YaxError as e:  # shown at the row it was dropped on
        ex._notice = {"id": target if isinstance(target, int) else None, "message": str(e),
                      "n": ex._notice.get("n", 0) + 1}
        raise
    return {"description": desc}


def _undo(ex: Explorer, content: dict) -> dict:
    ex.undo()
    return {}


def _redo(ex: Explorer, content: dict) -> dict:
    ex.redo()
    return {}


def _goto(ex: Explorer, content: dict) -> dict:
    index = content.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(ex._states):
        raise RequestError(f"`index` must be a state of the history, 0 to {len(ex._states) - 1}, "
                           f"not {str(index)[:40]!r}.")
    ex.goto(index)
    return {}


def _compare_base(ex: Explorer, content: dict) -> dict:
    base = content.get("base")
    if base not in ("original", "previous"):
        raise RequestError(f"`base` must be \"original\" or \"previous\", not {str(base)[:40]!r}.")
    ex.compare_with(base)
    return {}


def _export(ex: Explorer, content: dict) -> dict:
    # the front-end chooses no path: the files go next to the notebook, named by the step
    from ._export import export

    reply = export(ex, f"yax_model_step{ex._index}")
    ex._status = {"busy": False, "message": "exported to " + ", ".join(
        f"{f} ({b / 2**20:.1f} MiB)" for f, b in zip(reply["files"], reply["bytes"]))}
    return reply


def _code(ex: Explorer, content: dict) -> dict:
    return {"code": ex.code()}


def _graph(ex: Explorer, content: dict) -> dict:
    depth = content.get("depth", 1)
    if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= 8:
        raise RequestError("`depth` must be an integer from 0 to 8.")
    root = None if content.get("id") is None else _node(ex, content, kinds=CALL_KINDS)
    return {"id": content.get("id"), "dot": yax.to_dot(ex.mox, depth=depth, root=root)}


HANDLERS: dict[str, Callable[[Explorer, dict], dict]] = {
    "query": _query, "expand": _expand, "fits": _fits, "substitute": _substitute,
    "undo": _undo, "redo": _redo, "goto": _goto, "compare_base": _compare_base, "export": _export, "code": _code, "graph": _graph,
}
