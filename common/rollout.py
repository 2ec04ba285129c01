"""The rollout: step a batch of gymnax environments for `num_steps` with one `lax.scan`.

gymnax 1.0 resets an environment automatically inside `step` and reports how the episode
ended in two flags, `terminated` (a terminal state: no bootstrap) and `truncated` (a time
limit: bootstrap from the observation the step really reached, `info["final_observation"]`).
The rollout keeps the two apart and records that final observation as `next_obs`, so the
advantage functions (`common/gae.py`, `common/vtrace.py`) can treat time limits correctly.

A recurrent policy's state rides in the same carry (`EnvState.hidden`, one per environment):
the policy gets it with a flag `first` that marks the first observation of an episode, and
resets it there itself, so a state never leaks across an automatic reset.

Fresh starts from a pool (`fresh_starts` < 1): gymnax's automatic reset draws a fresh start
for every environment at every step and keeps it where an episode ended; where a reset runs
physics (Brax, MJX) most of that work is thrown away. With a pool, the rollout splits its
num_steps into K segments of L steps (`pool_segments`). Each segment draws one fresh start
for every environment (one batched `env.reset`), steps without resetting (`env.step_env`,
`env.is_truncated`), and restarts an environment whose episode ends from its own start. Every
episode still starts from an independent draw of `env.reset`'s distribution, except a
repeat (`Trajectory.repeated_start`, the `repeated_starts` metric): a second episode ending
in the same segment, which only an episode shorter than L steps (or an environment's first,
of L steps or fewer) can cause. `reset` leaves the environments unstarted and the first
segment starts them from its starts (on a TPU under a conditional only that segment enters),
so the program holds one batched reset. A restart is a select between an environment's own
start and its state, never a gather across environments: on a TPU v5e a gather cost Brax
Ant more than its reset (docs/performance.md).
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from common.envapi import EnvSpec, jitted, per_env, to_env_action
from common.scan import packed_scan
from common.threefry import raw_keys, straight_keys


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
    repeated_start: jax.Array
    """bool: the episode that ended at step t was followed by a start the rollout's pool had
    already given out (it ran out); always False without a pool."""


class StartPool(NamedTuple):
    """Fresh start states drawn with `env.reset`, leading axis [num_envs]: a segment's starts,
    row i environment i's."""

    obs: jax.Array
    env_state: Any


def reset(env, env_params, key, num_envs: int, hidden=None, fresh_starts: float | None = None,
          num_steps: int | None = None) -> EnvState:
    """Reset `num_envs` environments with independent keys; `hidden`: a recurrent policy's
    initial state, leading axis [num_envs] (None for a feed-forward policy).

    Given the `fresh_starts` and `num_steps` the rollouts will use (the same values must reach
    `rollout`: without a pool nothing starts them), where those give the rollout a pool of
    fresh starts (`pool_segments`), the environments are left unstarted instead
    (`episode_length` -1, zeros of the reset's shapes; `key` unused): the first
    `rollout` starts each from its first segment's start, a draw from `env.reset` like any
    other, so the program holds one batched reset instead of two (XLA's compile of PPO's
    HalfCheetah program on a TPU v5e: about 52 s instead of 56; docs/performance.md).
    """
    zeros = jnp.zeros((num_envs,), jnp.float32)
    keys = jax.random.split(key, num_envs)
    if num_steps is not None and pool_segments(env, fresh_starts, num_steps):
        shapes = jax.eval_shape(jitted(env.reset, env_params), keys[0])  # one's, not batched
        obs, env_state = jax.tree.map(lambda s: jnp.zeros((num_envs,) + s.shape, s.dtype), shapes)
        length = jnp.full((num_envs,), -1, jnp.int32)
    else:
        (obs, env_state), length = per_env(env.reset, env_params)(keys), zeros.astype(jnp.int32)
    return EnvState(env_state, obs.astype(jnp.float32), zeros, length, zeros, hidden)


def pool_segments(env, fresh_starts: float | None, num_steps: int) -> int:
    """K, the segments of a rollout with a pool: the smallest divisor of `num_steps` at least
    `fresh_starts` x `num_steps` (`fresh_starts` in (0, 1]; None: the environment's
    `fresh_starts` attribute, else 1). Each environment draws a start in each segment of
    L = num_steps / K steps. 0, no pool, where L would be 1 (a start for every step:
    `env.step`'s own reset is no dearer).

    1/4 (Brax's default) with 10 steps gives 5 segments of 2; 1/16 with 480 steps 30
    segments of 16; 1/1000 (the Control Suite's) with 480 steps one. A Brax reset costs
    about 2% of a step."""
    if fresh_starts is None:
        fresh_starts = getattr(env, "fresh_starts", 1.0)
    segments = next(k for k in range(1, num_steps + 1)
                    if num_steps % k == 0 and k >= fresh_starts * num_steps)
    return 0 if segments == num_steps else segments


