"""Generalised Advantage Estimation with separate termination and truncation.

Schulman, Moritz, Levine, Jordan, Abbeel (2016), "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", arXiv:1506.02438, eq. (16).

The one change from the paper's formula is that the end of an episode comes in two kinds
(Pardo et al. 2018, "Time Limits in Reinforcement Learning", arXiv:1712.00378):

- `terminated_t`: the environment reached a terminal state. V(terminal) = 0, no bootstrap.
- `truncated_t`: a time limit cut the episode. The state is not terminal, so the TD error
  bootstraps from V(s_{t+1}) of the true next observation, but the trace stops there because
  step t+1 of the rollout belongs to a new episode.
"""

import jax.numpy as jnp
from jax import lax

from common.validate import check_time_major


def gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    r"""Advantages and lambda-returns for a time-major batch of transitions.

        delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   A_T = 0
        G_t     = A_t + V(s_t)

    with `done_t = terminated_t or truncated_t`.

    Args:
      rewards: r_t, shape [T, *batch], for t = 0..T-1.
      values: V(s_t), shape [T, *batch].
      next_values: V(s'_t), shape [T, *batch]: the value of the observation that step t led to,
        taken *before* any automatic reset (gymnax 1.0: `info["final_observation"]`).
      terminated: bool or 0/1, shape [T, *batch]: step t reached a terminal state.
      truncated: bool or 0/1, shape [T, *batch]: a time limit ended the episode at step t.
      gamma: discount, a Python float or a traced scalar.
      gae_lambda: the GAE lambda, a Python float or a traced scalar.

    Returns:
      `(advantages, returns)`, both shape [T, *batch] and the dtype of `values`. Both are
      targets: no gradient flows through them.
    """
    values = jnp.asarray(values)
    check_time_major("gae", values, rewards=rewards, next_values=next_values,
                     terminated=terminated, truncated=truncated)
    shape = values.shape

    dtype = values.dtype
    terminated = jnp.asarray(terminated).astype(bool)
    truncated = jnp.asarray(truncated).astype(bool)
    not_terminated = 1.0 - terminated.astype(dtype)
    not_done = 1.0 - jnp.logical_or(terminated, truncated).astype(dtype)

    deltas = rewards + gamma * not_terminated * next_values - values
    trace = gamma * gae_lambda * not_done

    def backward(advantage_tp1, xs):
        delta_t, trace_t = xs
        advantage_t = delta_t + trace_t * advantage_tp1
        return advantage_t, advantage_t

    _, advantages = lax.scan(backward, jnp.zeros(shape[1:], dtype), (deltas, trace),
                             reverse=True)
    advantages = lax.stop_gradient(advantages)
    return advantages, lax.stop_gradient(advantages + values)
