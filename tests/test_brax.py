"""Brax environments (`brax/<name>`, `common/braxenv.py`) through the rollout every algorithm
uses: time limits kept apart from terminations, with the true final observation, so that GAE
bootstraps a truncated step and not a terminated one; a fresh random start for every episode;
and each algorithm training on one, from Python and through the command line's `main` (in this
process) with evaluation and an HTML video. Skipped where Brax is not installed (`pip install
-e ".[brax]"`; CI installs it). The spring pipeline compiles fastest; what is tested here is
the wrapper, not physics. The tests share the environments they make (`brax_env`).
"""

import functools
import importlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax")

from algos.evaluate import main as evaluate  # noqa: E402
from algos.ppo import main as ppo_main  # noqa: E402
from common.braxenv import BraxParams  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.gae import gae  # noqa: E402
from common.host import checkpoint  # noqa: E402
from common.rollout import reset, rollout  # noqa: E402
from helpers import traces_around_make_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = "spring"
LIMIT, STEPS, ENVS = 20, 64, 4


@functools.cache
def brax_env(name: str, backend: str = BACKEND):
    """`make_env(f"brax/{name}", backend)`, made once for the tests that only read it or build
    programs of it."""
    return make_env(f"brax/{name}", backend)


FRESH_STARTS = [1.0, 0.25]
"""A reset of every environment at every step, and a pool of fresh starts for a quarter of
the transitions (`common/rollout.py`; 64 starts, for the 20-odd episodes that end)."""


@functools.cache
def pendulum_rollout(fresh_starts):
    """64 steps of 4 inverted pendulums with a 20-step time limit: environments 0 and 1 push
    the cart hard (the pole falls: terminations), 2 and 3 do nothing (the pole stays up for
    the whole episode: truncations)."""
    env, _, spec = brax_env("inverted_pendulum")
    params = BraxParams(max_steps_in_episode=LIMIT)

    def policy(key, obs, first, hidden):
        push = jnp.where(jnp.arange(obs.shape[0]) < 2, 1.0, 0.0)[:, None]
        return push, (), hidden

    def run(key):
        key_reset, key_rollout = jax.random.split(key)
        state = reset(env, params, key_reset, ENVS)
        return rollout(env, params, spec, policy, state, key_rollout, STEPS, fresh_starts)

    return jax.tree.map(np.asarray, jax.jit(run)(jax.random.PRNGKey(0))[1])


@pytest.mark.parametrize("fresh_starts", FRESH_STARTS)
def test_a_time_limit_is_a_truncation_and_a_fall_a_termination_with_the_final_observation(
        fresh_starts):
    traj = pendulum_rollout(fresh_starts)
    t = np.arange(STEPS)
    for e in (2, 3):  # upright for the whole episode: every 20th step truncates
        np.testing.assert_array_equal(traj.truncated[:, e], (t + 1) % LIMIT == 0)
        assert not traj.terminated[:, e].any()
    for e in (0, 1):  # pushed over well within the limit
        assert traj.terminated[:, e].sum() >= 3 and not traj.truncated[:, e].any()
        assert traj.episode_length[traj.terminated[:, e], e].max() < LIMIT
    done = traj.terminated | traj.truncated
    # Where an episode goes on, the next observation is the next step's; where it ended, it is
    # the state reached (the pole past its limit, or still up), not the new episode's start.
    np.testing.assert_array_equal(traj.next_obs[:-1][~done[:-1]], traj.obs[1:][~done[:-1]])
    assert not np.isclose(traj.next_obs[:-1][done[:-1]], traj.obs[1:][done[:-1]]).all(-1).any()
    assert (np.abs(traj.next_obs[traj.terminated][:, 1]) > 0.2).all()  # pole angle past 0.2
    assert traj.first[1:][done[:-1]].all() and not traj.first[1:][~done[:-1]].any()
    np.testing.assert_allclose(traj.episode_return[done], traj.episode_length[done])  # 1 a step


