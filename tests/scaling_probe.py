"""Run as a script by `tests/test_scaling.py`, in a fresh process with 4 forced CPU devices:
checks that need devices set before JAX starts.
Prints `ok PART` for each part that passes and exits 0 when all do.

    python tests/scaling_probe.py learn gru update api chunks cli-seeds cli-refuse cli-data cli-pbt

`learn`: one `learn` step gives the same parameters on 1 and 4 devices as without a device
axis; `gru`: the same with `--network gru` on 4 devices; `update`: data-parallel training
through `parallel.data_parallel` on 2 devices (`--network gru`); `api`:
`parallel.spread_seeds` (PPO); `chunks`: the command line's per-device chunk programs against
one shard_map program (A2C). The other parts cover PPO, A2C and IMPALA. The `cli-` parts run
PPO's command line in this process (`algos.ppo.main`, flags as given on the command line):
seeds on 2 devices against 1, a seed count that does not divide, data-parallel on 2 devices,
a PBT population on 2 devices against 1.
"""
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +  # keeps conftest's flags
                           " --xla_force_host_platform_device_count=4")

import contextlib  # noqa: E402
import glob  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.distributed import DATA_AXIS  # noqa: E402

TINY = dict(env_id="CartPole-v1", total_timesteps=4096, num_envs=8, num_steps=16,
            num_minibatches=2, update_epochs=2)


def data_parallel(fn, devices, in_specs, out_specs):
    """`fn` under `shard_map` on `devices`, jitted; it returns NumPy arrays."""
    mesh = Mesh(np.array(devices), (DATA_AXIS,))
    run = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                check_vma=False))
    return lambda *args: jax.device_get(run(*args))


def per_device(tree):
    """Give every leaf a leading device axis, so out_specs P(DATA_AXIS) returns each copy."""
    return jax.tree.map(lambda x: x[None], tree)


LEARN_DEVICES = (1, 4)
"""The device counts the feed-forward `learn` runs on: 1 device is the path of a
data-parallel run on one device (its share is the whole batch), 4 a real split. 2 would run
the same code as 4 (`distributed.device_share` and `pmean` for any D > 1); a device count
taken from the process (4) rather than from the mesh axis shows on 1."""


def assert_learned_the_same(d, start, got, want):
    """`got`: `(params, opt_state, info)` of `learn` on d devices, every leaf with a leading
    device axis; `want`: the same without any device axis. The parameters are bitwise the same
    on every device, equal `want`'s to float rounding, and moved away from `start`."""
    start, got, want = jax.device_get((start, got, want))
    (params, _, info), (ref_params, _, ref_info) = got[:3], want[:3]
    for leaf, ref in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
        assert leaf.shape == (d,) + ref.shape
        for i in range(1, d):  # bitwise the same on every device
            np.testing.assert_array_equal(leaf[i], leaf[0])
        np.testing.assert_allclose(leaf[0], ref, rtol=2e-5, atol=2e-6, err_msg=f"{d} devices")
    for leaf, ref in zip(jax.tree.leaves(info), jax.tree.leaves(ref_info), strict=True):
        np.testing.assert_allclose(leaf[0], ref, rtol=1e-4, atol=1e-6, err_msg=f"{d} devices")
    moved = max(float(np.abs(a[0] - b).max()) for a, b in
                zip(jax.tree.leaves(params), jax.tree.leaves(start)))
    assert moved > 1e-4, moved  # the update really changed the parameters


def with_obs_stats(state):
    """Observation statistics far from the initial ones, so that normalising matters."""
    return state._replace(obs_stats=state.obs_stats._replace(
        mean=np.full(4, 0.5, np.float32), var=np.full(4, 2.0, np.float32),
        count=np.float32(100.0)))


def rng(seed: int):
    """The probe's test data come from NumPy: JAX would compile each operation making them."""
    return np.random.default_rng(seed)


def raw_key(seed: int):
    """A raw PRNG key, `jax.random.PRNGKey(seed)` for a small seed, made without JAX."""
    return np.array([0, seed], np.uint32)