def draw_starts(env, env_params, key, num_envs: int) -> StartPool:
    """A fresh start of `env` for each of `num_envs` environments, from independent keys (one
    batched `env.reset`)."""
    obs, env_state = per_env(env.reset, env_params)(jax.random.split(key, num_envs))
    return StartPool(obs.astype(jnp.float32), env_state)


def restart_from_pool(done, obs, env_state, starts: StartPool, taken):
    """Restart the environments where `done` from their own starts; the others keep `obs`
    and `env_state`.

    Args:
      done: [N] bool, the episodes that ended at this step.
      obs, env_state: [N, ...], what the step reached.
      starts: the segment's `StartPool`, [N, ...]: environment i's start is row i.
      taken: [N] bool, the environments that have taken their start in this segment.

    Returns:
      `(obs, env_state, taken, repeated)`: `taken` | `done`, and `repeated` = `done` &
      `taken`, the restarts from a start given out before.
    """
    obs, env_state = _where_envs(done, starts, obs, env_state)
    return obs, env_state, taken | done, done & taken


def _where_envs(mask, starts: StartPool, obs, env_state):
    """`starts`' rows where `mask` ([N] bool), else `obs`' and `env_state`'s."""
    pick = lambda new, kept: jnp.where(  # noqa: E731
        mask.reshape(mask.shape + (1,) * (kept.ndim - 1)), new, kept)
    return pick(starts.obs, obs), jax.tree.map(pick, starts.env_state, env_state)


def start_unstarted(state: EnvState, starts: StartPool):
    """Start the environments `reset` left unstarted (`episode_length` -1) from `starts`
    ([num_envs, ...], row i for environment i); a no-op after the first segment.

    Returns `(state, unstarted)`: `unstarted` [num_envs] bool, the environments started."""
    unstarted = state.episode_length < 0
    obs, env_state = _where_envs(unstarted, starts, state.obs, state.env_state)
    return state._replace(obs=obs, env_state=env_state,
                          episode_length=jnp.maximum(state.episode_length, 0)), unstarted


def none_taken(state: EnvState, starts: StartPool):
    """`start_unstarted` where no environment is unstarted: `(state, False for each)`."""
    return state, jnp.zeros(state.episode_length.shape, bool)


def keeps_keys(env, env_params, key) -> bool:
    """Whether the state `env.reset` makes from a `common.threefry` key holds a typed key:
    the environment's `keeps_keys` attribute where it has one (an MJX reset takes seconds to
    trace), else found abstractly (`jax.eval_shape`); False where keys are not wrapped."""
    typed = straight_keys(key)
    if typed is key:
        return False
    if hasattr(env, "keeps_keys"):
        return bool(env.keeps_keys)
    state = jax.eval_shape(lambda k: env.reset(k, env_params)[1], typed)
    return any(jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in jax.tree.leaves(state))


