"""`common/evaluate.py`: deterministic evaluation, each algorithm's `train.act`, the entry
point on a checkpoint, and the GIF of an episode.

Checkpoints here hold freshly initialised runs (no training), so nothing big compiles.
"""

import importlib
import os
import re
from functools import partial

import jax
import numpy as np
import pytest

from common.envs import make_env
from algos.evaluate import main
from common.evaluate import evaluate
from common.host.video import save_gif
from helpers import initial_state, interrupted_while_importing, save_initial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

@pytest.fixture(scope="module")
def cartpole():
    """PPO on CartPole, two seeds: config, train, state, and a jitted vmapped evaluation."""
    config, train, state = initial_state("ppo", num_seeds=2)
    env, env_params, spec = make_env(config.env_id)
    run = jax.jit(jax.vmap(lambda s, k: evaluate(
        partial(train.act, s), env, env_params, spec, k, 8)))
    return config, train, state, run


def test_evaluation_is_deterministic_and_plays_whole_episodes(cartpole):
    _, _, state, run = cartpole
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    returns, lengths = run(state, keys)
    again, _ = run(state, keys)
    np.testing.assert_array_equal(returns, again)  # same key and parameters: same returns
    assert returns.shape == (2, 8)
    # CartPole pays 1 per step: one whole episode each, ended by the pole or the time limit.
    np.testing.assert_array_equal(returns, lengths)
    assert (lengths >= 8).all() and (lengths <= 500).all()
    other, _ = run(state, jax.random.split(jax.random.PRNGKey(4), 2))
    assert not np.array_equal(returns, other)  # other environments, other episodes


def test_max_steps_cuts_every_episode_at_that_length(cartpole):
    config, train, state, _ = cartpole
    env, env_params, spec = make_env(config.env_id)
    first = jax.tree.map(lambda x: x[0], state)
    returns, lengths = jax.jit(lambda k: evaluate(partial(train.act, first), env,
                                                  env_params, spec, k, 4, max_steps=5))(
        jax.random.PRNGKey(0))
    # This policy's CartPole episodes last at least 8 steps (the test above): all are cut.
    np.testing.assert_array_equal(lengths, 5)
    np.testing.assert_array_equal(returns, 5.0)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_act_is_the_mode_of_the_policy(algo):
    module = importlib.import_module(f"algos.{algo}")
    config, train, state = initial_state(algo)
    _, _, spec = make_env(config.env_id)
    first = jax.tree.map(lambda x: x[0], state)
    obs = jax.random.normal(jax.random.PRNGKey(1), (64,) + spec.obs_shape)
    network = module.ActorCritic(spec, config.hidden_size, config.activation)
    logits = network.apply(first.params, obs)[0].logits
    action, hidden = train.act(first, obs, None, None)
    assert hidden is None  # feed-forward: no state
    np.testing.assert_array_equal(action, np.argmax(logits, axis=-1))


def test_act_of_a_gaussian_policy_is_its_mean():
    from algos.ppo import ActorCritic

    config, train, state = initial_state("ppo", env_id="Pendulum-v1", normalize_obs=True)
    _, _, spec = make_env(config.env_id)
    first = jax.tree.map(lambda x: x[0], state)
    mean, var = np.array([0.5, -1.0, 2.0], np.float32), np.array([4.0, 0.25, 9.0], np.float32)
    first = first._replace(obs_stats=first.obs_stats._replace(mean=mean, var=var))
    obs = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (16, 3))) * 4.0
    seen = np.clip((obs - mean) / np.sqrt(var + 1e-8), -10.0, 10.0)  # what the policy sees
    pi = ActorCritic(spec, config.hidden_size, config.activation).apply(first.params, seen)[0]
    np.testing.assert_allclose(train.act(first, obs, None, None)[0], pi.mean(), rtol=1e-5,
                               atol=1e-7)
    raw = ActorCritic(spec, config.hidden_size, config.activation).apply(first.params, obs)[0]
    assert not np.allclose(raw.mean(), pi.mean(), rtol=1e-3)  # normalising matters here


def test_entry_point_reports_the_same_returns_twice(tmp_path, capsys, cartpole):
    path = save_initial(tmp_path / "run.msgpack", "ppo", num_seeds=2)
    first = main([path, "--episodes", "3", "--seed", "5"])
    out = capsys.readouterr().out
    second = main([str(tmp_path / "run.msgpack"), "--episodes", "3", "--seed", "5"])
    np.testing.assert_array_equal(first, second)
    assert first.shape == (2, 3)
    assert f"evaluate: ppo on CartPole-v1, {path} (update 0 of 32), 3 episodes" in out
    for seed, r in zip((1, 2), np.asarray(first)):
        assert f"seed {seed}: mean return {r.mean():.2f}" in out
    assert f"mean return over 2 run(s): {np.mean(first):.2f}" in out


def test_entry_point_plays_the_environment_make_train_made(tmp_path, monkeypatch, capsys):
    """The entry point builds no environment of its own: it plays `train.env`, the one the
    algorithm's `make_train` got from `common.envs.make_env` with the saved config's id and
    Brax pipeline, as the run trained on."""
    import algos.evaluate as entry
    import algos.ppo as ppo

    path = save_initial(tmp_path / "run.msgpack", "ppo")
    made, played = [], []
    make_env, play = ppo.make_env, entry.evaluate
    monkeypatch.setattr(ppo, "make_env", lambda *args: made.append((args, make_env(*args))) or
                        made[-1][1])
    monkeypatch.setattr(entry, "evaluate", lambda act, env, *args, **kwargs: played.append(env)
                        or play(act, env, *args, **kwargs))
    main([path, "--episodes", "2"])
    assert [args for args, _ in made] == [("CartPole-v1", "positional")]
    assert played and all(env is made[0][1][0] for env in played)


def test_entry_point_saves_a_gif_of_one_episode(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("seaborn")  # gymnax's MinAtar renderer imports it
    from PIL import Image

    path = save_initial(tmp_path / "run.msgpack", "ppo", env_id="Breakout-MinAtar")
    gif = tmp_path / "episode.gif"
    main([path, "--episodes", "2", "--capture-video", str(gif)])
    out = capsys.readouterr().out
    frames = int(re.search(r"video: .* \((\d+) frames", out).group(1))
    with Image.open(gif) as image:
        assert image.format == "GIF" and image.n_frames == frames


def test_save_gif_draws_gymnax_states(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    env, env_params, _ = make_env("FourRooms-misc")
    _, state = env.reset(jax.random.PRNGKey(0), env_params)
    states = [state]
    for t in range(3):
        _, state, *_ = env.step(jax.random.PRNGKey(t), state, t % 4, env_params)
        states.append(state)
    save_gif(env, env_params, states, np.zeros(4), str(tmp_path / "maze.gif"))
    with Image.open(tmp_path / "maze.gif") as image:
        assert image.n_frames == 4


@pytest.mark.subprocess
def test_ctrl_c_while_evaluate_imports_is_one_line(tmp_path):
    """`python -m algos.evaluate`, Ctrl-C while it still imports JAX: its one line, exit 130,
    no KeyboardInterrupt traceback (as the algorithm files, `tests/test_edges.py`)."""
    returncode, lines, out = interrupted_while_importing(
        ["-m", "algos.evaluate", str(tmp_path / "run.msgpack")], ROOT)
    assert returncode == 130, lines
    assert lines == ["interrupted; the evaluation stopped"], lines
    assert out == ""