def normal(r, shape, scale=1.0, loc=0.0):
    """float32 draws from N(loc, scale^2) of `shape`."""
    return (r.normal(size=shape) * scale + loc).astype(np.float32)


def random_episode_ends(r, shape):
    """`terminated`, `truncated` flags as a rollout makes them: about 1 step in 8, never both."""
    terminated = r.random(shape) < 0.1
    return terminated, (r.random(shape) < 0.05) & ~terminated


def random_steps(r, shape):
    """The fields a time-major CartPole batch of `shape` [T, num_envs] shares between A2C's
    `Trajectory` and IMPALA's `Transition`: obs, action, reward, episode ends, next_obs."""
    terminated, truncated = random_episode_ends(r, shape)
    return dict(obs=normal(r, shape + (4,), 2.0, 1.0),
                action=r.integers(0, 2, shape, dtype=np.int32),
                reward=normal(r, shape, 1.0, 1.0),
                terminated=terminated, truncated=truncated,
                next_obs=normal(r, shape + (4,), 2.0, 1.0))


def check_learn_ppo():
    """One PPO `learn` (2 epochs x 2 minibatches, advantage normalisation, observation
    normalisation, KL early stop) from the same state on the same global batch: the same
    parameters on 1 and 4 devices as without any device axis, identical on every device.
    PPO's `learn` takes the gathered global batch, the same on every device (`P()`)."""
    from algos.ppo import Config, Transition, make_train

    config = Config(**TINY, normalize_obs=True, target_kl=0.5)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    r, n = rng(1), config.batch_size
    data = Transition(normal(r, (n, 4), 2.0, 1.0), r.integers(0, 2, n, dtype=np.int32),
                      normal(r, n, 0.1, np.log(0.5)), normal(r, n), normal(r, n, 3.0, 1.0),
                      normal(r, n))
    key, update = raw_key(2), 3
    want = jax.jit(train.learn, static_argnums=4)(state, hp, data, key, update)
    for d in LEARN_DEVICES:
        run = data_parallel(lambda s, h, b, k: per_device(train.learn(s, h, b, k, update)),
                            jax.devices()[:d], (P(), P(), P(), P()), P(DATA_AXIS))
        got = run(state, hp, data, key)
        assert_learned_the_same(d, state.params, got, want)
        np.testing.assert_array_equal(got[3][0], want[3])  # the same epochs ran


def check_learn_a2c():
    """One A2C `learn` (advantage normalisation, observation normalisation) from the same
    state on the same global batch of samples, the same on every device (`P()`), as PPO's:
    the same parameters on 1 and 4 devices as without any device axis."""
    from algos.a2c import Config, Transition, make_train

    config = Config(**{k: v for k, v in TINY.items()
                       if k not in ("num_minibatches", "update_epochs")},
                    normalize_obs=True, norm_adv=True)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    r, n = rng(1), config.batch_size
    data = Transition(normal(r, (n, 4), 2.0, 1.0), r.integers(0, 2, n, dtype=np.int32),
                      normal(r, n), normal(r, n, 3.0, 1.0), normal(r, n))
    update = 3
    want = jax.jit(train.learn, static_argnums=3)(state, hp, data, update)
    for d in LEARN_DEVICES:
        run = data_parallel(lambda s, h, b: per_device(train.learn(s, h, b, update)),
                            jax.devices()[:d], (P(), P(), P()), P(DATA_AXIS))
        assert_learned_the_same(d, state.params, run(state, hp, data), want)


def check_learn_impala():
    """One IMPALA `learn` (2 epochs x 2 minibatches of environments, V-Trace with behaviour
    log-probabilities off the learner's, observation normalisation) from the same state on the
    same global batch of trajectories [num_envs, T], the same on every device (`P()`): the
    same parameters on 1 and 4 devices as without any device axis (every minibatch the
    same set of trajectories)."""
    from algos.impala import Config, Transition, make_train

    config = Config(**TINY, normalize_obs=True)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    shape = (config.num_envs, config.num_steps)  # environment-major, as learn takes it
    data = Transition(**random_steps(rng(1), shape),
                      behaviour_log_prob=normal(rng(3), shape, 0.3, np.log(0.5)))
    key, update = raw_key(2), 3
    want = jax.jit(train.learn, static_argnums=4)(state, hp, data, key, update)
    for d in LEARN_DEVICES:
        run = data_parallel(lambda s, h, b, k: per_device(train.learn(s, h, b, k, update)),
                            jax.devices()[:d], (P(), P(), P(), P()), P(DATA_AXIS))
        assert_learned_the_same(d, state.params, run(state, hp, data, key), want)