@pytest.mark.parametrize("fresh_starts", FRESH_STARTS)
def test_gae_bootstraps_a_truncated_brax_step_and_not_a_terminated_one(fresh_starts):
    traj = pendulum_rollout(fresh_starts)
    value = lambda obs: 1.0 + obs[..., 0] + 2.0 * obs[..., 1]  # noqa: E731  (any function)
    gamma = 0.9
    adv, _ = gae(traj.reward, value(traj.obs), value(traj.next_obs), traj.terminated,
                 traj.truncated, gamma, 0.0)  # lambda 0: A_t is the TD error alone
    bootstrapped = traj.reward + gamma * value(traj.next_obs) - value(traj.obs)
    np.testing.assert_allclose(adv[traj.truncated], bootstrapped[traj.truncated], rtol=1e-5)
    np.testing.assert_allclose(adv[traj.terminated],
                               (traj.reward - value(traj.obs))[traj.terminated], rtol=1e-5)
    assert traj.truncated.any() and traj.terminated.any()


@pytest.mark.parametrize("fresh_starts", FRESH_STARTS)
def test_every_episode_starts_from_a_fresh_random_state(fresh_starts):
    """Brax's AutoResetWrapper would restart each environment from its first start state."""
    traj = pendulum_rollout(fresh_starts)
    for e in range(ENVS):
        starts = traj.obs[traj.first[:, e], e]
        assert len(starts) >= 3
    starts = traj.obs[traj.first]  # across environments too
    assert len({tuple(s) for s in np.round(starts, 6)}) == len(starts), starts
    assert not traj.repeated_start.any()


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_on_an_accelerator_make_env_traces_the_step_the_rollout_then_reuses(monkeypatch,
                                                                          backend):
    """`common.envapi.trace_ahead`, with the accelerator's code path forced on this CPU:
    `make_env` traces one environment's reset and step, and a program of a first state and a
    rollout with the default pool, lowered after it, traces the physics neither time again.
    On a CPU, `make_env` traces nothing."""
    from common.braxenv import BraxEnv

    during, calls = traces_around_make_env(monkeypatch, BraxEnv, backend,
                                           "brax/inverted_pendulum", BACKEND)
    if backend == "tpu":
        assert during == calls == ["reset", "step_env"]  # nothing traced again
    else:  # traced in the program (the CPU's `keeps_keys` also reads a reset's shapes)
        assert during == [] and calls.count("step_env") == 1 and "reset" in calls


@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_each_algorithm_trains_on_a_brax_environment(algo):
    """A2C and IMPALA from Python; PPO from the command line, below (the same `make_train`,
    run in chunks), where the same is checked of its checkpoint."""
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="brax/inverted_pendulum", brax_backend=BACKEND, num_envs=4,
                           num_steps=16, total_timesteps=4 * 16 * 4, normalize_obs=True,
                           normalize_reward=True,
                           **(dict(actor_lag=1) if algo == "impala" else {}))
    state, metrics = jax.jit(module.make_train(config))(jax.random.PRNGKey(0))
    trained(metrics, state.reward_stats.count)


def trained(metrics: dict, reward_count):
    """The losses finite, episodes ended and counted, the rewards normalised."""
    for name, value in metrics.items():
        if name not in ("episodic_return", "episodic_length", "repeated_starts"):
            assert np.isfinite(value).all(), name
    assert np.isfinite(metrics["episodic_return"]).any()  # episodes ended and were counted
    assert float(np.min(reward_count)) > 100  # rewards were normalised


def test_the_command_line_trains_evaluates_and_renders_a_brax_run(tmp_path, capsys):
    """`algos/ppo.py`'s `main` and `algos/evaluate.py`'s, in this process (a real process of
    the command line: `test_algorithms.py`)."""
    ppo_main(["--env-id", "brax/inverted_pendulum", "--brax-backend", BACKEND, "--num-envs",
              "4", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "512",
              "--checkpoint-every", "1", "--log-dir", str(tmp_path)])
    [path] = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files
              if f == "latest.msgpack"]
    record = checkpoint.load(path)
    assert record["config"]["normalize_reward"]  # Brax's preset
    trained(record["metrics"], record["train_state"]["reward_stats"]["count"])
    video = tmp_path / "episode.html"
    evaluate([path, "--episodes", "2", "--capture-video", str(video)])  # as `-m algos.evaluate`
    out = capsys.readouterr().out
    assert "mean return over 1 run(s)" in out
    frames = int(out.split("video: ")[1].split("(")[1].split(" frames")[0])
    assert frames > 1, out
    page = video.read_text()
    assert "<html>" in page and 'id="brax-viewer"' in page, page[:300]


