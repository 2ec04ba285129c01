"""`common.distributed`: `pmean` and `psum` over a bound axis, and no-ops without one;
`explained_variance`, the metric all three algorithms report, against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from common.distributed import explained_variance, pmean, psum


def test_pmean_is_a_noop_without_a_bound_axis_and_averages_with_one():
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(pmean)(x), x)
    np.testing.assert_array_equal(jax.vmap(pmean)(x), x)  # vmap without axis_name: unbound
    averaged = jax.vmap(lambda v: pmean(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(averaged, np.full(4, 1.5))
    summed = jax.vmap(lambda v: psum(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(summed, np.full(4, 6.0))


def test_explained_variance_matches_numpy_is_global_across_devices_and_nan_for_constant_targets():
    """1 - Var[target - prediction] / Var[target], as Baselines; split over 4 devices (equal
    shares) it is the global figure, not a mean of the shares'; constant targets (Var = 0,
    e.g. every step terminal with reward 1) give NaN, not -inf or 1e13."""
    rng = np.random.default_rng(0)
    target = rng.normal(size=(4, 6)).astype(np.float32)
    prediction = (target + 0.5 * rng.normal(size=(4, 6))).astype(np.float32)
    want = 1.0 - np.var(target - prediction) / np.var(target)
    np.testing.assert_allclose(jax.jit(explained_variance)(target, prediction), want, rtol=1e-5)
    shares = jax.vmap(lambda t, p: explained_variance(t, p, "data"), axis_name="data")(
        target, prediction)
    np.testing.assert_allclose(shares, np.full(4, want), rtol=1e-5)
    per_share = [1.0 - np.var(t - p) / np.var(t) for t, p in zip(target, prediction)]
    assert abs(np.mean(per_share) - want) > 1e-3  # the global figure is not the mean of shares
    assert np.isnan(explained_variance(jnp.ones(6), jnp.asarray(prediction[0])))
    np.testing.assert_allclose(explained_variance(jnp.asarray(target), jnp.asarray(target)), 1.0)
