"""`common.rollout`: termination and truncation kept apart, the true final observation of a
truncated episode, and the finished episodes' statistics."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs import make_env
from common.rollout import (StartPool, finished_episode_stats, reset, restart_from_pool, rollout,
                            start_pool_size)


def lean_policy(key, obs, first, hidden):
    """CartPole: push towards the side the pole leans (it stays up for a while)."""
    return (obs[:, 2] > 0).astype(jnp.int32), obs[:, 0] * 0, hidden


class Counted:
    """`env` with the calls to its method `name` recorded: the shape of argument `arg` of
    each (one environment's, or a batch's)."""

    keeps_keys = False  # CartPole's state holds no key: no abstract reset to find out

    def __init__(self, env, name: str, arg: int):
        self.env, self.calls = env, []
        method = getattr(env, name)

        def counted(*args):
            self.calls.append(jnp.shape(args[arg]))
            return method(*args)
        setattr(self, name, counted)  # one function, as a bound method is one method

    def __getattr__(self, attr):
        return getattr(self.env, attr)


def test_rollout_keeps_truncation_apart_and_records_final_observation():
    env, env_params, spec = make_env("CartPole-v1")
    env_params = env_params.replace(max_steps_in_episode=5)
    policy = lean_policy  # never terminates in 5 steps
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
    ret_sum, len_sum, repeated_sum, count = finished_episode_stats(traj)
    assert (float(ret_sum), float(len_sum), float(count)) == (30.0, 30.0, 6.0)
    assert float(repeated_sum) == 0.0 and not traj.repeated_start.any()  # no pool: none


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


# --- fresh starts from a pool ----------------------------------------------------------------
def restart_reference(done, obs, pool_obs, used):
    """NumPy: the k-th finished environment, in index order, takes pool entry (used + k) % P."""
    obs, repeated, k = obs.copy(), np.zeros(len(done), bool), 0
    for i in np.flatnonzero(done):
        obs[i] = pool_obs[(used + k) % len(pool_obs)]
        repeated[i] = used + k >= len(pool_obs)
        k += 1
    return obs, used + k, repeated


def test_restart_from_pool_hands_out_each_start_once_in_order_and_marks_reuse():
    rng = np.random.default_rng(0)
    pool_obs = rng.normal(size=(5, 3)).astype(np.float32)
    pool = StartPool(jnp.asarray(pool_obs), {"s": jnp.asarray(pool_obs[:, 0] * 10)})
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    restart = jax.jit(restart_from_pool)
    for done, used in [([0, 1, 0, 1, 1, 0], 0), ([1, 0, 0, 0, 0, 1], 2), ([1, 1, 1, 1, 1, 1], 3),
                       ([0] * 6, 4)]:
        done = np.array(done, bool)
        want_obs, want_used, want_repeated = restart_reference(done, obs, pool_obs, used)
        got_obs, got_state, got_used, got_repeated = restart(
            jnp.asarray(done), jnp.asarray(obs), {"s": jnp.asarray(obs[:, 0] * 10)}, pool,
            jnp.int32(used))
        np.testing.assert_array_equal(got_obs, want_obs)
        np.testing.assert_array_equal(got_state["s"], want_obs[:, 0] * 10)  # state follows obs
        assert int(got_used) == want_used
        np.testing.assert_array_equal(got_repeated, want_repeated)


PENDULUM_LIMIT = 5


def pendulum_pool_rollout(fresh_starts, num_envs=8, num_steps=40, from_pool=False):
    """Pendulum (no terminal states) with a 5-step time limit and random torques; `from_pool`:
    the first states from the rollout's pool, as the algorithms start (`reset`)."""
    env, env_params, spec = make_env("Pendulum-v1")
    env_params = env_params.replace(max_steps_in_episode=PENDULUM_LIMIT)
    policy = lambda key, obs, first, h: (  # noqa: E731
        jax.random.uniform(key, (obs.shape[0], 1), minval=-3.0, maxval=3.0), (), h)

    @jax.jit
    def run(key):
        state = reset(env, env_params, key, num_envs, fresh_starts=fresh_starts,
                      num_steps=num_steps if from_pool else None)
        return rollout(env, env_params, spec, policy, state, jax.random.fold_in(key, 1),
                       num_steps, fresh_starts)[1]

    return jax.tree.map(np.asarray, run(jax.random.PRNGKey(0))), env_params


def pendulum_step_reference(obs, action, p):
    """NumPy, from gymnax's Pendulum: one step of the pendulum ODE from observation
    [cos theta, sin theta, theta_dot] and torque u (clipped to +-max_torque)."""
    theta, theta_dot = np.arctan2(obs[..., 1], obs[..., 0]), obs[..., 2]
    u = np.clip(action[..., 0], -p.max_torque, p.max_torque)
    theta_dot = np.clip(theta_dot + (3 * p.g / (2 * p.l) * np.sin(theta)
                                     + 3.0 / (p.m * p.l ** 2) * u) * p.dt,
                        -p.max_speed, p.max_speed)
    theta = theta + theta_dot * p.dt
    return np.stack([np.cos(theta), np.sin(theta), theta_dot], -1)


