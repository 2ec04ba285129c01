"""Observation normalisation as pure running-statistics functions.

Running mean and variance merged batch by batch with the parallel-variance formula of Chan,
Golub and LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample
variances" -- the same statistics `gymnasium.wrappers.NormalizeObservation` keeps:

    n = n_a + n_b,  delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = var_a * n_a + var_b * n_b + delta^2 * n_a * n_b / n,   var = M2 / n
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from common.distributed import DATA_AXIS, pmean, psum


class RunningStats(NamedTuple):
    mean: jax.Array
    """Running mean, shape of one observation."""
    var: jax.Array
    """Running (population) variance, shape of one observation."""
    count: jax.Array
    """Number of observations seen, a float scalar (starts at a tiny epsilon)."""


def init(obs_shape) -> RunningStats:
    """Empty statistics: mean 0, variance 1, count 1e-4 (as gymnasium)."""
    return RunningStats(jnp.zeros(obs_shape, jnp.float32), jnp.ones(obs_shape, jnp.float32),
                        jnp.asarray(1e-4, jnp.float32))


def update(stats: RunningStats, batch, axis_name=DATA_AXIS) -> RunningStats:
    """Merge a batch `[B, *obs_shape]` of observations into `stats`.

    Where `axis_name` is bound (data-parallel training, equal shards per device), every device
    merges the statistics of the whole global batch, so they stay identical across devices;
    elsewhere the axis is ignored.
    """
    batch = jnp.asarray(batch, jnp.float32)
    if batch.shape[1:] != stats.mean.shape:
        raise ValueError(f"normalize.update: batch has shape {batch.shape}, expected "
                         f"[B, {', '.join(map(str, stats.mean.shape))}].")
    batch_mean = pmean(jnp.mean(batch, axis=0), axis_name)
    batch_var = pmean(jnp.mean(jnp.square(batch - batch_mean), axis=0), axis_name)
    batch_count = psum(jnp.asarray(batch.shape[0], jnp.float32), axis_name)
    count = stats.count + batch_count
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * batch_count / count
    m2 = stats.var * stats.count + batch_var * batch_count + \
        jnp.square(delta) * stats.count * batch_count / count
    return RunningStats(mean, m2 / count, count)


def normalize(stats: RunningStats, obs, clip: float = 10.0, eps: float = 1e-8):
    """`clip((obs - mean) / sqrt(var + eps), -clip, clip)`."""
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + eps), -clip, clip)
