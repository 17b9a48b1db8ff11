from __future__ import annotations

import jax
import pytest
from models import Transformer

from .helpers import IDS


@pytest.fixture(scope="module")
def model():
    m = Transformer(num_layers=2)
    return m, m.init(jax.random.key(0), IDS)


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()
