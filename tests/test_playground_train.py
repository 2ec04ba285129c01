"""Training on MuJoCo Playground's Control Suite from Python: A2C runs on CartpoleBalance,
and PPO learns it with its CPU preset (the first 608k steps of its 1e6-step run). IMPALA
trains through its command line in `test_playground.py`, apart from this file so that the two
files' compiles run on both workers. Skipped where Playground is not installed.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

from common.presets import PRESETS  # noqa: E402

TASK = "playground/CartpoleBalance"


def test_a2c_trains_on_a_control_suite_task():
    """The losses finite, the rewards normalised. (IMPALA's run, checked alike, goes through
    its command line in `test_playground.py`; PPO learns the task below.)"""
    a2c = importlib.import_module("algos.a2c")
    config = a2c.Config(env_id=TASK, num_envs=4, num_steps=16, total_timesteps=4 * 16 * 8,
                        normalize_obs=True, normalize_reward=True)
    state, metrics = jax.jit(a2c.make_train(config))(jax.random.PRNGKey(0))
    for name, value in metrics.items():
        if name not in ("episodic_return", "episodic_length", "repeated_starts"):
            assert np.isfinite(value).all(), name
    assert float(state.reward_stats.count) > 100


LEARNING_UPDATES = 297
"""How much of the CPU preset's 1e6-step run (488 updates, the learning rate annealed over
all of them) the learning test runs: 297 updates, 608k steps, up to the end of the 19th
episode. The first 297 updates of `train` and of this shorter program give the same numbers
(the same scan body, another trip count). With seed 1 the episodes ending in them return
314, 323, 377, ..., 601, then from update 250 946, 986, 989, 991; the whole run's last
episodes about 997. Which seeds learn depends on float rounding: the same whole run compiled
with XLA's default options (not `conftest.FAST_COMPILE`) ended at 832, and from the command
line (one seed vmapped, in chunks) at about 650; this program, with the suite's flags,
learns."""


def test_ppo_learns_cartpole_balance_with_its_cpu_preset():
    """The CPU preset's settings for 1e6 steps, one seed, its first `LEARNING_UPDATES`: near
    the most a 1000-step episode can return (the first episodes about 300). Seed 1: at 1e6
    steps, with the learning rate annealed over them, 22 of seeds 0 to 23 ended above 900 and
    seeds 0 and 6 collapsed (577 and 363; docs/environments.md)."""
    ppo = importlib.import_module("algos.ppo")
    config = ppo.Config(env_id=TASK, **{**PRESETS[("ppo", TASK)], "total_timesteps": 1_000_000})
    train = ppo.make_train(config)
    run = jax.jit(lambda key: train.run_updates(train.init(key), None,
                                                jnp.arange(LEARNING_UPDATES)))
    _, metrics = run(jax.random.PRNGKey(1))
    returns = np.asarray(metrics["episodic_return"])
    returns = returns[np.isfinite(returns)]  # the updates where 1000-step episodes ended
    first, last = returns[:3].mean(), returns[-3:].mean()
    assert len(returns) == 19 and last > 900 and first < 500, (first, last, returns)
    assert np.nanmax(np.asarray(metrics["repeated_starts"])) == 0.0
