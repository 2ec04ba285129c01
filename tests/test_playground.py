"""MuJoCo Playground's Control Suite (`playground/<Task>`, `common/playgroundenv.py`) through
the rollout every algorithm uses: the time limit a truncation with the true final observation,
every episode a fresh random start (with the pool and without), the actuators' bounds; IMPALA
training through its command line (its `main`, in this process) with a checkpoint, evaluation
and an HTML video; and the bad input of this extra, one line and exit status 2 before
compiling (A2C training and PPO learning from Python: `test_playground_train.py`). The tests
share one environment and the rollouts' two programs (MJX's programs compile slowly on a
CPU). Skipped where Playground is not installed (`pip install -e ".[playground]"`; CI installs
it).
"""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

from mujoco import mjx  # noqa: E402

import algos.evaluate as evaluate_entry  # noqa: E402
from algos.impala import main as impala_main  # noqa: E402
from algos.ppo import main as ppo_main  # noqa: E402
from common.envs import check_env_id, known_env_ids, make_env  # noqa: E402
from common.host import checkpoint, cli  # noqa: E402
from common.playgroundenv import PlaygroundEnv, PlaygroundParams  # noqa: E402
from common.presets import PRESETS  # noqa: E402
from common.rollout import pool_segments, reset, rollout  # noqa: E402
from helpers import traces_around_make_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = "playground/CartpoleBalance"
LIMIT, STEPS, ENVS = 7, 30, 4


def test_on_an_accelerator_make_env_traces_the_step_the_rollout_then_reuses(monkeypatch):
    """`common.envapi.trace_ahead` with the accelerator's code path forced on this CPU: an
    MJX reset and step traced once, in `make_env`, and reused by a program built after it."""
    during, calls = traces_around_make_env(monkeypatch, PlaygroundEnv, "tpu", TASK)
    assert during == calls == ["reset", "step_env"]


@functools.cache
def cartpole():
    """`make_env(TASK)`, made once for the tests that only read it or build programs of it."""
    return make_env(TASK)


@functools.cache
def cartpole_rollout(fresh_starts):
    """30 steps of 4 cart-poles with a 7-step time limit and random pushes: `(the first state,
    the trajectory)`, NumPy arrays."""
    env, _, spec = cartpole()
    params = PlaygroundParams(max_steps_in_episode=LIMIT)

    def policy(key, obs, first, hidden):
        return jax.random.uniform(key, (obs.shape[0], 1), minval=-2.0, maxval=2.0), (), hidden

    def run(key):
        state = reset(env, params, key, ENVS)
        return state, rollout(env, params, spec, policy, state, jax.random.fold_in(key, 1),
                              STEPS, fresh_starts)[1]

    return jax.tree.map(np.asarray, jax.jit(run)(jax.random.PRNGKey(0)))


@pytest.mark.parametrize("fresh_starts", [1.0, 0.25])
def test_the_time_limit_is_a_truncation_with_the_final_observation_and_starts_are_fresh(
        fresh_starts):
    _, traj = cartpole_rollout(fresh_starts)
    t = np.arange(STEPS)[:, None]
    limit = np.broadcast_to((t + 1) % LIMIT == 0, traj.truncated.shape)
    np.testing.assert_array_equal(traj.truncated, limit)  # nothing goes NaN: no termination
    assert not traj.terminated.any() and not traj.repeated_start.any()
    assert ((traj.reward >= 0) & (traj.reward <= 1)).all()  # the suite's rewards
    np.testing.assert_array_equal(traj.first[1:], limit[:-1])
    # where the episode goes on, the next observation is the next step's; where it was cut,
    # the state the step reached, which is not the new episode's start
    np.testing.assert_array_equal(traj.next_obs[:-1][~limit[:-1]], traj.obs[1:][~limit[:-1]])
    assert not np.isclose(traj.next_obs[:-1][limit[:-1]], traj.obs[1:][limit[:-1]]).all(-1).any()
    starts = traj.obs[traj.first]
    assert len(starts) == ENVS * 5
    assert len({tuple(s) for s in np.round(starts, 6)}) == len(starts)  # all different
    # Playground's own reset draws the cart within +-0.1 (and the pole near upright)
    assert (np.abs(starts[:, 0]) <= 0.1).all() and (starts[:, 1] > 0.99).all()


