"""Run as a script by `tests/test_scaling.py`, in a fresh process with 4 forced CPU devices:
checks that need devices set before JAX starts.
Prints "ok" and exits 0 when every check passes.

    python tests/scaling_probe.py learn              # PPO learn: same params on 1, 2, 4 devices
    python tests/scaling_probe.py update [ALGO...]   # data-parallel updates on 2 devices
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import importlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.distributed import DATA_AXIS  # noqa: E402

TINY = dict(env_id="CartPole-v1", total_timesteps=4096, num_envs=8, num_steps=16,
            num_minibatches=2, update_epochs=2)


def data_parallel(fn, devices, in_specs, out_specs):
    mesh = Mesh(np.array(devices), (DATA_AXIS,))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False))


def per_device(tree):
    """Give every leaf a leading device axis, so out_specs P(DATA_AXIS) returns each copy."""
    return jax.tree.map(lambda x: x[None], tree)


def check_learn():
    """One PPO `learn` (2 epochs x 2 minibatches, advantage normalisation, observation
    normalisation, KL early stop) from the same state on the same global batch: the same
    parameters on 1, 2 and 4 devices as without any device axis, identical on every device."""
    from algos.ppo import Config, Transition, make_train

    config = Config(**TINY, normalize_obs=True, target_kl=0.5)
    train = make_train(config)
    hp = config.hparams()
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    k = jax.random.split(jax.random.PRNGKey(1), 6)
    n = config.batch_size
    obs = jax.random.normal(k[0], (n, 4)) * 2.0 + 1.0
    state = state._replace(obs_stats=state.obs_stats._replace(
        mean=jnp.full(4, 0.5), var=jnp.full(4, 2.0), count=jnp.float32(100.0)))
    data = Transition(obs, jax.random.randint(k[1], (n,), 0, 2),
                      jnp.log(0.5) + 0.1 * jax.random.normal(k[2], (n,)),
                      jax.random.normal(k[3], (n,)), jax.random.normal(k[4], (n,)) * 3.0 + 1.0,
                      jax.random.normal(k[5], (n,)))
    key = jax.random.PRNGKey(2)
    ref_params, _, ref_info, ref_ran = jax.jit(train.learn)(state, hp, data, key)
    for d in (1, 2, 4):
        run = data_parallel(lambda s, h, b, k: per_device(train.learn(s, h, b, k)),
                            jax.devices()[:d], (P(), P(), P(), P()), P(DATA_AXIS))
        params, _, info, ran = run(state, hp, data, key)
        for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
            assert got.shape == (d,) + want.shape
            for i in range(1, d):  # bitwise the same on every device
                np.testing.assert_array_equal(got[i], got[0])
            np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-6, err_msg=f"{d} devices")
        for got, want in zip(jax.tree.leaves(info), jax.tree.leaves(ref_info)):
            np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-6, err_msg=f"{d} devices")
        np.testing.assert_array_equal(ran[0], ref_ran)
        moved = max(float(jnp.abs(a - b).max()) for a, b in
                    zip(jax.tree.leaves(params), jax.tree.leaves(state.params)))
        assert moved > 1e-4, moved  # the update really changed the parameters
    print("learn: same parameters on 1, 2, 4 devices")


def check_update(algo):
    """Data-parallel training on 2 devices (2 seeds vmapped on each): every device ends with
    the same parameters, the devices' environments differ, the metrics are finite."""
    module = importlib.import_module(f"algos.{algo}")
    settings = {k: v for k, v in TINY.items()
                if algo != "a2c" or k not in ("num_minibatches", "update_epochs")}
    config = module.Config(**settings, normalize_obs=True)
    train = module.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)

    def run(keys):
        state, metrics = jax.vmap(train)(keys)
        return per_device((state.params, state.obs_stats, state.env.obs)), metrics

    (params, stats, obs), metrics = data_parallel(run, jax.devices()[:2], P(),
                                                  (P(DATA_AXIS), P()))(keys)
    for leaf in jax.tree.leaves((params, stats)):
        np.testing.assert_array_equal(leaf[1], leaf[0])
    assert obs.shape == (2, 2, config.num_envs // 2, 4)
    assert not np.allclose(obs[0], obs[1])  # each device steps its own environments
    assert float(stats.count[0, 0]) > config.total_timesteps - 1  # global batch counted once
    for name, value in metrics.items():
        if name not in ("episodic_return", "episodic_length"):
            assert np.isfinite(value).all(), name
    print(f"{algo}: data-parallel parameters identical on 2 devices")


if __name__ == "__main__":
    if sys.argv[1] == "learn":
        assert jax.device_count() == 4, jax.devices()
        check_learn()
    elif sys.argv[1] == "update":
        for algo in sys.argv[2:] or ("ppo", "a2c", "impala"):
            check_update(algo)
    print("ok", flush=True)