def test_pool_restarts_every_episode_afresh_and_keeps_time_limits_truncations():
    """64 episodes end in 320 transitions; a pool for 1/4 of them (8 + 80 starts) holds them
    all."""
    traj, params = pendulum_pool_rollout(0.25)
    t = np.arange(traj.obs.shape[0])[:, None]
    truncations = np.broadcast_to((t + 1) % PENDULUM_LIMIT == 0, traj.truncated.shape)
    np.testing.assert_array_equal(traj.truncated, truncations)  # time limits, as without pool
    assert not traj.terminated.any() and not traj.repeated_start.any()
    np.testing.assert_array_equal(traj.first[1:], truncations[:-1])
    # The next observation is the state the step reached (the ODE), also where the episode was
    # truncated and the environment restarted; elsewhere it is the next step's observation.
    np.testing.assert_allclose(traj.next_obs, pendulum_step_reference(traj.obs, traj.action,
                                                                      params), atol=2e-5)
    np.testing.assert_array_equal(traj.next_obs[:-1][~truncations[:-1]],
                                  traj.obs[1:][~truncations[:-1]])
    # Every episode's start differs from every other's, across steps and environments.
    starts = traj.obs[traj.first]
    assert len(starts) == 8 * 8
    assert len({tuple(s) for s in np.round(starts, 6)}) == len(starts)


def test_pool_starts_follow_the_environments_reset_distribution():
    """gymnax's Pendulum starts at theta ~ U(-pi, pi), theta_dot ~ U(-1, 1): the first states
    (from the pool, as the algorithms start) and the restarts (after the first step) each pass
    Kolmogorov-Smirnov tests against those uniforms."""
    from scipy import stats

    traj, _ = pendulum_pool_rollout(0.25, num_envs=64, num_steps=40, from_pool=True)
    starts = traj.obs[1:][traj.first[1:]]
    assert len(starts) == 64 * 7 and traj.first[0].all()
    for sample in (traj.obs[0], starts):
        theta = np.arctan2(sample[:, 1], sample[:, 0])
        assert stats.kstest(theta, stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > 0.01
        assert stats.kstest(sample[:, 2], stats.uniform(-1, 2).cdf).pvalue > 0.01
    # ... and not the first starts again (Brax's AutoResetWrapper's way)
    assert not np.isin(np.round(starts[:, 2], 6), np.round(traj.obs[0, :, 2], 6)).any()


def test_a_pool_too_small_for_the_episodes_reuses_starts_and_says_so():
    """A pool for 1/16 of 320 transitions (8 + 20 starts, the environments started here by
    `reset`) for 64 episodes: the 36 after the 28th reuse starts, flagged at the steps whose
    episode ended; the first 28 are distinct."""
    traj, _ = pendulum_pool_rollout(1 / 16)
    done = traj.truncated
    assert (traj.repeated_start <= done).all()
    # handed out in time-major order: step by step, environments in index order
    in_order = traj.repeated_start.reshape(-1)[np.flatnonzero(done.reshape(-1))]
    np.testing.assert_array_equal(in_order, [False] * 28 + [True] * 36)
    _, _, repeated_sum, count = finished_episode_stats(traj)
    assert (float(repeated_sum), float(count)) == (36.0, 64.0)


def test_unstarted_environments_start_from_the_first_rollout_s_pool():
    """`reset` given the rollout's pool leaves the environments unstarted; the first rollout
    starts them from fresh pool starts: real states (the step from them is the ODE's), each
    its own, none reused by the 64 restarts that follow (8 + 64 of the pool's 8 + 80)."""
    env, env_params, spec = make_env("Pendulum-v1")
    env_params = env_params.replace(max_steps_in_episode=PENDULUM_LIMIT)
    policy = lambda key, obs, first, h: (  # noqa: E731
        jax.random.uniform(key, (obs.shape[0], 1), minval=-3.0, maxval=3.0), (), h)
    state = reset(env, env_params, jax.random.PRNGKey(0), 8, fresh_starts=0.25, num_steps=40)
    np.testing.assert_array_equal(state.episode_length, -1)
    roll = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 40, 0.25))
    after, traj = roll(state, jax.random.PRNGKey(1))
    traj = jax.tree.map(np.asarray, traj)
    assert traj.first[0].all() and not traj.repeated_start.any()
    np.testing.assert_allclose(traj.next_obs[0], pendulum_step_reference(
        traj.obs[0], traj.action[0], env_params), atol=2e-5)
    np.testing.assert_array_equal(traj.episode_length[4], 5)  # counted from the pool's start
    starts = traj.obs[traj.first]  # the last step's 8 restarts are the next rollout's
    assert len(starts) == 8 + 56 and len({tuple(s) for s in np.round(starts, 6)}) == len(starts)
    # the next rollout continues them: nothing unstarted any more
    assert (np.asarray(after.episode_length) >= 0).all()
    np.testing.assert_array_equal(roll(after, jax.random.PRNGKey(2))[1].obs[0], after.obs)
    # without a pool (a reset at every step), `reset` starts them itself
    assert (np.asarray(reset(env, env_params, jax.random.PRNGKey(0), 8, fresh_starts=1.0,
                             num_steps=40).episode_length) == 0).all()