def test_the_final_observation_is_what_playgrounds_own_step_reaches():
    """Step the rollout's first environment by hand with Playground's `step` (no wrapper),
    from the state the rollout started from and with the pushes it made (clipped to the
    actuator's range, as the rollout clips them): every observation of its first episode and
    the truncated 7th step's final one agree."""
    start, traj = cartpole_rollout(1.0)
    env, _, spec = cartpole()
    s = jax.tree.map(lambda x: x[0], start.env_state.mjx)
    step = jax.jit(env.env.step)
    for t in range(LIMIT):
        s = step(s, np.clip(traj.action[t, 0], spec.action_low, spec.action_high))
        np.testing.assert_allclose(traj.next_obs[t, 0], s.obs, rtol=1e-5, atol=1e-6)
    assert traj.truncated[LIMIT - 1, 0] and not traj.terminated[LIMIT - 1, 0]
    assert not traj.truncated[:LIMIT - 1, 0].any()


def test_spaces_policy_observation_and_presets():
    env, params, spec = cartpole()
    assert spec.obs_shape == (5,) and not spec.discrete and spec.action_dim == 1
    assert (spec.action_low, spec.action_high) == ((-1.0,), (1.0,))  # actuator_ctrlrange
    assert params.max_steps_in_episode == 1000  # the suite's episode_length
    # episodes end at the time limit only: one batch of starts per rollout of up to 1,000
    # steps (CheetahRun's reset steps the physics 200 times; 30 batches made it 7.5x slower)
    assert [pool_segments(env, None, n) for n in (64, 480, 1000, 2000)] == [1, 1, 1, 2]
    assert env.fresh_starts == 1 / 1000 and PlaygroundEnv.fresh_starts == 1 / 16
    assert PlaygroundEnv.policy_obs({"state": 1, "privileged_state": 2}) == 1
    control = [i for i in known_env_ids() if i.startswith("playground/")]
    assert len(control) == 25 and "playground/WalkerWalk" in control
    for env_id in control:
        assert ("ppo", env_id) in PRESETS
    assert PRESETS[("ppo", "playground/FingerSpin")]["gamma"] == 0.95
    assert PRESETS[("ppo", "playground/WalkerRun")]["total_timesteps"] == 100_000_000


