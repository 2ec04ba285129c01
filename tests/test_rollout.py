"""`common.rollout`: termination and truncation kept apart, the true final observation of a
truncated episode, and the finished episodes' statistics."""

import jax
import jax.numpy as jnp
import numpy as np

from common.envs import make_env
from common.rollout import finished_episode_stats, reset, rollout


def test_rollout_keeps_truncation_apart_and_records_final_observation():
    env, env_params, spec = make_env("CartPole-v1")
    env_params = env_params.replace(max_steps_in_episode=5)
    # Keep the pole up: push towards the side the pole leans (never terminates in 5 steps).
    policy = lambda key, obs, first, h: (  # noqa: E731
        (obs[:, 2] > 0).astype(jnp.int32), obs[:, 0] * 0, h)
    state = reset(env, env_params, jax.random.PRNGKey(0), 3)
    state, traj = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 12))(
        state, jax.random.PRNGKey(1))
    done_steps = [4, 9]
    for t in range(12):
        assert not traj.terminated[t].any()
        assert traj.truncated[t].all() == (t in done_steps)
    for t in done_steps:
        np.testing.assert_array_equal(traj.episode_length[t], 5)
        # The next observation of a truncated step is the true final state, not the reset one.
        assert not np.allclose(traj.next_obs[t], traj.obs[t + 1])
        # (that it is the state the environment really reached: the next test replays it)
    for t in range(11):
        if t not in done_steps:
            np.testing.assert_array_equal(traj.next_obs[t], traj.obs[t + 1])
    np.testing.assert_allclose(traj.episode_return[4], 5.0)
    ret_sum, len_sum, count = finished_episode_stats(traj)
    assert (float(ret_sum), float(len_sum), float(count)) == (30.0, 30.0, 6.0)


def test_rollout_final_observation_is_the_true_next_state():
    env, env_params, spec = make_env("CartPole-v1")
    env_params = env_params.replace(max_steps_in_episode=3)
    policy = lambda key, obs, first, h: (  # noqa: E731
        jnp.zeros(obs.shape[0], jnp.int32), obs[:, 0] * 0, h)
    state0 = reset(env, env_params, jax.random.PRNGKey(0), 1)
    _, traj = rollout(env, env_params, spec, policy, state0, jax.random.PRNGKey(1), 3)
    # Step the same environment by hand with gymnax's own step_env (no auto-reset).
    s = jax.tree.map(lambda x: x[0], state0.env_state)
    for t in range(3):
        obs, s, *_ = env.step_env(jax.random.PRNGKey(0), s, 0, env_params)
    np.testing.assert_allclose(traj.next_obs[2, 0], obs, rtol=1e-6)
    assert bool(traj.truncated[2, 0]) and not bool(traj.terminated[2, 0])


def test_rollout_terminates_without_truncation_flag():
    env, env_params, spec = make_env("CartPole-v1")
    policy = lambda key, obs, first, h: (  # noqa: E731
        jnp.zeros(obs.shape[0], jnp.int32), obs[:, 0] * 0, h)
    state = reset(env, env_params, jax.random.PRNGKey(0), 2)
    _, traj = rollout(env, env_params, spec, policy, state, jax.random.PRNGKey(1), 40)
    assert traj.terminated.any()  # always pushing left drops the pole within ~10 steps
    assert not (traj.terminated & traj.truncated).any()
    assert not traj.truncated.any()
