"""The model the Cost tab is tested on (tests/widget/test_providers.py, and in a real notebook by
tests/e2e/test_details_e2e.py, which copies this file next to it): a Dense, a scanned stack of
three Dense layers, a `while` loop of products."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class Layer(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        return nn.relu(nn.Dense(6)(h)), None


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(6, name="inp")(x)
        h, _ = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)(name="layers")(h, None)
        return jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] @ jnp.ones((6, 6))), (0, h))[1]