@pytest.mark.parametrize("env_id, message", [
    ("playground/CartpoleBalanse", "unknown Playground task 'CartpoleBalanse'. Did you mean "
     "playground/CartpoleBalance"),
    ("playground/Go1JoystickFlatTerrain", "playground/Go1JoystickFlatTerrain is a locomotion "
     "task, whose robot models (MuJoCo Menagerie) are not installed"),
    ("playground/PandaPickCube", "playground/PandaPickCube is a manipulation task"),
])
def test_a_task_this_machine_cannot_make_is_refused_by_name(env_id, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_env_id(env_id)


@pytest.mark.parametrize("args, message", [
    (["--env-id", "playground/WalkerWalks"], "error: unknown Playground task 'WalkerWalks'. "
     "Did you mean playground/WalkerWalk"),
    (["--env-id", "playground/BerkeleyHumanoidJoystickFlatTerrain"],
     "error: playground/BerkeleyHumanoidJoystickFlatTerrain is a locomotion task"),
])
def test_bad_playground_input_is_one_line_and_exit_2_before_compiling(args, message, capsys,
                                                                      monkeypatch):
    """`algos/ppo.py`'s `main` in this process, as `test_bad_input.py`'s catalogue runs it:
    the run's programs never compile. (Playground missing: a fresh process, below.)"""
    def compiled(*_, **__):
        raise AssertionError(f"{args} went on to compile before refusing")

    monkeypatch.setattr(cli, "compile_programs", compiled)
    with pytest.raises(SystemExit) as exit_info:
        ppo_main(args)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(message), err[-2000:]
    assert "Traceback" not in err and "step" not in out


@pytest.mark.subprocess
def test_without_playground_a_playground_task_is_one_line_and_exit_2_before_compiling():
    """A fresh process in which `mujoco_playground` cannot be imported or found."""
    code = ("import sys, runpy; sys.modules['mujoco_playground'] = None; "
            "import importlib.util as u; find = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'mujoco_playground' else find(n, *a); "
            "sys.argv = ['algos/ppo.py', '--env-id', 'playground/CartpoleBalance']; "
            "runpy.run_path('algos/ppo.py', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: playground/CartpoleBalance needs MuJoCo Playground, which is not "
                      "installed: pip install -e \".[playground]\""], run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "step" not in run.stdout


def test_impala_trains_from_the_command_line_checkpoints_evaluates_and_renders(
        tmp_path, capsys, monkeypatch):
    """IMPALA's command line (`algos/impala.py`'s `main`) and `algos/evaluate.py`'s, in this
    process (a real process of the command line: `test_algorithms.py`): IMPALA trains on the
    task (its Python training test: the losses finite, the rewards normalised; A2C's and PPO's
    are in `test_playground_train.py`), the checkpoint holds MJX's data, which the
    evaluation's restore puts back into MJX's own types."""
    impala_main(["--env-id", TASK, "--num-envs", "4", "--num-minibatches", "2", "--num-steps",
                 "16", "--total-timesteps", "512", "--checkpoint-every", "4", "--log-dir",
                 str(tmp_path)])
    [path] = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files
              if f == "latest.msgpack"]
    record = checkpoint.load(path)
    config = record["config"]  # the preset, under the flags given
    assert config["gamma"] == 0.995 and config["actor_lag"] == 1 and config["normalize_reward"]
    for name, value in record["metrics"].items():
        if name not in ("episodic_return", "episodic_length", "repeated_starts"):
            assert np.isfinite(value).all(), name
    assert np.asarray(record["metrics"]["learning_rate"]).size == 8  # 8 updates of 64 steps
    assert float(np.min(record["train_state"]["reward_stats"]["count"])) > 100
    # MJX's data (a dataclass flax does not know) is in the checkpoint, field by field
    qpos = record["train_state"]["env"]["env_state"]["mjx"]["data"]["qpos"]
    assert np.asarray(qpos).shape == (1, 4, 2)  # [seeds, envs, nq]
    restored = []  # what the evaluation's restore_run gives back: (config, seeds, train, state)
    restore_run = evaluate_entry.restore_run
    monkeypatch.setattr(evaluate_entry, "restore_run",
                        lambda *args: restored.append(restore_run(*args)) or restored[-1])
    video = tmp_path / "episode.html"
    evaluate_entry.main([path, "--episodes", "2", "--capture-video", str(video)])
    out = capsys.readouterr().out
    assert "mean return over 1 run(s)" in out
    frames = int(out.split("video: ")[1].split("(")[1].split(" frames")[0])
    assert frames == 1000, out  # the balance never fails: the whole 1000 steps
    page = video.read_text()
    assert "<html>" in page and 'id="brax-viewer"' in page, page[:300]
    [(_, _, _, state)] = restored  # back into MJX's types, from the checkpoint's numbers
    assert type(state.env.env_state.mjx.data) is mjx.Data
    np.testing.assert_array_equal(state.env.env_state.mjx.data.qpos, qpos)


def test_playground_declares_that_its_state_keeps_its_key_as_a_traced_reset_shows():
    """`PlaygroundEnv.keeps_keys` spares the rollout an abstract MJX reset (seconds of
    tracing); it must say what that reset shows: a state holding the typed key it was given."""
    from common.threefry import THREEFRY

    env, params, _ = cartpole()
    typed = jax.random.wrap_key_data(jax.random.key_data(jax.random.PRNGKey(0)), impl=THREEFRY)
    state = jax.eval_shape(lambda k: env.reset(k, params)[1], typed)
    holds = any(jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in jax.tree.leaves(state))
    assert holds and env.keeps_keys