@pytest.mark.subprocess
def test_a_missing_part_of_brax_is_one_line_and_exit_2_before_compiling():
    """A pipeline whose module is not installed (here `mujoco.mjx`, hidden from the process)."""
    hide = ("import sys, runpy; sys.modules['mujoco.mjx'] = None; "
            "sys.argv = ['algos/ppo.py', '--env-id', 'brax/hopper', '--brax-backend', 'mjx']; "
            "runpy.run_path('algos/ppo.py', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: brax/hopper with --brax-backend mjx needs mujoco.mjx, which is "
                      "not installed: pip install -e \".[brax]\""], run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_the_swimmer_runs_on_its_one_pipeline_and_names_it_on_another():
    """Brax's swimmer runs on the generalized pipeline only, and its water forces call
    `jnp.clip(a_min=...)`, which jax 0.10 no longer takes (`common/braxenv.py` gives that
    module a `clip` that does): a kick moves it, every number finite, and the water slows it
    (after ten kicks its summed joint speeds are 8.6, and 17.3 with the water's density and
    viscosity at 0). Asked for another pipeline, `make_env` says which one to pass."""
    import copy

    env, params, _ = brax_env("swimmer", "generalized")
    kick = jnp.ones(env.action_space(params).shape)
    key = jax.random.PRNGKey(0)
    obs, state = jax.jit(env.reset)(key, params)

    @jax.jit
    def ten_kicks(system, state):
        """The first kick's observation and reward, and the summed joint speeds after ten,
        stepped by `env.step_env` with Brax's physics `system` (an argument: one program for
        the swimmer in water and out of it)."""
        swimmer = copy.copy(env)
        swimmer.env = copy.copy(env.env)
        swimmer.env.sys = system

        def kicked(state, _):
            obs, state, reward = swimmer.step_env(key, state, kick, params)[:3]
            return state, (obs, reward)

        state, (obs, reward) = jax.lax.scan(kicked, state, length=10)
        return obs[0], reward[0], jnp.abs(state.brax.pipeline_state.qd).sum()

    wet = env.env.sys
    dry = wet.replace(density=jnp.zeros_like(wet.density),
                      viscosity=jnp.zeros_like(wet.viscosity))
    moved, reward, wet_speed = ten_kicks(wet, state)
    assert np.isfinite(moved).all() and np.isfinite(float(reward))
    assert not np.allclose(moved, obs)
    wet_speed, dry_speed = float(wet_speed), float(ten_kicks(dry, state)[2])
    assert np.isfinite(wet_speed) and 0 < wet_speed < 0.75 * dry_speed, (wet_speed, dry_speed)
    with pytest.raises(ValueError, match="brax/swimmer runs on Brax's generalized physics "
                                         "pipeline only, not positional: pass --brax-backend "
                                         "generalized"):
        make_env("brax/swimmer", "positional")


def test_no_brax_state_keeps_a_key_as_brax_env_declares():
    """`BraxEnv.keeps_keys` is False so that the rollout need not trace a reset to ask
    (`common.rollout.keeps_keys`): the reset of every Brax environment, traced abstractly from
    a typed key, holds no typed key (the swimmer on its generalized pipeline, every other on
    spring: the state's structure is Brax's, the same on every pipeline). Each is made by the
    adapter's `make`, as `make_env` makes it, without the spec `make_env` traces a reset for.
    """
    from common.braxenv import BRAX_ENVS, BRAX_ONLY_ON, make

    for name in BRAX_ENVS:
        env, params = make(f"brax/{name}", BRAX_ONLY_ON.get(name, (BACKEND,))[0])
        assert env.keeps_keys is False
        state = jax.eval_shape(lambda k: env.reset(k, params)[1], jax.random.key(0))
        assert not any(jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                       for x in jax.tree.leaves(state)), name
