"""The rollout: step a batch of gymnax environments for `num_steps` with one `lax.scan`.

gymnax 1.0 resets an environment automatically inside `step` and reports how the episode
ended in two flags, `terminated` (a terminal state: no bootstrap) and `truncated` (a time
limit: bootstrap from the observation the step really reached, `info["final_observation"]`).
The rollout keeps the two apart and records that final observation as `next_obs`, so the
advantage functions (`common/gae.py`, `common/vtrace.py`) can treat time limits correctly;
`bootstrap_values` gives them V of it, valuing only the observations the policy has not.

A recurrent policy's state rides in the same carry (`EnvState.hidden`, one per environment):
the policy gets it with a flag `first` that marks the first observation of an episode, and
resets it there itself, so a state never leaks across an automatic reset.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from common.envs import EnvSpec, to_env_action
from common.scan import packed_scan
from common.validate import check_time_major


class EnvState(NamedTuple):
    """What the rollout carries from one call to the next."""

    env_state: Any
    """gymnax state of each environment, leading axis [num_envs]."""
    obs: jax.Array
    """Current observation of each environment, [num_envs, *obs_shape], float32."""
    episode_return: jax.Array
    """Undiscounted return of each environment's current episode so far, [num_envs]."""
    episode_length: jax.Array
    """Steps taken in each environment's current episode so far, [num_envs], int32."""
    discounted_return: jax.Array
    """Discounted return of each environment's current episode, [num_envs]: kept by the
    optional reward normalisation (`common/normalize.py`), carried unchanged by `rollout`."""
    hidden: Any = None
    """The policy's recurrent state for each environment, a pytree with leading axis
    [num_envs] (None for a feed-forward policy): what the policy returned at the last step."""


class Trajectory(NamedTuple):
    """Time-major transitions, every field shaped [num_steps, num_envs, ...]."""

    obs: jax.Array
    """s_t, the observation the action was chosen from."""
    first: jax.Array
    """bool: s_t is the first observation of an episode (a reset came before it)."""
    action: jax.Array
    """a_t as the policy produced it (before clipping to a Box space's bounds)."""
    reward: jax.Array
    """r_t."""
    terminated: jax.Array
    """bool: s_{t+1} is terminal."""
    truncated: jax.Array
    """bool: a time limit ended the episode at step t (and it did not terminate)."""
    next_obs: jax.Array
    """s_{t+1} before any automatic reset: the final observation where the episode ended."""
    policy_info: Any
    """Whatever the policy returned beside the action (log-probabilities, values, ...)."""
    episode_return: jax.Array
    """Return of the episode that ended at step t; meaningful only where it ended."""
    episode_length: jax.Array
    """Length of the episode that ended at step t; meaningful only where it ended."""


def reset(env, env_params, key, num_envs: int, hidden=None) -> EnvState:
    """Reset `num_envs` environments with independent keys; `hidden`: a recurrent policy's
    initial state, leading axis [num_envs] (None for a feed-forward policy)."""
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(key, num_envs), env_params)
    zeros = jnp.zeros((num_envs,), jnp.float32)
    return EnvState(env_state, obs.astype(jnp.float32), zeros, jnp.zeros((num_envs,), jnp.int32),
                    zeros, hidden)


def rollout(env, env_params, spec: EnvSpec, policy: Callable, state: EnvState, key,
            num_steps: int):
    """Act `num_steps` times in every environment.

    Args:
      env, env_params, spec: from `common.envs.make_env`.
      policy: `policy(key, obs, first, hidden) -> (action, policy_info, hidden)` for a batch
        `obs` [num_envs, ...], `first` [num_envs] bool (obs starts an episode) and the
        recurrent state `state.hidden` (None for a feed-forward policy, which returns it
        unchanged); `policy_info` is any pytree with leading axis [num_envs] (e.g. log-prob
        and value).
      state: the `EnvState` to continue from.
      key: PRNG key for action sampling and environment steps.
      num_steps: T, the rollout length (static).

    Returns:
      `(state, trajectory)`: the `EnvState` after T steps and a time-major `Trajectory`.
    """
    num_envs = state.obs.shape[0]
    action_shape = env.action_space(env_params).shape
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def one_step(state: EnvState, key):
        key_act, key_env = jax.random.split(key)
        first = state.episode_length == 0
        action, policy_info, hidden = policy(key_act, state.obs, first, state.hidden)
        env_action = to_env_action(action, spec, action_shape)
        obs, env_state, reward, terminated, truncated, info = step_env(
            jax.random.split(key_env, num_envs), state.env_state, env_action, env_params)
        terminated = terminated.astype(bool)
        truncated = jnp.logical_and(truncated.astype(bool), ~terminated)
        done = jnp.logical_or(terminated, truncated)
        reward = reward.astype(jnp.float32)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        transition = Trajectory(
            obs=state.obs, first=first, action=action, reward=reward, terminated=terminated,
            truncated=truncated, next_obs=info["final_observation"].astype(jnp.float32),
            policy_info=policy_info, episode_return=episode_return,
            episode_length=episode_length)
        state = EnvState(env_state, obs.astype(jnp.float32),
                         jnp.where(done, 0.0, episode_return), jnp.where(done, 0, episode_length),
                         state.discounted_return, hidden)
        return state, transition

    # = lax.scan(one_step, ...), with the carry and the transitions packed (speed on CPU only)
    return packed_scan(one_step, state, jax.random.split(key, num_steps))


