"""A query interrupted by KeyboardInterrupt (the kernel's stop button) stops its
worker process, so the next query answers at once."""

import _thread
import signal
import threading
import time

import pytest

import yax

pytestmark = pytest.mark.core

# Four nested searches of the whole document for every node: hours on a few hundred elements.
SLOW = "count(//*[count(//*[count(//*[count(//*) > 0]) > 0]) > 0])"


def _interrupt_main(how: str) -> None:
    if how == "signal":  # what Ctrl-C in a terminal and a kernel's interrupt do: SIGINT, here to the main thread
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:  # raised when the main thread next runs Python code; wakes no blocked system call
        _thread.interrupt_main()


@pytest.mark.parametrize("how", ["signal", "interrupt_main"])
def test_interrupted_query_leaves_the_next_one_answering_at_once(tf, how):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("KeyboardInterrupt reaches the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")
    expected = yax.query("//*", tf)  # the worker is running and holds this document
    timer = threading.Timer(0.5, _interrupt_main, (how,))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yax.query(SLOW, tf, timeout=8)
        felt = time.monotonic() - start
    finally:
        timer.join()
    assert felt < 3, f"the interrupt was felt after {felt:.1f} s, not at once"

    start = time.monotonic()
    got = yax.query("//*", tf)
    took = time.monotonic() - start
    assert took < 1, f"the next query took {took:.1f} s"
    assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected))
    assert yax.query('count(//module_call[@type="Dense"])', tf) == len(
        [n for n in tf.modules() if n.type == "Dense"])


def test_after_an_interrupt_a_query_over_another_mox_gets_its_own_answer(tf):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("KeyboardInterrupt reaches the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")
    import jax.numpy as jnp

    small = yax.make_mox(jnp.sin)(jnp.ones(2))
    timer = threading.Timer(0.3, _interrupt_main, ("signal",))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yax.query(SLOW, tf, timeout=8)
    finally:
        timer.join()
    start = time.monotonic()
    assert [n.name for n in yax.query("//sin", small)] == ["sin"]
    assert time.monotonic() - start < 1
