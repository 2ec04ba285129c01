"""`common.gae.gae` against a NumPy loop written from the equations, plus its properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.gae import gae


def gae_reference(r, v, v_next, terminated, truncated, gamma, lam):
    """Schulman et al. (2016) eq. 16, with termination (no bootstrap) and truncation
    (bootstrap, cut the trace) kept apart -- written as a plain loop over t."""
    T = len(r)
    adv = np.zeros(T)
    next_adv = 0.0
    for t in reversed(range(T)):
        bootstrap = 0.0 if terminated[t] else v_next[t]
        delta = r[t] + gamma * bootstrap - v[t]
        if terminated[t] or truncated[t]:
            next_adv = 0.0
        adv[t] = delta + gamma * lam * next_adv
        next_adv = adv[t]
    return adv, adv + v


def random_trajectory(seed, T=64, batch=()):
    rng = np.random.default_rng(seed)
    shape = (T,) + batch
    return dict(
        rewards=rng.normal(size=shape).astype(np.float32),
        values=rng.normal(size=shape).astype(np.float32),
        next_values=rng.normal(size=shape).astype(np.float32),
        terminated=rng.random(shape) < 0.08,
        truncated=rng.random(shape) < 0.08,
    )


def call(d, gamma, lam, fn=gae):
    return fn(d["rewards"], d["values"], d["next_values"], d["terminated"], d["truncated"],
              gamma, lam)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0)])
def test_matches_numpy_reference_single_trajectory(gamma, lam):
    d = random_trajectory(0)
    assert d["terminated"].any() and d["truncated"].any()
    adv, ret = jax.jit(gae)(*d.values(), gamma, lam)
    ref_adv, ref_ret = gae_reference(*d.values(), gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_batched_equals_per_column_reference_and_vmap():
    d = random_trajectory(1, T=50, batch=(6,))
    adv, ret = call(d, 0.97, 0.9)
    for i in range(6):
        col = {k: v[:, i] for k, v in d.items()}
        ref_adv, ref_ret = gae_reference(*col.values(), 0.97, 0.9)
        np.testing.assert_allclose(adv[:, i], ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[:, i], ref_ret, rtol=1e-5, atol=1e-5)
    # vmap over a leading batch axis (batch-major input) gives the same numbers.
    batch_major = {k: np.moveaxis(v, 1, 0) for k, v in d.items()}
    vadv, vret = jax.vmap(lambda *a: gae(*a, 0.97, 0.9))(*batch_major.values())
    np.testing.assert_allclose(np.moveaxis(np.asarray(vadv), 0, 1), adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.moveaxis(np.asarray(vret), 0, 1), ret, rtol=1e-6, atol=1e-6)


def test_traced_gamma_and_lambda_under_jit_and_vmap():
    d = random_trajectory(2)
    gammas = jnp.array([0.9, 0.99])
    lams = jnp.array([0.0, 0.95])
    adv, _ = jax.jit(jax.vmap(lambda g, l: gae(*d.values(), g, l)))(gammas, lams)
    for i in range(2):
        ref, _ = gae_reference(*d.values(), float(gammas[i]), float(lams[i]))
        np.testing.assert_allclose(adv[i], ref, rtol=1e-5, atol=1e-5)


def test_split_at_episode_end_changes_nothing():
    d = random_trajectory(3)
    cut = int(np.flatnonzero(d["terminated"] | d["truncated"])[0])
    whole, _ = call(d, 0.99, 0.95)
    first, _ = call({k: v[:cut + 1] for k, v in d.items()}, 0.99, 0.95)
    second, _ = call({k: v[cut + 1:] for k, v in d.items()}, 0.99, 0.95)
    np.testing.assert_allclose(whole, np.concatenate([first, second]), rtol=1e-6, atol=1e-6)


def test_lambda_one_without_dones_gives_discounted_sums():
    d = random_trajectory(4, T=20)
    d["terminated"][:] = False
    d["truncated"][:] = False
    d["next_values"][:-1] = d["values"][1:]  # inside one episode, s'_t is s_{t+1}
    _, ret = call(d, 0.9, 1.0)
    r, v_last = d["rewards"], d["next_values"][-1]
    expected = [sum(0.9 ** (k - t) * r[k] for k in range(t, 20)) + 0.9 ** (20 - t) * v_last
                for t in range(20)]
    np.testing.assert_allclose(ret, expected, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_but_termination_does_not():
    ones = np.ones(1, np.float32)
    zeros = np.zeros(1, np.float32)
    # One step, reward 1, V(s)=0, V(s')=10, gamma=0.5.
    adv_trunc, _ = gae(ones, zeros, 10 * ones, [False], [True], 0.5, 0.95)
    adv_term, _ = gae(ones, zeros, 10 * ones, [True], [False], 0.5, 0.95)
    np.testing.assert_allclose(adv_trunc, [6.0])
    np.testing.assert_allclose(adv_term, [1.0])


@pytest.mark.parametrize("output", [0, 1], ids=["advantages", "returns"])
@pytest.mark.parametrize("wrt", ["values", "rewards", "next_values"])
def test_no_gradient_flows_through_outputs(output, wrt):
    d = random_trajectory(5, T=8)
    grad = jax.grad(lambda x: call({**d, wrt: x}, 0.99, 0.95)[output].sum())(d[wrt])
    np.testing.assert_array_equal(grad, 0.0)


def test_shape_mismatch_is_a_clear_error():
    d = random_trajectory(6, T=8)
    with pytest.raises(ValueError, match="next_values"):
        gae(d["rewards"], d["values"], d["next_values"][:-1], d["terminated"], d["truncated"],
            0.99, 0.95)