GRU = dict(network="gru", hidden_size=16)


def random_sequences(r, config, shape):
    """A recurrent rollout's extra inputs for `shape` [T, num_envs]: `first` flags that follow
    the episode ends (the step after one is the first of the next episode), the GRU state at
    the rollout's start [num_envs, H], and the GRU's outputs at every step [T, num_envs, H]."""
    terminated, truncated = random_episode_ends(r, shape)
    ended = terminated | truncated
    first = np.concatenate([np.zeros((1, shape[1]), bool), ended[:-1]])
    start = normal(r, (shape[1], config.hidden_size))
    memory = normal(r, shape + (config.hidden_size,))
    return dict(terminated=terminated, truncated=truncated), first, np.tanh(start), \
        np.tanh(memory)


def check_learn_ppo_gru():
    """Recurrent PPO's `learn` (minibatches of whole sequences, each recomputed from its stored
    start state) from the same state on the same global batch [num_envs, T]: the same
    parameters on 4 devices as without a device axis; each device recomputes its
    share of a minibatch's environments."""
    from algos.ppo import Config, Transition, make_train

    config = Config(**TINY, **GRU, normalize_obs=True, target_kl=0.5)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    shape = (config.num_envs, config.num_steps)  # environment-major, as learn takes it
    r = rng(1)
    _, first, hidden, _ = random_sequences(r, config, shape[::-1])
    data = Transition(normal(r, shape + (4,), 2.0, 1.0), r.integers(0, 2, shape, dtype=np.int32),
                      normal(r, shape, 0.1, np.log(0.5)), normal(r, shape),
                      normal(r, shape, 3.0, 1.0), normal(r, shape), first.T)
    key, update = raw_key(2), 3
    want = jax.jit(train.learn, static_argnums=4)(state, hp, data, key, update, hidden)
    for d in (4,):
        run = data_parallel(
            lambda s, h, b, k, hid: per_device(train.learn(s, h, b, k, update, hid)),
            jax.devices()[:d], (P(), P(), P(), P(), P()), P(DATA_AXIS))
        got = run(state, hp, data, key, hidden)
        assert_learned_the_same(d, state.params, got, want)
        np.testing.assert_array_equal(got[3][0], want[3])


def check_learn_a2c_gru():
    """Recurrent A2C's `learn` (the GRU recomputed over whole sequences [num_envs, T] from
    their stored start states) on the same global batch on every device: the same parameters
    on 4 devices as without a device axis; each device recomputes its share of the
    environments."""
    from algos.a2c import Config, Transition, make_train

    config = Config(**{k: v for k, v in TINY.items()
                       if k not in ("num_minibatches", "update_epochs")},
                    **GRU, normalize_obs=True, norm_adv=True)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    shape = (config.num_envs, config.num_steps)  # environment-major, as learn takes it
    r = rng(1)
    _, first, hidden, _ = random_sequences(rng(3), config, shape[::-1])
    data = Transition(normal(r, shape + (4,), 2.0, 1.0), r.integers(0, 2, shape, dtype=np.int32),
                      normal(r, shape), normal(r, shape, 3.0, 1.0), normal(r, shape), first.T)
    update = 3
    want = jax.jit(train.learn, static_argnums=3)(state, hp, data, update, hidden)
    for d in (4,):
        run = data_parallel(lambda s, h, b, hid: per_device(train.learn(s, h, b, update, hid)),
                            jax.devices()[:d], (P(), P(), P(), P()), P(DATA_AXIS))
        assert_learned_the_same(d, state.params, run(state, hp, data, hidden), want)


