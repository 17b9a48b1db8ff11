"""`yax._patching.Patches`, the wrapping nnx and Equinox share: the first trace wraps, a later one
wraps the classes defined since, the last one gives every class its own functions back, and a
failure while wrapping leaves nothing wrapped."""

from __future__ import annotations

import pytest

from yax._patching import Patches

pytestmark = pytest.mark.core


def _wrapper(name, fn):
    def wrapped(self, *a):
        return ("wrapped", fn(self, *a))

    wrapped.__yax_method__ = True
    return wrapped


def _unwrapped(classes):
    def find():
        for cls in classes:
            fn = vars(cls)["f"]
            if not hasattr(fn, "__yax_method__"):
                yield cls, "f", fn
    return find


def test_overlapping_traces_wrap_once_and_the_last_unwraps():
    class A:
        def f(self):
            return 1

    own_a = A.f
    classes = [A]
    p = Patches()
    with p.wrapped(_unwrapped(classes), _wrapper):
        assert A().f() == ("wrapped", 1)

        class B:  # defined while the first trace runs: the second wraps it
            def f(self):
                return 2

        own_b = B.f
        classes.append(B)
        with p.wrapped(_unwrapped(classes), _wrapper):
            assert A().f() == ("wrapped", 1) and B().f() == ("wrapped", 2)
        assert A().f() == ("wrapped", 1)  # the first trace still runs
    assert A.f is own_a and B.f is own_b


def test_a_failure_while_wrapping_leaves_nothing_wrapped():
    class A:
        def f(self):
            return 1

    own = A.f

    def find():
        yield A, "f", A.f
        raise RuntimeError("a class could not be read")

    p = Patches()
    with pytest.raises(RuntimeError), p.wrapped(find, _wrapper):
        pass
    assert A.f is own
    with p.wrapped(_unwrapped([A]), _wrapper):  # and the next trace starts as the first
        assert A().f() == ("wrapped", 1)
    assert A.f is own
