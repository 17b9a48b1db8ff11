"""Every oracle property is in the core suite: the test command runs it on the newest JAX (12
examples a property) and on the oldest supported one (4), where what JAX does differently shows."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.parent.name == "oracle":
            item.add_marker(pytest.mark.core)
