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


def test_ppo_s_mlps_take_their_widths_depths_and_activation_from_the_config():
    """Brax's PPO networks (policy 4 x 32, value 5 x 256, swish) from PPO's Config: the layers'
    shapes (no compile), and V(s) against NumPy with x * sigmoid(x) between the layers; a
    network without the MLPs refuses their sizes before anything is built."""
    from algos.ppo import ActorCritic, Config, make_train

    brax = dict(hidden_size=32, hidden_layers=4, critic_hidden_size=256, critic_hidden_layers=5,
                activation="swish")
    params = initial_params("ppo", **brax)  # CartPole: 4 observations, 2 actions
    kernels = [params[f"Dense_{i}"]["kernel"] for i in range(len(params))]
    assert kernels == [(4, 32), (32, 32), (32, 32), (32, 32), (4, 256), *[(256, 256)] * 4,
                       (256, 1), (32, 2)], kernels
    network = ActorCritic(make_train(Config(**brax)).env[2], 32, "swish", False, None, 4, 256, 5)
    rng = np.random.default_rng(0)  # random parameters: the initialiser's QRs cost seconds
    full = {"params": jax.tree.map(lambda shape: rng.normal(0, 0.2, shape).astype(np.float32),
                                   params, is_leaf=lambda x: isinstance(x, tuple))}
    obs = rng.normal(size=(3, 4)).astype(np.float32)
    x = obs.astype(np.float64)
    for i in range(4, 10):
        layer = full["params"][f"Dense_{i}"]
        x = x @ layer["kernel"].astype(np.float64) + layer["bias"]
        x = x / (1 + np.exp(-x)) if i < 9 else x[:, 0]  # swish between layers; V(s)
    np.testing.assert_allclose(jax.jit(network.apply)(full, obs)[1], x, rtol=1e-4, atol=1e-5)
    for network_choice, env_id in (("gru", "CartPole-v1"), ("cnn", "Breakout-MinAtar"),
                                   ("auto", "Breakout-MinAtar")):
        with pytest.raises(ValueError, match="--hidden-layers, --critic-hidden-size"):
            make_train(Config(env_id=env_id, network=network_choice, critic_hidden_layers=3))
