"""`common.normalize`: running observation statistics against NumPy over all batches, and
reward scaling against gym's `NormalizeReward` written out, also split over devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import normalize


def test_running_stats_match_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 5)).astype(np.float32) for n in (7, 64, 1, 33)]
    stats = normalize.init((5,))
    for b in batches:
        stats = jax.jit(normalize.update)(stats, b)
    everything = np.concatenate(batches)
    # gymnasium's convention: a prior of mean 0, var 1 with weight 1e-4.
    n0 = 1e-4
    n = n0 + len(everything)
    mean = everything.sum(0) / n
    var = (n0 * (1.0 + mean ** 2) + ((everything - mean) ** 2).sum(0)) / n
    np.testing.assert_allclose(stats.count, n, rtol=1e-6)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-4)
    z = normalize.normalize(stats, everything)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(z.std(0), 1.0, atol=1e-3)


def test_normalize_clips_and_rejects_wrong_shapes():
    stats = normalize.init((2,))
    np.testing.assert_allclose(normalize.normalize(stats, jnp.array([100.0, -100.0])), [10.0, -10.0])
    with pytest.raises(ValueError, match="expected"):
        normalize.update(stats, jnp.zeros((4, 3)))


def normalize_rewards_reference(reward, done, gamma, g0, clip=10.0, eps=1e-8):
    """gym's NormalizeReward, one step at a time: a running discounted return per
    environment, a running variance of it (Welford-style merge of each step's batch), and
    rewards divided by its standard deviation."""
    mean, var, count = 0.0, 1.0, 1e-4
    g = np.array(g0, np.float64)
    out = np.zeros_like(reward, np.float64)
    for t in range(reward.shape[0]):
        g = reward[t] + gamma * g
        b_mean, b_var, b_count = g.mean(), g.var(), len(g)
        delta, total = b_mean - mean, count + b_count
        mean, var = mean + delta * b_count / total, \
            (var * count + b_var * b_count + delta**2 * count * b_count / total) / total
        count = total
        out[t] = np.clip(reward[t] / np.sqrt(var + eps), -clip, clip)
        g = np.where(done[t], 0.0, g)
    return out, g, var


def test_normalize_rewards_matches_gyms_wrapper_written_out():
    rng = np.random.default_rng(3)
    reward = rng.normal(5.0, 3.0, (40, 6)).astype(np.float32)
    done = rng.random((40, 6)) < 0.1
    done[-1] = [True, True, True, False, False, False]  # some episodes end at the last step
    g0 = rng.normal(0, 10, 6).astype(np.float32)
    stats, g, scaled = jax.jit(normalize.normalize_rewards, static_argnames="axis_name")(
        normalize.init(()), jnp.asarray(g0), jnp.asarray(reward), jnp.asarray(done), 0.99)
    ref, ref_g, ref_var = normalize_rewards_reference(reward, done, 0.99, g0)
    np.testing.assert_allclose(scaled, ref, rtol=2e-5)
    np.testing.assert_allclose(g, ref_g, rtol=1e-5)
    np.testing.assert_allclose(stats.var, ref_var, rtol=1e-5)
    assert not np.allclose(scaled, reward)  # it did scale
    # A returned G of 0 where the last step ended an episode: the next rollout starts afresh.
    np.testing.assert_array_equal(np.asarray(g)[:3], 0.0)
    assert (np.abs(np.asarray(g)[3:]) > 1.0).all()  # the others carry their return on
    with pytest.raises(ValueError, match="must be \\[T, num_envs\\]"):
        normalize.normalize_rewards(normalize.init(()), jnp.zeros(5), jnp.zeros((3, 6)),
                                    jnp.zeros((3, 6), bool), 0.99)


def test_normalize_rewards_across_devices_equals_the_global_computation():
    """Environments split over a device axis (`vmap` with the data-parallel axis name):
    every device ends with the statistics of all environments, and each its own scaled
    rewards -- the same numbers as one call over all environments."""
    from common.distributed import DATA_AXIS

    rng = np.random.default_rng(5)
    reward = jnp.asarray(rng.normal(1.0, 2.0, (12, 8)), jnp.float32)
    done = jnp.asarray(rng.random((12, 8)) < 0.2)
    stats, g, scaled = normalize.normalize_rewards(normalize.init(()), jnp.zeros(8), reward,
                                                   done, 0.9)
    split = lambda x: x.reshape(x.shape[0], 4, 2).swapaxes(0, 1)  # noqa: E731  [4 devices]
    per_device = jax.vmap(lambda r, d: normalize.normalize_rewards(
        normalize.init(()), jnp.zeros(2), r, d, 0.9), axis_name=DATA_AXIS)
    d_stats, d_g, d_scaled = per_device(split(reward), split(done))
    for leaf, want in zip(d_stats, stats):
        np.testing.assert_allclose(leaf, jnp.broadcast_to(want, (4,)), rtol=1e-6)
    np.testing.assert_allclose(d_scaled.swapaxes(0, 1).reshape(12, 8), scaled, rtol=1e-6)
    np.testing.assert_allclose(d_g.reshape(8), g, rtol=1e-6)