def test_the_first_rollout_s_pool_holds_the_first_states_and_its_share_of_restarts():
    """A pool for 1/80 of 8 x 10 transitions: 8 starts for the first states and 1 for the
    episodes that end: of the first rollout's 16, the first restarts afresh, the 15 after it
    reuse starts, and say so."""
    env, env_params, spec = make_env("Pendulum-v1")
    env_params = env_params.replace(max_steps_in_episode=PENDULUM_LIMIT)
    policy = lambda key, obs, first, h: (jnp.zeros((obs.shape[0], 1)), (), h)  # noqa: E731
    assert start_pool_size(env, 1 / 80, 8, 10) == 9
    state = reset(env, env_params, jax.random.PRNGKey(0), 8, fresh_starts=1 / 80, num_steps=10)
    traj = rollout(env, env_params, spec, policy, state, jax.random.PRNGKey(1), 10, 1 / 80)[1]
    done = np.asarray(traj.truncated)
    in_order = np.asarray(traj.repeated_start).reshape(-1)[np.flatnonzero(done.reshape(-1))]
    np.testing.assert_array_equal(in_order, [False] + [True] * 15)


def outermost_calls(jaxpr, name: str) -> int:
    """The jitted calls named `name` in `jaxpr` and the jaxprs inside it, not counting those
    inside such a call."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == name:
            count += 1
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += outermost_calls(inner, name)
    return count


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_an_algorithm_with_a_pool_resets_the_environments_once_in_its_program(algo):
    """With a pool the program holds one batched reset, the pool's (its first states come
    from the first rollout's pool); without one, the first state's (the step resets)."""
    module = importlib.import_module(f"algos.{algo}")
    for fresh_starts, where in ((0.25, "rollout"), (None, "init")):
        config = module.Config(env_id="Pendulum-v1", total_timesteps=8 * 16 * 2, num_envs=8,
                               num_steps=16, fresh_starts=fresh_starts,
                               **({"num_minibatches": 2} if algo != "a2c" else {}))
        train = module.make_train(config)
        program = jax.make_jaxpr(train)(jax.random.PRNGKey(0)).jaxpr
        assert outermost_calls(program, "reset") == 1, (fresh_starts, where)
        init = jax.make_jaxpr(train.init)(jax.random.PRNGKey(0)).jaxpr
        assert outermost_calls(init, "reset") == (where == "init")


def test_pool_size_and_the_environments_default():
    assert start_pool_size(object(), None, 8, 40) == 0  # gymnax: a reset every step
    assert start_pool_size(object(), 1.0, 8, 40) == 0
    # one batch of environments for the first states, and F of the transitions
    assert start_pool_size(object(), 0.25, 8, 40) == 8 + 80
    assert start_pool_size(object(), 1 / 16, 2048, 10) == 2048 + 1280
    assert start_pool_size(object(), 1e-6, 8, 40) == 8 + 1
    assert start_pool_size(object(), 1 / 16, 8, 1) == 0  # more than every transition
    assert start_pool_size(object(), 0.9, 8, 10) == 0  # 8 + 72 starts: as many

    class Dear:
        fresh_starts = 1 / 16

    assert start_pool_size(Dear(), None, 8, 40) == 8 + 20


def test_the_environment_s_python_runs_once_a_rollout_for_one_environment():
    """`per_env`: the environment is traced for one environment under `jax.jit` and the traced
    program batched, so its Python runs once per rollout however often the rollout's step is
    traced (twice on a CPU, where `packed_scan` first reads the carry's shapes)."""
    env, env_params, spec = make_env("CartPole-v1")
    counted = Counted(env, "step", arg=2)  # its action
    state = reset(env, env_params, jax.random.PRNGKey(0), 3)
    jax.jit(lambda s, k: rollout(counted, env_params, spec, lean_policy, s, k, 4)).lower(
        state, jax.random.PRNGKey(1))
    assert counted.calls == [()]  # once, with one environment's (scalar) action


def test_the_first_state_and_the_pool_trace_the_environment_s_reset_once():
    """`per_env` keeps one jitted function per environment method and parameters: the first
    state's reset and the pool's, here in two programs of one process, run the environment's
    Python once (an MJX reset takes seconds to trace)."""
    env, env_params, spec = make_env("CartPole-v1")
    counted = Counted(env, "reset", arg=0)  # its key
    state = jax.jit(lambda k: reset(counted, env_params, k, 3))(jax.random.PRNGKey(0))
    assert len(counted.calls) == 1
    jax.jit(lambda s, k: rollout(counted, env_params, spec, lean_policy, s, k, 4,
                                 fresh_starts=0.5)).lower(state, jax.random.PRNGKey(1))
    assert len(counted.calls) == 1  # the pool's reset (3 + 4 x 3 x 0.5 = 9 starts) reused the trace
