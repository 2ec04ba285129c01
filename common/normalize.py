"""Observation and reward normalisation as pure running-statistics functions.

Running mean and variance merged batch by batch with the parallel-variance formula of Chan,
Golub and LeVeque (1979), "Updating formulae and a pairwise algorithm for computing sample
variances" -- the same statistics `gymnasium.wrappers.NormalizeObservation` keeps:

    n = n_a + n_b,  delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2   = var_a * n_a + var_b * n_b + delta^2 * n_a * n_b / n,   var = M2 / n

Rewards are scaled by the running standard deviation of the discounted return, kept with the
same statistics (`normalize_rewards`).

The algorithms merge a rollout's observations into the statistics after that rollout's
update, so a rollout, its bootstrap values and its update all see the same statistics (those
of the rollouts before it; the first rollout's are mean 0 and variance 1, so it sees raw
observations, clipped to +-10 as every normalised one is), and the update's probability
ratios compare the policy on identical inputs. gymnasium's wrapper instead merges each
observation before normalising it.
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


def normalize_rewards(stats: RunningStats, discounted_return, reward, done, gamma,
                      axis_name=DATA_AXIS, clip: float = 10.0, eps: float = 1e-8):
    """Scale a rollout's rewards by the running standard deviation of the discounted return.

    For each step t and environment, as `gym.wrappers.NormalizeReward` (used by CleanRL's
    continuous PPO) and PureJaxRL's `NormalizeVecReward`:

        G_t  = r_t + gamma * G_{t-1}          (G_{t-1} = 0 after an episode ended at t-1)
        stats <- merge(stats, {G_t over the environments})
        r'_t = clip(r_t / sqrt(var + eps), -clip, clip)

    The rewards are only divided (the mean is not subtracted): a constant offset would change
    which policy is optimal. An episode ends at a termination or a truncation: the next one's
    return starts from 0 either way. (gymnasium 1.0's wrapper and PureJaxRL restart G on the
    step that ends an episode, so that step's G is its reward alone; here G includes it, as in
    gym's and CleanRL's wrapper.)

    Args:
      stats: `RunningStats` of the discounted return, shape () (`init(())`).
      discounted_return: G carried from the previous rollout (0 where an episode just ended),
        [num_envs].
      reward, done: the rollout's rewards and episode ends, [T, num_envs].
      gamma: the discount (a float or a traced scalar).
      axis_name: data-parallel axis; where bound, every step's statistics are those of the
        global batch of environments (`update`).

    Returns:
      `(stats, discounted_return, scaled_reward)`: the statistics after the rollout, G to carry
      into the next one, and the scaled rewards [T, num_envs].
    """
    if reward.shape != done.shape or reward.shape[1:] != discounted_return.shape:
        raise ValueError(f"normalize_rewards: reward {reward.shape} and done {done.shape} "
                         f"must be [T, num_envs] with num_envs = {discounted_return.shape}.")

    def step(carry, rd):
        stats, g = carry
        r, d = rd
        g = r + gamma * g
        stats = update(stats, g, axis_name)
        scaled = jnp.clip(r / jnp.sqrt(stats.var + eps), -clip, clip)
        return (stats, jnp.where(d, 0.0, g)), scaled

    (stats, discounted_return), scaled = jax.lax.scan(
        step, (stats, discounted_return), (reward.astype(jnp.float32), done))
    return stats, discounted_return, scaled
