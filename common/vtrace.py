"""V-Trace off-policy value targets and policy-gradient advantages.

Espeholt, Soyer, Munos, Simonyan, Mnih, Ward, Doron, Firoiu, Harley, Dunning, Legg, Kavukcuoglu
(2018), "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", arXiv:1802.01561: the V-Trace target (Sec. 4.1, eq. 1), its recursive form
(Sec. 4.1, Remark 1), the lambda variant (Remark 2), and the policy-gradient advantage of the
V-Trace actor-critic (Sec. 4.2).

Episode ends follow `common/gae.py` (Pardo et al. 2018, arXiv:1712.00378): a termination
means no bootstrap; a truncation bootstraps from V of the true next observation but cuts the
trace, since the next step of the rollout belongs to a new episode.
"""

import jax.numpy as jnp
from jax import lax

from common.validate import check_time_major


def vtrace(log_rhos, rewards, values, next_values, terminated, truncated, gamma, lambda_=1.0,
           rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0):
    r"""V-Trace targets `vs` and policy-gradient advantages for a time-major batch.

    With `rho_t = exp(log_rhos_t)`, `done_t = terminated_t or truncated_t`:

        delta_t  = min(rho_bar, rho_t) * (r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t))
        c_t      = lambda * min(c_bar, rho_t)
        vs_t     = V(s_t) + delta_t + gamma * (1 - done_t) * c_t * (vs_{t+1} - V(s_{t+1})),
                   with vs_T - V(s_T) = 0 beyond the last step
        pg_adv_t = min(pg_rho_bar, rho_t) * (r_t + gamma * (1 - terminated_t) * vs'_{t+1} - V(s_t))

    where `vs'_{t+1} = vs_{t+1}` inside an episode, and `vs'_{t+1} = V(s'_t)` (`next_values_t`)
    at the last step of the rollout or where step t ended an episode. This is Remark 1's
    recursion with Remark 2's `c_t = lambda * min(c_bar, rho_t)`. On-policy (`log_rhos = 0`,
    `rho_bar, c_bar >= 1`) it reduces to `common.gae.gae`: `vs` are the lambda-returns and
    `vs_t - V(s_t)` the GAE advantages (`tests/test_vtrace.py` checks it).

    The policy-gradient target bootstraps from `vs_{t+1}` for every lambda, as Sec. 4.2 writes
    it (DeepMind's original IMPALA implementation, `scalable_agent`'s `vtrace.py`, has no
    lambda and bootstraps from `vs_{t+1}`).
    rlax's `vtrace_td_error_and_advantage` instead bootstraps from
    `lambda * vs_{t+1} + (1 - lambda) * V(s_{t+1})`. The two agree at lambda = 1, the paper's
    V-Trace and this toolkit's default; below 1 this code keeps the paper's target, so that
    lambda only shortens the traces of the value target `vs`, as Remark 2 introduces it
    (`tests/test_vtrace.py` checks both conventions against NumPy loops).

    Args:
      log_rhos: log pi(a_t|s_t) - log mu(a_t|s_t) (target minus behaviour), shape [T, *batch],
        for t = 0..T-1.
      rewards: r_t, shape [T, *batch].
      values: V(s_t), shape [T, *batch].
      next_values: V(s'_t), shape [T, *batch]: the value of the observation that step t led to,
        taken *before* any automatic reset (gymnax 1.0: `info["final_observation"]`).
      terminated: bool or 0/1, shape [T, *batch]: step t reached a terminal state.
      truncated: bool or 0/1, shape [T, *batch]: a time limit ended the episode at step t.
      gamma: discount, a Python float or a traced scalar.
      lambda_: the trace-cutting lambda of Remark 2 (1.0: the paper's V-Trace).
      rho_bar: truncation level of the importance weight in `delta_t` (the paper's rho-bar).
      c_bar: truncation level of the trace coefficients (the paper's c-bar).
      pg_rho_bar: truncation level of the importance weight of the policy gradient.

    Returns:
      `(vs, pg_advantages)`, both shape [T, *batch] and the dtype of `values`. Both are
      targets: no gradient flows through them.
    """
    values = jnp.asarray(values)
    check_time_major("vtrace", values, log_rhos=log_rhos, rewards=rewards,
                     next_values=next_values, terminated=terminated, truncated=truncated)
    shape = values.shape

    dtype = values.dtype
    terminated = jnp.asarray(terminated).astype(bool)
    done = jnp.logical_or(terminated, jnp.asarray(truncated).astype(bool))
    not_terminated = 1.0 - terminated.astype(dtype)
    not_done = 1.0 - done.astype(dtype)
    rho_t = jnp.exp(jnp.asarray(log_rhos, dtype))
    rewards, next_values = jnp.asarray(rewards, dtype), jnp.asarray(next_values, dtype)

    deltas = jnp.minimum(rho_bar, rho_t) * (
        rewards + gamma * not_terminated * next_values - values)
    traces = gamma * not_done * lambda_ * jnp.minimum(c_bar, rho_t)

    def backward(diff_tp1, xs):
        delta_t, trace_t = xs
        diff_t = delta_t + trace_t * diff_tp1
        return diff_t, diff_t

    _, diffs = lax.scan(backward, jnp.zeros(shape[1:], dtype), (deltas, traces), reverse=True)
    vs = diffs + values

    # vs'_{t+1}: vs_{t+1} inside an episode, V(s'_t) at an episode end or the rollout's end.
    vs_tp1 = jnp.concatenate([vs[1:], next_values[-1:]], axis=0)
    vs_tp1 = jnp.where(done, next_values, vs_tp1)
    pg_advantages = jnp.minimum(pg_rho_bar, rho_t) * (
        rewards + gamma * not_terminated * vs_tp1 - values)
    return lax.stop_gradient(vs), lax.stop_gradient(pg_advantages)