def check_learn_impala_gru():
    """Recurrent IMPALA's `learn` (permuted minibatches of trajectories, each recomputed from
    its start state) on the same global batch [num_envs, T] on every device: the same
    parameters on 4 devices as without a device axis."""
    from algos.impala import Config, Transition, make_train

    config = Config(**TINY, **GRU, normalize_obs=True)
    train = make_train(config)
    hp = config.hparams()
    state = with_obs_stats(jax.jit(train.init)(raw_key(0)))
    shape = (config.num_envs, config.num_steps)  # environment-major, as learn takes it
    ends, first, hidden, _ = random_sequences(rng(3), config, shape[::-1])
    ends = {k: v.T for k, v in ends.items()}
    data = Transition(**{**random_steps(rng(1), shape), **ends}, first=first.T,
                      behaviour_log_prob=normal(rng(4), shape, 0.3, np.log(0.5)))
    key, update = raw_key(2), 3
    want = jax.jit(train.learn, static_argnums=4)(state, hp, data, key, update, hidden)
    for d in (4,):
        run = data_parallel(
            lambda s, h, b, k, hid: per_device(train.learn(s, h, b, k, update, hid)),
            jax.devices()[:d], (P(), P(), P(), P(), P()), P(DATA_AXIS))
        assert_learned_the_same(d, state.params, run(state, hp, data, key, hidden), want)


def check_update(algo):
    """Data-parallel training of the recurrent network through `parallel.data_parallel` on 2
    devices (2 seeds vmapped on each): every device's own copy of the parameters and the
    observation statistics is the same, bitwise; the devices' environments differ; the
    global batch is counted once; the metrics are finite; the outputs have the global
    layout (every environment, one metric row per update).

    The recurrent network covers what data-parallel training does around `learn` for every
    network (each device's own rollout keys, the gather of the global batch, the statistics
    of it), and what only a recurrent one does (the gather of the rollout's start states);
    the feed-forward `learn` on several devices is the `learn` part's."""
    from common import parallel

    module = importlib.import_module(f"algos.{algo}")
    settings = {k: v for k, v in TINY.items()
                if algo != "a2c" or k not in ("num_minibatches", "update_epochs")}
    config = module.Config(**settings, **GRU, normalize_obs=True)
    train = module.make_train(config)
    keys = np.stack([raw_key(0), raw_key(1)])
    state, metrics = parallel.data_parallel(train, jax.devices()[:2])(keys)
    for leaf in jax.tree.leaves((state.params, state.obs_stats)):
        copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        assert len(copies) == 2
        np.testing.assert_array_equal(copies[1], copies[0])
    obs, half = np.asarray(state.env.obs), config.num_envs // 2
    assert obs.shape == (2, config.num_envs, 4)  # every environment, device 0's first
    assert not np.allclose(obs[:, :half], obs[:, half:])  # each device steps its own
    assert float(state.obs_stats.count[0]) > config.total_timesteps - 1  # global batch, once
    assert metrics["value_loss"].shape == (2, config.num_updates)
    for name, value in metrics.items():
        if name not in ("episodic_return", "episodic_length", "repeated_starts"):
            assert np.isfinite(value).all(), name
    print(f"{algo} (gru): data-parallel parameters identical on 2 devices", flush=True)


def check_python_api():
    """`parallel.spread_seeds` gives the runs of `jit(vmap(train))`, split over 2 devices,
    each with its own hyperparameters. (`parallel.data_parallel`: the `update` part.)"""
    from algos.ppo import Config, make_train
    from common import parallel

    config = Config(**{**TINY, "total_timesteps": 1024})
    train = make_train(config)
    keys = np.stack([raw_key(i) for i in range(4)])
    hps = jax.tree.map(lambda x: np.full(4, x, np.float32), config.hparams())._replace(
        learning_rate=np.array([1e-3, 2e-3, 3e-3, 4e-3], np.float32))
    want = jax.jit(jax.vmap(train))(keys, hps)
    got = parallel.spread_seeds(train, jax.devices()[:2])(keys, hps)
    assert len(got[0].params["params"]["Dense_0"]["kernel"].sharding.device_set) == 2
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    print("python api: spread_seeds equals vmap on 2 devices", flush=True)