def rollout(env, env_params, spec: EnvSpec, policy: Callable, state: EnvState, key,
            num_steps: int, fresh_starts: float | None = None):
    """Act `num_steps` times in every environment.

    Args:
      env, env_params, spec: from `common.envs.make_env`.
      policy: `policy(key, obs, first, hidden) -> (action, policy_info, hidden)` for a batch
        `obs` [num_envs, ...], `first` [num_envs] bool (obs starts an episode) and the
        recurrent state `state.hidden` (None for a feed-forward policy, which returns it
        unchanged); `policy_info` is any pytree with leading axis [num_envs] (e.g. log-prob
        and value).
      state: the `EnvState` to continue from; environments `reset` left unstarted start
        from the first segment's starts (`start_unstarted`).
      key: PRNG key for action sampling and environment steps.
      num_steps: T, the rollout length (static).
      fresh_starts: the pool of fresh starts for the episodes that end (module docstring): a
        start for each environment every 1 / `fresh_starts` steps or so, in (0, 1]; 1:
        `env.step`'s own reset of every environment at every step; None: the environment's
        default (`pool_segments`).

    Returns:
      `(state, trajectory)`: the `EnvState` after T steps and a time-major `Trajectory`.
    """
    num_envs = state.obs.shape[0]
    action_shape = env.action_space(env_params).shape
    segments = pool_segments(env, fresh_starts, num_steps)
    step_env = per_env(env.step_env if segments else env.step, env_params)

    def one_step(starts, carry, keys):
        state, taken = carry
        # the policy's key and one per environment; on CPU hashed in straight-line code
        # (common/threefry.py: the same bits)
        key_act, keys = straight_keys(keys[0]), env_keys(keys[1:])
        first = state.episode_length == 0
        action, policy_info, hidden = policy(key_act, state.obs, first, state.hidden)
        env_action = to_env_action(action, spec, action_shape)
        if segments:  # step without resetting, then restart the finished from their starts
            obs, env_state, reward, terminated, info = step_env(keys, state.env_state,
                                                                env_action)
            truncated = jax.vmap(env.is_truncated, in_axes=(0, None))(env_state, env_params)
            info = {**info, "final_observation": obs}
        else:  # gymnax's step: a fresh reset of every environment, kept where one ended
            obs, env_state, reward, terminated, truncated, info = step_env(
                keys, state.env_state, env_action)
        terminated = terminated.astype(bool)
        truncated = jnp.logical_and(truncated.astype(bool), ~terminated)
        done = jnp.logical_or(terminated, truncated)
        repeated = jnp.zeros_like(done)
        if segments:
            obs, env_state, taken, repeated = restart_from_pool(done, obs, env_state, starts,
                                                                taken)
        reward = reward.astype(jnp.float32)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        transition = Trajectory(
            obs=state.obs, first=first, action=action, reward=reward, terminated=terminated,
            truncated=truncated, next_obs=info["final_observation"].astype(jnp.float32),
            policy_info=policy_info, episode_return=episode_return,
            episode_length=episode_length, repeated_start=repeated)
        state = EnvState(env_state, obs.astype(jnp.float32),
                         jnp.where(done, 0.0, episode_return), jnp.where(done, 0, episode_length),
                         state.discounted_return, hidden)
        return (state, taken), transition

    def segment(state, xs):
        """Steps with the same starts, `packed_scan` = lax.scan with the carry and the
        transitions packed (speed on CPU only). With a pool, the segment first draws each
        environment's start (one batched reset) and starts the environments `reset` left
        unstarted from it: they have taken their start."""
        index, key_starts, keys = xs
        starts = taken = None
        if segments:
            starts = draw_starts(env, env_params, key_starts, num_envs)
            if jax.default_backend() != "tpu":
                state, taken = start_unstarted(state, starts)
            else:  # only a first segment can find environments unstarted: a select of every
                # environment's state in each segment cost a TPU v5e 0.8 ms of Brax Ant's
                # update (docs/performance.md). The segment's index is no seed's: under `vmap` the
                # conditional stays one. (A GPU reads a conditional's predicate back to the
                # host, so there it may cost more than the select; not measured.)
                state, taken = lax.cond(index == 0, start_unstarted, none_taken, state, starts)
        (state, _), trajectory = packed_scan(functools.partial(one_step, starts),
                                             (state, taken), keys)
        return state, trajectory

    # Every step's keys, drawn before the loop in one call: [T, 1 + N] (a hash inside the loop
    # is a chain of dependent operations, at every step)
    if segments:
        key, key_pool = jax.random.split(key)
    step_keys = raw_keys(jax.random.split(straight_keys(key), (num_steps, 1 + num_envs)))
    # An environment whose state keeps a key (Playground's `info["rng"]`) gets JAX's own keys,
    # so that its state holds the raw keys the carry holds.
    env_keys = (lambda keys: keys) if keeps_keys(env, env_params, key) else straight_keys
    if not segments:
        return segment(state, (None, None, step_keys))
    step_keys = step_keys.reshape((segments, num_steps // segments) + step_keys.shape[1:])
    state, trajectory = lax.scan(segment, state, (
        jnp.arange(segments), jax.random.split(key_pool, segments), step_keys))
    return state, jax.tree.map(lambda x: x.reshape((num_steps,) + x.shape[2:]), trajectory)


def finished_episode_stats(trajectory: Trajectory):
    """Sums and count of the episodes that finished in `trajectory`.

    Returns `(return_sum, length_sum, repeated_sum, count)` as scalars (`repeated_sum`: the
    episodes followed by a repeated pool start); divide the sums by `count` for the means (NaN
    when no episode finished: `repeated_sum / count` is a fraction of restarts, and with no
    restart there is none, as there is no mean return). Sums rather than means so that
    several devices can add theirs before dividing.
    """
    done = jnp.logical_or(trajectory.terminated, trajectory.truncated)
    return (jnp.sum(jnp.where(done, trajectory.episode_return, 0.0)),
            jnp.sum(jnp.where(done, trajectory.episode_length, 0)).astype(jnp.float32),
            jnp.sum(trajectory.repeated_start).astype(jnp.float32),
            jnp.sum(done).astype(jnp.float32))


def steps_done(update, batch_size: int, num_updates: int):
    """Environment steps taken once update number `update` (0, 1, ...) is done:
    `(update + 1) * batch_size`, an int32 where the whole run's `num_updates * batch_size`
    fits in one (JAX without x64 has no int64), else a float32 (exact up to 2^24, then to
    float32's rounding), so that a run past 2^31 steps never counts negative steps."""
    if num_updates * batch_size < 2**31:
        return (update + 1) * batch_size
    return (update + 1).astype(jnp.float32) * batch_size

