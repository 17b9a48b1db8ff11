"""Helpers for the widget tests: an explorer whose comm transport records what it sends."""

from __future__ import annotations

import jax.numpy as jnp

from yax_widget import Explorer

IDS = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64


def recording(ex: Explorer) -> Explorer:
    """``ex``, its comm's transport (only that) recording what it sends in ``ex.sent``."""
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    return ex


def explorer(model, **kw) -> Explorer:
    m, v = model
    return recording(Explorer(m, v, IDS, **kw))


def ask(ex: Explorer, **content) -> dict:
    ex._on_msg(ex, content, [])
    return ex.sent[-1]


def snapshot(ex: Explorer):
    return ex.mox, ex.params, len(ex.session.states), ex.session.index, ex._query, list(ex._matches), ex._tree["version"]