def check_chunks_per_device():
    """The command line's chunk program for 4 seeds on 2 devices, 2 on each (`Layout.compile`:
    one program per device) gives what the one shard_map program over the mesh gives, chunk
    after chunk, to float rounding (XLA optimises the two programs apart), as global arrays
    laid out as that program's."""
    from algos.a2c import Config, make_train
    from common.host import flags
    from common.host.devices import Layout

    config, run, _ = flags.parse("a2c", Config, ["--total-timesteps", "4000", "--num-seeds",
                                                 "4", "--num-devices", "2"])
    train = make_train(config)
    keys = np.stack([raw_key(i) for i in range(4)])
    hps = jax.vmap(lambda _: config.hparams())(keys)
    template = jax.eval_shape(jax.vmap(train.init), keys, hps)
    layout = Layout(run, config.num_envs, template)
    keys, hps = layout.put(keys, layout.seeds), layout.put(hps, layout.seeds)
    state = layout.spread(jax.vmap(train.init), (layout.seeds, layout.seeds),
                          layout.state)(keys, hps)
    fn = jax.vmap(train.run_updates, in_axes=(0, 0, None))
    specs = ((layout.state, layout.seeds, P()), (layout.state, layout.seeds))
    shapes = (layout.shapes(template, layout.state), layout.shapes(hps, layout.seeds),
              layout.shapes(np.arange(5), P()))
    apart = layout.compile(fn, *specs, *shapes)
    together = layout.spread(fn, *specs).lower(*shapes).compile()
    assert not isinstance(apart, jax.stages.Compiled)  # seeds on 2 devices: one per device
    a, b = state, state
    for begin in (0, 5):
        updates = layout.put(np.arange(begin, begin + 5, dtype=np.int32), P())
        a, metrics_a = apart(a, hps, updates)
        b, metrics_b = together(b, hps, updates)
        for x, y in zip(jax.tree.leaves((a, metrics_a)), jax.tree.leaves((b, metrics_b)),
                        strict=True):
            assert x.shape == y.shape and x.sharding.is_equivalent_to(y.sharding, x.ndim)
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
    print("chunks: one program per device equals the shard_map program", flush=True)


# ------------------------------------------------------------------ the command line
CLI_TINY = ["--env-id", "CartPole-v1", "--total-timesteps", "4096", "--num-envs", "8",
            "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2"]
CLI_SHORT = CLI_TINY[:2] + ["--total-timesteps", "1024"] + CLI_TINY[4:]  # 8 updates


def command_line(args, log_dir):
    """`python algos/ppo.py *args --log-dir log_dir`, run in this process (its devices):
    `(exit status, stdout, stderr)`."""
    from algos.ppo import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*args, "--log-dir", log_dir])
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def final_state(log_dir):
    from common.host import checkpoint

    (path,) = glob.glob(os.path.join(log_dir, "*", checkpoint.LATEST))
    return checkpoint.load(path)


