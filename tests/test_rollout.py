"""`common.rollout`: termination and truncation kept apart, the true final observation of a
truncated episode, and the finished episodes' statistics."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs import make_env
from common.rollout import (StartPool, finished_episode_stats, pool_segments, reset,
                            restart_from_pool, rollout)
from helpers import all_eqns, inner_jaxprs


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
    _, traj = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 3))(
        state0, jax.random.PRNGKey(1))
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
    _, traj = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 40))(
        state, jax.random.PRNGKey(1))
    assert traj.terminated.any()  # always pushing left drops the pole within ~10 steps
    assert not (traj.terminated & traj.truncated).any()
    assert not traj.truncated.any()


# --- fresh starts from a pool ----------------------------------------------------------------
def restart_reference(done, obs, starts, taken):
    """NumPy: a finished environment takes its own start (its row of `starts`); it is a repeat
    where that environment had taken it already."""
    obs, repeated, taken = obs.copy(), np.zeros(len(done), bool), taken.copy()
    for i in range(len(done)):
        if done[i]:
            obs[i], repeated[i], taken[i] = starts[i], taken[i], True
    return obs, taken, repeated


def test_restart_from_pool_gives_each_environment_its_own_start_and_marks_reuse():
    rng = np.random.default_rng(0)
    starts_obs = rng.normal(size=(6, 3)).astype(np.float32)
    starts = StartPool(jnp.asarray(starts_obs), {"s": jnp.asarray(starts_obs[:, 0] * 10)})
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    restart = jax.jit(restart_from_pool)
    taken = np.zeros(6, bool)
    for done in ([0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1], [0] * 6):
        done = np.array(done, bool)
        want_obs, want_taken, want_repeated = restart_reference(done, obs, starts_obs, taken)
        got_obs, got_state, got_taken, got_repeated = restart(
            jnp.asarray(done), jnp.asarray(obs), {"s": jnp.asarray(obs[:, 0] * 10)}, starts,
            jnp.asarray(taken))
        np.testing.assert_array_equal(got_obs, want_obs)
        np.testing.assert_array_equal(got_state["s"], want_obs[:, 0] * 10)  # state follows obs
        np.testing.assert_array_equal(got_taken, want_taken)
        np.testing.assert_array_equal(got_repeated, want_repeated)
        taken = want_taken
    assert taken.all() and want_repeated.sum() == 0  # the last step: nothing ended


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
    """64 episodes of 5 steps end in 320 transitions; with 1/4, 10 segments of 4 steps, so no
    environment ends two in one segment: none repeats a start."""
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


def test_episodes_shorter_than_a_segment_reuse_its_start_and_say_so():
    """1/16 of 40 steps: 4 segments of 10 steps. Every environment ends its 5-step episodes at
    steps 4 and 9 of each segment: the first restart takes the environment's fresh start,
    the second the same start again, flagged at the step whose episode ended. With 1/5,
    segments of 5 steps, as long as the episodes: none repeats."""
    assert pool_segments(None, 1 / 16, 40) == 4 and pool_segments(None, 1 / 5, 40) == 8
    traj, _ = pendulum_pool_rollout(1 / 16)
    done = traj.truncated
    assert (traj.repeated_start <= done).all()
    ends = np.flatnonzero(done.all(1))
    np.testing.assert_array_equal(ends, np.arange(4, 40, 5))  # all 8 environments together
    np.testing.assert_array_equal(traj.repeated_start[ends],
                                  np.repeat(np.arange(8)[:, None] % 2 == 1, 8, 1))
    _, _, repeated_sum, count = finished_episode_stats(traj)
    assert (float(repeated_sum), float(count)) == (32.0, 64.0)
    # the repeat starts where the segment's first restart started; the next segment afresh
    np.testing.assert_array_equal(traj.obs[10], traj.obs[5])
    assert (traj.obs[15] != traj.obs[5]).all(1).all()
    assert not pendulum_pool_rollout(1 / 5)[0].repeated_start.any()


def test_unstarted_environments_start_from_the_first_rollout_s_pool():
    """`reset` given the rollout's pool leaves the environments unstarted; the first rollout
    starts them from fresh pool starts: real states (the step from them is the ODE's), each
    its own, none reused by the 56 restarts that follow (10 segments of 4 steps)."""
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


def test_the_first_segment_s_starts_are_the_first_states_and_a_restart_there_repeats_one():
    """1/80 of 10 steps: one segment, one start for each environment a rollout. In the first
    rollout that start is the environment's first state, so both restarts of its 5-step
    episodes (steps 4 and 9) reuse it, and say so; the next rollout's segment restarts
    afresh."""
    env, env_params, spec = make_env("Pendulum-v1")
    env_params = env_params.replace(max_steps_in_episode=PENDULUM_LIMIT)
    policy = lambda key, obs, first, h: (jnp.zeros((obs.shape[0], 1)), (), h)  # noqa: E731
    assert pool_segments(env, 1 / 80, 10) == 1
    state = reset(env, env_params, jax.random.PRNGKey(0), 8, fresh_starts=1 / 80, num_steps=10)
    roll = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 10, 1 / 80))
    after, traj = roll(state, jax.random.PRNGKey(1))
    done = np.asarray(traj.truncated)
    np.testing.assert_array_equal(np.flatnonzero(done.all(1)), [4, 9])
    np.testing.assert_array_equal(traj.repeated_start, done)
    obs = np.asarray(traj.obs)
    np.testing.assert_array_equal(obs[5], obs[0])
    np.testing.assert_array_equal(after.obs, obs[0])
    # the second rollout: a fresh start, taken at step 4 (the episode that began at step 0
    # of the first rollout's step 10) and again at step 9
    _, second = roll(after, jax.random.PRNGKey(2))
    np.testing.assert_array_equal(np.asarray(second.repeated_start).sum(0), 1)
    assert (np.asarray(second.obs)[5] != obs[0]).all(1).all()


def outermost_calls(jaxpr, name: str) -> int:
    """The jitted calls named `name` in `jaxpr` and the jaxprs inside it, not counting those
    inside such a call."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == name:
            count += 1
            continue
        count += sum(outermost_calls(inner, name) for inner in inner_jaxprs(eqn))
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


def test_pool_segments_and_the_environments_default():
    assert pool_segments(object(), None, 40) == 0  # gymnax: a reset every step
    assert pool_segments(object(), 1.0, 40) == 0
    # the smallest divisor of num_steps at least F x num_steps
    assert pool_segments(object(), 0.25, 40) == 10
    assert pool_segments(object(), 1 / 16, 10) == 1
    assert pool_segments(object(), 1 / 16, 480) == 30
    assert pool_segments(object(), 0.3, 10) == 5
    assert pool_segments(object(), 1e-6, 40) == 1
    assert pool_segments(object(), 1 / 16, 1) == 0  # a start for every step
    assert pool_segments(object(), 0.9, 10) == 0
    assert pool_segments(object(), 0.5, 7) == 0  # 7 is prime

    class Dear:
        fresh_starts = 1 / 16

    assert pool_segments(Dear(), None, 40) == 4


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
    assert len(counted.calls) == 1  # the segments' reset (2 segments x 3 starts) reused the trace


@pytest.mark.parametrize("fresh_starts", [0.25, 1 / 16, 1 / 80])
def test_on_a_tpu_only_a_first_segment_starts_unstarted_environments_with_the_same_numbers(
        monkeypatch, fresh_starts):
    """On a TPU a segment starts the environments `reset` left unstarted under a conditional
    on its index (only a first segment can find any); traced for a TPU here, two rollouts from
    unstarted environments must give exactly what the CPU's unconditional select gives (10, 4
    and 1 segments of Pendulum's 5-step episodes: no restarts repeated, half, most). A GPU
    keeps the select."""
    env, env_params, spec = make_env("Pendulum-v1")
    env_params = env_params.replace(max_steps_in_episode=PENDULUM_LIMIT)
    policy = lambda key, obs, first, h: (  # noqa: E731
        jax.random.uniform(key, (obs.shape[0], 1), minval=-3.0, maxval=3.0), (), h)

    def two(key):
        state = reset(env, env_params, key, 8, fresh_starts=fresh_starts, num_steps=40)
        after, first = rollout(env, env_params, spec, policy, state, jax.random.fold_in(key, 1),
                               40, fresh_starts)
        return after, first, rollout(env, env_params, spec, policy, after,
                                     jax.random.fold_in(key, 2), 40, fresh_starts)

    def traced_for(backend):  # a new function each time: JAX keeps a function's traces
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        traced = jax.jit(lambda key: two(key)).trace(jax.random.PRNGKey(0))
        conds = sum(e.primitive.name == "cond" for e in all_eqns(traced.jaxpr.jaxpr))
        if backend == "gpu":  # counted only
            return conds, None
        return conds, jax.tree.map(np.asarray, traced.lower().compile()(jax.random.PRNGKey(0)))

    (cpu_conds, cpu), (tpu_conds, tpu) = traced_for("cpu"), traced_for("tpu")
    for got, want in zip(jax.tree.leaves(tpu), jax.tree.leaves(cpu)):
        np.testing.assert_array_equal(got, want)
    assert tpu[1].first[0].all() and (np.abs(tpu[1].obs[0]).sum(1) > 0).all()  # started
    repeated = tpu[1].repeated_start.sum() + tpu[2][1].repeated_start.sum()
    assert (repeated > 0) == (fresh_starts < 0.25)
    assert tpu_conds == cpu_conds + 2  # one in each rollout's loop over segments
    assert traced_for("gpu")[0] == cpu_conds