def bootstrap_values(value_fn: Callable, values, next_inputs, truncated,
                     time_limit: int | None):
    r"""V(s'_t), the value of the observation each step t of a rollout led to, [T, N].

    Inside an episode s'_t = s_{t+1}, whose value the rollout already has (`values[t+1]`).
    Only at a truncation, and at the rollout's last step, is s'_t an observation the policy
    has not valued, so `value_fn` runs only there. Where the episode terminated, every
    estimator multiplies V(s'_t) by 1 - terminated_t; `values[t+1]` stands in, finite.

    With a time limit of L steps, an environment truncates at most ceil((T-1)/L) times in
    steps 0..T-2, so `value_fn` needs at most K = N (ceil((T-1)/L) + 1) inputs, gathered into
    one call (PPO on CartPole, T = 128, N = 4, L = 500: 8 inputs instead of 512). Without a
    known limit, or when K >= T N, it runs on all T N. gymnax's environments truncate when
    their step counter reaches L (`is_truncated`), and so does `common/braxenv.py`; one that
    truncated more often would get NaN values here, and a run stops at the NaN guard instead
    of learning from wrong targets.

    Args:
      value_fn: `next_inputs` with the [T, N] axes gathered to [K] -> V, [K].
      values: V(s_t) [T, N] from the same function (the same parameters and normalisation).
      next_inputs: a pytree of [T, N, ...] arrays: what `value_fn` takes for s'_t (the
        observation before any reset; a recurrent core's state after s_t).
      truncated: bool [T, N]: a time limit ended the episode at step t.
      time_limit: L, `EnvSpec.time_limit` (None: unknown).

    Returns:
      V(s'_t) [T, N], a target: no gradient flows through it.
    """
    values = jnp.asarray(values)
    check_time_major("bootstrap_values", values, truncated=truncated)
    if values.ndim != 2:
        raise ValueError(f"bootstrap_values: `values` has shape {values.shape}, expected "
                         "[T, N] (time-major, one axis of environments).")
    steps, envs = values.shape
    flat = lambda x: x.reshape((steps * envs,) + x.shape[2:])  # noqa: E731
    size = None if time_limit is None else envs * (-(-(steps - 1) // time_limit) + 1)
    if size is None or size >= steps * envs:
        return lax.stop_gradient(value_fn(jax.tree.map(flat, next_inputs)).reshape(steps, envs))
    needed = jnp.asarray(truncated, bool).at[-1].set(True).reshape(-1)
    (index,) = jnp.nonzero(needed, size=size, fill_value=steps * envs)  # fill: out of range
    gathered = jax.tree.map(lambda x: jnp.take(flat(x), index, axis=0, mode="clip"), next_inputs)
    inside = jnp.concatenate([values[1:], values[-1:]]).reshape(-1)  # V(s_{t+1}); last row: any
    out = inside.at[index].set(value_fn(gathered), mode="drop").reshape(steps, envs)
    # More truncations than the limit allows (an environment that breaks its own time limit):
    # NaN, which stops a run at the NaN guard, rather than targets silently wrong.
    return lax.stop_gradient(jnp.where(jnp.sum(needed) > size, jnp.nan, out))


def finished_episode_stats(trajectory: Trajectory):
    """Sum and count of the episodes that finished in `trajectory`.

    Returns `(return_sum, length_sum, count)` as scalars; divide the sums by `count` for the
    means (NaN when no episode finished). Sums rather than means so that several devices can
    add theirs before dividing.
    """
    done = jnp.logical_or(trajectory.terminated, trajectory.truncated)
    return (jnp.sum(jnp.where(done, trajectory.episode_return, 0.0)),
            jnp.sum(jnp.where(done, trajectory.episode_length, 0)).astype(jnp.float32),
            jnp.sum(done).astype(jnp.float32))
