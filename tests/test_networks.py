"""The `--network` choice of all three algorithms: which torso each environment gets."""

import importlib

import jax
import numpy as np
import pytest


def initial_params(algo: str, **overrides):
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(total_timesteps=2048, num_envs=4, num_steps=32, **overrides)
    state = jax.eval_shape(module.make_train(config).init, jax.random.PRNGKey(0),
                           config.hparams())  # shapes only: nothing compiles or runs
    return jax.tree.map(np.shape, state.params["params"])


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_network_choice(algo):
    # auto: the CNN for MinAtar's 10x10x4 images, the MLPs for CartPole's vector
    cnn = initial_params(algo, env_id="Breakout-MinAtar")
    assert cnn["Conv_0"]["kernel"] == (3, 3, 4, 16)
    assert not any("Conv" in name for name in initial_params(algo, env_id="CartPole-v1"))
    # mlp on images: the 400 flattened pixels feed the first actor and critic layers
    mlp = initial_params(algo, env_id="Breakout-MinAtar", network="mlp", hidden_size=32)
    assert not any("Conv" in name for name in mlp)
    assert mlp["Dense_0"]["kernel"] == (400, 32) and mlp["Dense_2"]["kernel"] == (400, 32)
    # cnn explicitly on MinAtar is the same as auto
    assert initial_params(algo, env_id="Breakout-MinAtar", network="cnn") == cnn
