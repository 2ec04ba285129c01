"""Evaluation of a deterministic policy: pure, jittable, vmappable.

`evaluate` plays one episode in each of `num_episodes` fresh environments with a deterministic
policy (each algorithm's `train.act`: the mode of its action distribution, carrying a
recurrent policy's state through the episode) and returns the undiscounted returns;
`record_episode` records one episode for a video. The training command line calls `evaluate`
between chunks (`--eval-every`), `python -m algos.evaluate` on a saved run.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from common.envapi import EnvSpec, to_env_action


class _Carry(NamedTuple):
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    done: jax.Array
    hidden: Any
    key: jax.Array
    t: jax.Array


def evaluate(act: Callable, env, env_params, spec: EnvSpec, key, num_episodes: int,
             max_steps: int | None = None, hidden=None):
    """The return of one episode in each of `num_episodes` fresh environments.

    Args:
      act: `act(obs, first, hidden) -> (action, hidden)` for a batch of observations
        [num_episodes, *obs_shape] (float32), deterministic (e.g. the mode of the policy);
        `first` [num_episodes] bool marks an episode's first observation, `hidden` is a
        recurrent policy's state (None for a feed-forward one).
      env, env_params, spec: from `common.envs.make_env`.
      key: PRNG key of the environments' resets and transitions.
      num_episodes: K, environments played in parallel, one episode each (static).
      max_steps: stop after this many steps even if an episode has not ended (default: the
        environment's own time limit, `env_params.max_steps_in_episode`, which always ends it).
      hidden: the recurrent state to start from, leading axis [num_episodes] (a policy resets
        it at the first step), or None.

    Returns:
      `(episode_return, episode_length)`, each [K]: the undiscounted return and length of
      each environment's first episode.
    """
    if max_steps is None:
        max_steps = int(env_params.max_steps_in_episode)
    action_shape = env.action_space(env_params).shape
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    key_reset, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(key_reset, num_episodes), env_params)
    zeros = jnp.zeros((num_episodes,), jnp.float32)

    def running(c: _Carry):
        return jnp.logical_and(~jnp.all(c.done), c.t < max_steps)

    def step(c: _Carry):
        key, key_step = jax.random.split(c.key)
        action, hidden = act(c.obs, jnp.full((num_episodes,), c.t == 0), c.hidden)
        action = to_env_action(action, spec, action_shape)
        obs, env_state, reward, terminated, truncated, _ = step_env(
            jax.random.split(key_step, num_episodes), c.env_state, action, env_params)
        live = ~c.done  # environments whose first episode is still going
        return _Carry(env_state, obs.astype(jnp.float32),
                      c.episode_return + jnp.where(live, reward.astype(jnp.float32), 0.0),
                      c.episode_length + live.astype(jnp.int32),
                      c.done | terminated.astype(bool) | truncated.astype(bool), hidden, key,
                      c.t + 1)

    final = lax.while_loop(running, step, _Carry(
        env_state, obs.astype(jnp.float32), zeros, jnp.zeros((num_episodes,), jnp.int32),
        jnp.zeros((num_episodes,), bool), hidden, key, jnp.int32(0)))
    return final.episode_return, final.episode_length


def record_episode(act: Callable, env, env_params, spec: EnvSpec, key,
                   max_steps: int | None = None, hidden=None):
    """One episode for a video: the gymnax state before every step, and the rewards.

    Runs `max_steps` steps (default: the environment's time limit) with a `lax.scan`; the
    episode is the steps up to the first `done`. `act` and `hidden` as for `evaluate`, with
    one environment (`hidden` leading axis [1]). Returns `(states, rewards, done)` with a
    leading time axis [max_steps]; `length = argmax(done) + 1` steps belong to the episode.
    """
    if max_steps is None:
        max_steps = int(env_params.max_steps_in_episode)
    action_shape = env.action_space(env_params).shape
    key_reset, key = jax.random.split(key)
    obs, env_state = env.reset(key_reset, env_params)

    def step(carry, inputs):
        env_state, obs, hidden = carry
        key, t = inputs
        action, hidden = act(obs.astype(jnp.float32)[None], jnp.full((1,), t == 0), hidden)
        action = to_env_action(action[0], spec, action_shape)
        obs, next_state, reward, terminated, truncated, _ = env.step(key, env_state, action,
                                                                    env_params)
        done = jnp.logical_or(terminated, truncated)
        return (next_state, obs, hidden), (env_state, reward.astype(jnp.float32), done)

    _, (states, rewards, done) = lax.scan(
        step, (env_state, obs, hidden), (jax.random.split(key, max_steps), jnp.arange(max_steps)))
    return states, rewards, done
