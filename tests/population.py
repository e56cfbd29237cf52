"""Shared by the population tests (one device here, eight in tests/multidevice)."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_amp_scale as jas
from tests._rule import rule

N = 16
STEPS = 20


def population(n=N, dtype=jnp.float32, shape=(), init_scale=2.0**10):
    one = jas.init_scale_state(init_scale, growth_interval=3, dtype=dtype, shape=shape)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), one)


def random_founds(seed=0, n=N, p=0.2):
    return np.random.default_rng(seed).random((STEPS, n)) < p


def expected_member(state, founds):
    """One member alone, step by step, by the plain-Python rule (tests/_rule.py)."""
    s = np.asarray(state.scale).reshape(-1)[0]
    g = int(np.asarray(state.growth_tracker).reshape(-1)[0])
    shape = np.shape(state.scale)
    out = []
    for f in founds:
        s, g = rule(s, g, bool(f), state.growth_factor, state.backoff_factor, state.growth_interval)
        out.append((np.full(shape, s), np.full(shape, g, np.int32)))
    return out


def run_population(backend, axis_name=None):
    def step(states, found):
        new = jax.vmap(
            lambda s, f: jas.update_scale(s, f, backend, axis_name=axis_name),
            axis_name=axis_name,
        )(states, found)
        return new, (new.scale, new.growth_tracker)

    @jax.jit
    def run(states, founds):
        return jax.lax.scan(step, states, founds)[1]

    return run
