"""`common.distributed`: `pmean` and `psum` over a bound axis, and no-ops without one."""

import jax
import jax.numpy as jnp
import numpy as np

from common.distributed import pmean, psum


def test_pmean_is_a_noop_without_a_bound_axis_and_averages_with_one():
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(pmean)(x), x)
    np.testing.assert_array_equal(jax.vmap(pmean)(x), x)  # vmap without axis_name: unbound
    averaged = jax.vmap(lambda v: pmean(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(averaged, np.full(4, 1.5))
    summed = jax.vmap(lambda v: psum(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(summed, np.full(4, 6.0))