def check_cli_seeds(tmp):
    """4 seeds, 2 per device on 2 devices (the shard_map(vmap(init)) pattern that deadlocked
    jaxlib 0.10 with batched QRs): the runs equal the same seeds on one device."""
    one, two = f"{tmp}/one", f"{tmp}/two"
    args = CLI_SHORT + ["--num-seeds", "4"]
    a = command_line(args + ["--num-devices", "1"], one)
    b = command_line(args + ["--num-devices", "2"], two)
    for code, _, err in (a, b):
        assert code == 0, err[-3000:]
    assert "on 1 device(s), parallel seeds" in a[1], a[1][-2000:]
    assert "on 2 device(s), parallel seeds" in b[1], b[1][-2000:]
    ra, rb = final_state(one), final_state(two)
    for name in ("episodic_return", "value_loss", "approx_kl"):
        np.testing.assert_allclose(rb["metrics"][name], ra["metrics"][name], rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    for x, y in zip(jax.tree.leaves(ra["train_state"]), jax.tree.leaves(rb["train_state"]),
                    strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


def check_cli_refuse(tmp):
    """3 seeds do not divide among 2 devices: one line, exit 2."""
    code, _, err = command_line(CLI_TINY + ["--num-seeds", "3", "--num-devices", "2"], tmp)
    assert code == 2, err
    assert "error: --num-seeds 3 does not divide among 2 devices" in err, err


def check_cli_data(tmp):
    """Data-parallel on 2 devices: the checkpoint keeps the global layout (2 seeds, every
    environment)."""
    args = CLI_TINY + ["--parallel", "data", "--num-seeds", "2", "--checkpoint-every", "16",
                       "--num-devices", "2"]
    code, out, err = command_line(args, tmp)
    assert code == 0, err[-3000:]
    assert "on 2 device(s), parallel data" in out, out[-2000:]
    record = final_state(tmp)
    assert record["update"] == 32
    assert record["train_state"]["env"]["obs"].shape == (2, 8, 4)  # global layout, 2 seeds


def check_cli_pbt(tmp):
    """PBT, 4 members, 2 per device on 2 devices (one program over the mesh, the PBT step's
    gathers across the devices): the population, its hyperparameters, its lineage and its
    metrics equal the same run on one device, bit for bit."""
    one, two = f"{tmp}/one", f"{tmp}/two"
    args = CLI_SHORT + ["--pbt-population", "4", "--pbt-interval", "2", "--pbt-search",
                        "learning_rate=1e-4:1e-2:log", "ent_coef=0:0.02"]
    a = command_line(args + ["--num-devices", "1"], one)
    b = command_line(args + ["--num-devices", "2"], two)
    for code, _, err in (a, b):
        assert code == 0, err[-3000:]
    ra, rb = final_state(one), final_state(two)
    assert ra["update"] == rb["update"] == 8
    sources = np.asarray(ra["pbt"]["source"])  # [intervals, members]
    for x, y in zip(jax.tree.leaves((ra["train_state"], ra["pbt"], ra["metrics"])),
                    jax.tree.leaves((rb["train_state"], rb["pbt"], rb["metrics"])),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert (sources != np.arange(4)).any(), sources  # members were copied


def check(part: str):
    """One part of the probe (`learn`, `gru` and `update` for all three algorithms)."""
    learn = {"ppo": check_learn_ppo, "a2c": check_learn_a2c, "impala": check_learn_impala}
    learn_gru = {"ppo": check_learn_ppo_gru, "a2c": check_learn_a2c_gru,
                 "impala": check_learn_impala_gru}
    cli = {"cli-seeds": check_cli_seeds, "cli-refuse": check_cli_refuse,
           "cli-data": check_cli_data, "cli-pbt": check_cli_pbt}
    if part == "learn":
        for algo, check_learn in learn.items():
            check_learn()
            print(f"{algo} learn: same parameters on 1 and 4 devices", flush=True)
    elif part == "gru":
        for algo, check_learn in learn_gru.items():
            check_learn()
            print(f"{algo} gru learn: same parameters on 4 devices", flush=True)
    elif part == "update":
        for algo in learn:
            check_update(algo)
    elif part == "api":
        check_python_api()
    elif part == "chunks":
        check_chunks_per_device()
    elif part in cli:  # last: the command line turns on the persistent compilation cache
        with tempfile.TemporaryDirectory() as tmp:
            cli[part](tmp)
    else:
        raise ValueError(f"unknown part {part!r}")


if __name__ == "__main__":
    # Each part runs even when one before it fails, and ends with `ok PART` or
    # `FAILED PART` and its traceback, so one process serves every test that needs it.
    assert jax.device_count() == 4, jax.devices()
    failed = False
    for part in sys.argv[1:]:
        try:
            check(part)
        except Exception:  # noqa: BLE001  (reported, and the exit status says so)
            failed = True
            print(f"FAILED {part}\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok {part}", flush=True)
    sys.exit(1 if failed else 0)
