import os
import sys

import pytest

# The test models live beside the tests; bench/ imports them too.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="module")
def tf():
    """The test Transformer's MoX (models.CASES["transformer"]), traced once per test file."""
    from helpers import mox_of

    return mox_of("transformer")
