"""The explorer in a multi-process JAX job: process 0 shows it, the others follow.

In a job of several processes (``jax.distributed``), a model sharded over all their devices
runs only when every process runs the same program: each collective waits for all of them. The
explorer lives in one process (the notebook's kernel, process 0); every request its front-end
sends is broadcast to the other processes before process 0 answers it (`Leader`), and each of
them answers it on its own `Session` of the same model (`follow`), so that every program the
explorer runs (a comparison, the values of a row, a colouring) runs in every process, in the
same order. A request that runs nothing on the devices is answered everywhere too: cheap, and
the sessions stay alike.

Requests are answered one at a time, each finished (its comparison too) before the next
is broadcast: the programs of one request run in one order in every process. The messages go
over JAX's own multi-host broadcast (`jax.experimental.multihost_utils`): no other channel.

On processes 1..N::

    import yax_widget
    yax_widget.follow(model, variables, batch)   # until process 0's explorer is closed

and in process 0, the explorer as usual: ``Explorer(model, variables, batch)`` leads when
``jax.process_count() > 1``.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np

from ._protocol import answer
from ._session import Session

#: The message that ends `follow`.
CLOSE = {"type": "__close__"}


class Channel:
    """JSON messages from process 0 to every process of the job (a collective: every process
    calls `exchange` in the same order; process 0's message is what all of them get)."""

    def exchange(self, message: dict | None) -> dict:
        from jax.experimental import multihost_utils

        data = json.dumps(message).encode() if jax.process_index() == 0 else b""
        n = int(multihost_utils.broadcast_one_to_all(np.array(len(data), np.int32)))
        size = 1 << max(10, (n - 1).bit_length())  # a few sizes: each compiles its broadcast once
        buf = np.zeros(size, np.uint8)
        buf[:len(data)] = np.frombuffer(data, np.uint8)
        got = np.asarray(multihost_utils.broadcast_one_to_all(buf))
        return json.loads(bytes(got[:n]).decode())


def _settle(session: Session) -> None:
    """Wait until the session's worker has run what the last request gave it."""
    if session.worker.pool is not None:
        session.worker.run(lambda: None)


class Leader:
    """Process 0's side: each request broadcast, then answered, then settled."""

    def __init__(self, session: Session):
        self.session = session
        self.channel = Channel()
        self.closed = False
        _settle(session)

    def answer(self, message: dict) -> dict:
        self.channel.exchange(message)
        reply = answer(self.session, message)
        _settle(self.session)
        return reply

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.channel.exchange(CLOSE)


def follow(target: Any, *args: Any, **kwargs: Any) -> Session:
    """On processes 1..N of a multi-process job: open a `Session` of the model process 0's
    explorer shows (the same arguments) and answer every request its explorer broadcasts, until
    it is closed. Returns the session, closed."""
    kwargs.setdefault("warm", False)
    session = Session(target, *args, **kwargs)
    _settle(session)
    channel = Channel()
    try:
        while True:
            message = channel.exchange(None)
            if message == CLOSE:
                break
            answer(session, message)
            _settle(session)
    finally:
        session.close()
    return session
