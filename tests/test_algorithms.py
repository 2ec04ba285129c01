"""What every algorithm promises, checked for PPO, A2C and IMPALA alike.

The `make_train` contract: one row of metrics per update, the same key giving the same numbers,
a vmapped seed equal to the same seed run alone, a swept hyperparameter equal to the same value
set in the config, chunked updates equal to one call (each also with a recurrent network, on
velocity-hidden CartPole), no batched QR and no host callback in the vmapped program (the
jaxlib 0.10 deadlock; a program the persistent cache would not keep; with each recurrent core
too); learning on a small CartPole budget, with progress printed from inside `jit` under
`vmap`; and the command line, once from a real process, once in-process for each other
algorithm (bad input from a real process: `tests/test_bad_input.py`). Each algorithm's own
file tests what only it has (its loss by hand, IMPALA's actor lag, PPO's annealed step).

The tiny runs are compiled once per test process (`helpers.tiny_run`): four programs for each
(`batched`, `init`, `run_updates` for all the updates and for a chunk of them).
"""

import dataclasses
import glob
import importlib
import io
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.configs import summary_figures
from common.host.logger import final_return, seed_keys
from helpers import ALGOS, all_eqns, qr_operand_shapes, stacked, tiny_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = {"global_step", "episodic_return", "episodic_length", "repeated_starts",
          "learning_rate", "value_loss", "policy_loss", "entropy", "explained_variance"}
METRICS = {"ppo": COMMON | {"approx_kl", "clipfrac"}, "a2c": COMMON,
           "impala": COMMON | {"approx_kl", "mean_clipped_rho", "rho_clip_fraction"}}
# NaN for an update where no episode ended
EPISODIC = ("episodic_return", "episodic_length", "repeated_starts")

SWEEP = {  # the second run of a two-run sweep; the first keeps the config's values
    "ppo": dict(learning_rate=1e-3, ent_coef=0.05, clip_coef=0.1),
    "a2c": dict(learning_rate=3e-3, ent_coef=0.0, gae_lambda=0.9),
    "impala": dict(learning_rate=2e-2, rho_bar=0.5, c_bar=0.7, ent_coef=0.05),
}


@pytest.fixture(params=ALGOS)
def tiny(request):
    return tiny_run(request.param)


@pytest.fixture(params=[(a, n) for n in ("auto", "gru") for a in ALGOS] + [("impala", "lstm")],
                ids=lambda p: "-".join(p))
def tiny_or_gru(request):
    """Each algorithm's tiny run, and the same with a recurrent network (the GRU; the LSTM,
    which differs only in the core, `test_recurrent.py`, for IMPALA, whose agent it is)."""
    return tiny_run(*request.param)


def algo_of(tiny) -> str:
    return tiny.module.__name__.split(".")[-1]


# --------------------------------------------------------------------------------------------
# The make_train contract
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_reward_normalisation_scales_what_is_learned_not_what_is_reported(algo):
    """With `normalize_reward` the statistics see every step of every environment, the
    learning signal changes, and the reported episodic returns stay the raw rewards' sums."""
    tiny = tiny_run(algo)
    config = dataclasses.replace(tiny.config, normalize_reward=True)
    state, metrics = jax.jit(tiny.module.make_train(config))(tiny.keys[0])
    plain_state, plain = tiny.alone(tiny.keys[0], tiny.hp)
    steps = config.num_updates * config.batch_size
    np.testing.assert_allclose(state.reward_stats.count, 1e-4 + steps, rtol=1e-6)
    assert float(state.reward_stats.var) > 0 and float(plain_state.reward_stats.count) < 1e-3
    assert not np.allclose(metrics["value_loss"], plain["value_loss"])  # a scaled signal
    # CartPole pays 1 per step: an episode's reported return is its length, as without scaling.
    done = np.isfinite(metrics["episodic_return"])
    np.testing.assert_array_equal(metrics["episodic_return"][done],
                                  metrics["episodic_length"][done])


OTHER_BRANCHES = {  # each algorithm's own options, beside what all three share
    "ppo": dict(num_minibatches=2, update_epochs=4, target_kl=1e-4, clip_vloss=False),
    "a2c": dict(optimizer="adam", norm_adv=True, gae_lambda=0.95, log_std_init=-1.5),
    "impala": dict(actor_lag=0, num_minibatches=2, update_epochs=2, optimizer="adam",
                   kl_coef=0.1, vtrace=False, log_std_init=-1.5),
}


@pytest.mark.parametrize("algo", ALGOS)
def test_continuous_actions_normalisation_and_each_algorithms_options_train_end_to_end(algo):
    """Continuous actions (Pendulum), observation normalisation, a constant learning rate,
    and the options of `OTHER_BRANCHES` (PPO's KL stop, A2C's Adam and GAE, IMPALA without
    lag or correction and with the KL penalty; A2C's and IMPALA's initial log std, which 3
    small updates move little from -1.5, far from the default 0), in one compile each; the
    progress printer reaches 100%."""
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="Pendulum-v1", total_timesteps=8 * 32 * 3, num_envs=8,
                           num_steps=32, normalize_obs=True, anneal_lr=False,
                           **OTHER_BRANCHES[algo])
    train = module.make_train(config, live_progress=True)
    train.progress.stream = io.StringIO()
    state, metrics = jax.jit(train)(jax.random.PRNGKey(0))
    for name in set(metrics) - set(EPISODIC):
        assert metrics[name].shape == (3,) and np.isfinite(metrics[name]).all(), name
    assert float(state.obs_stats.count) == pytest.approx(config.num_updates * config.batch_size,
                                                         rel=1e-3)
    np.testing.assert_allclose(metrics["learning_rate"], config.learning_rate)
    if "log_std_init" in OTHER_BRANCHES[algo]:
        np.testing.assert_allclose(state.params["params"]["log_std"], -1.5, atol=0.1)
    train.progress.close()
    assert f"[{algo} Pendulum-v1] step {768:>12,}" in train.progress.stream.getvalue()


@pytest.mark.parametrize("algo", ALGOS)
def test_image_observations_use_the_cnn(algo):
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="Breakout-MinAtar", total_timesteps=4 * 16 * 2, num_envs=4,
                           num_steps=16, **({"num_minibatches": 2} if algo != "a2c" else {}))
    state, metrics = jax.jit(module.make_train(config))(jax.random.PRNGKey(0))
    assert any("Conv" in k for k in state.params["params"])
    assert np.isfinite(metrics["value_loss"]).all()


@pytest.mark.parametrize("algo", ALGOS)
def test_hparams_are_float32_scalars_of_the_configs_values(algo):
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config()
    hp = config.hparams()
    assert isinstance(hp, module.HParams)
    for name, x in hp._asdict().items():
        assert x.shape == () and x.dtype == jnp.float32, name
        assert float(x) == pytest.approx(getattr(config, name), rel=1e-6), name


def test_metrics_have_one_row_per_update_and_are_finite(tiny_or_gru):
    """The recurrent runs play velocity-hidden CartPole (`helpers.GRU_RUN`): two of the four
    observation entries reach the policy, whose first layer takes two inputs. (That a
    recurrent policy learns such a task is a longer run: `docs/results.md`.)"""
    tiny = tiny_or_gru
    state, metrics = tiny.result
    config = tiny.config
    assert set(metrics) == METRICS[algo_of(tiny)]
    for name, value in metrics.items():
        assert value.shape == (3, config.num_updates), name
        if name not in EPISODIC:
            assert np.isfinite(value).all(), name
    np.testing.assert_array_equal(metrics["global_step"][0],
                                  config.batch_size * np.arange(1, config.num_updates + 1))
    # Returns are means over the episodes that finished in an update (CartPole: >= 8 steps).
    returns = metrics["episodic_return"]
    assert np.isfinite(returns).mean() > 0.3, returns
    assert (returns[np.isfinite(returns)] >= 8).all()
    np.testing.assert_allclose(metrics["learning_rate"][:, 0], config.learning_rate, rtol=1e-6)
    if config.anneal_lr:
        assert (metrics["learning_rate"][:, -1] < metrics["learning_rate"][:, 0]).all()
    else:
        np.testing.assert_allclose(metrics["learning_rate"], config.learning_rate, rtol=1e-6)
    assert jax.tree.leaves(state.params)[0].shape[0] == 3
    obs_size = {"CartPole-v1": 4, "MaskedCartPole-v1": 2}[config.env_id]
    assert state.env.obs.shape == (3, config.num_envs, obs_size)
    assert state.params["params"]["Dense_0"]["kernel"].shape[:2] == (3, obs_size)


def test_same_key_same_result_and_vmapped_seed_equals_single_run(tiny_or_gru):
    """`jit(vmap(train))` twice gives the same bits, and each of its seeds, up to rounding,
    the same seed run alone as the command line runs it (`TinyRun.alone`: `init`, then all
    the updates in one `run_updates` call): so a vmapped `train` is also `init` followed by
    `run_updates`."""
    tiny = tiny_or_gru
    _, metrics = tiny.result
    _, again = tiny.batched(tiny.keys, stacked(tiny.hp, 3))
    for name in metrics:
        np.testing.assert_array_equal(again[name], metrics[name], err_msg=name)
    for i in range(3):
        _, alone = tiny.alone(tiny.keys[i], tiny.hp)
        for name in metrics:
            np.testing.assert_allclose(alone[name], metrics[name][i], rtol=1e-4, atol=1e-6,
                                       err_msg=f"seed {i}: {name}")
    assert not np.allclose(metrics["value_loss"][0], metrics["value_loss"][1])  # seeds differ


def test_a_swept_hyperparameter_equals_the_same_value_set_in_the_config(tiny):
    """Runs in one vmapped call, the second with every hyperparameter of `SWEEP` changed,
    against the same seeds run alone: the first from the config, the second from a config
    built with the changed values (so a value read from the config instead of the traced
    hparams would show). The third, the config's values again, keeps the call the shape of
    `tiny.result`'s, so the vmapped program compiles once."""
    changed = SWEEP[algo_of(tiny)]
    other = dataclasses.replace(tiny.config, **changed)
    hps = jax.tree.map(lambda a, b: jnp.stack([a, b, a]), tiny.hp, other.hparams())
    _, swept = tiny.batched(tiny.keys, hps)
    _, first = tiny.alone(tiny.keys[0], tiny.hp)
    _, second = jax.jit(tiny.module.make_train(other))(tiny.keys[1])  # hparams from `other`
    for name in first:
        np.testing.assert_allclose(first[name], swept[name][0], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
        np.testing.assert_allclose(second[name], swept[name][1], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose(swept["learning_rate"][:, 0], [tiny.config.learning_rate,
                               changed["learning_rate"], tiny.config.learning_rate], rtol=1e-6)
    if "mean_clipped_rho" in swept:  # IMPALA: the swept rho_bar bounds the clipped ratios
        assert (swept["mean_clipped_rho"][1] <= changed["rho_bar"] + 1e-6).all()
    _, plain = tiny.result  # the third run: as if the second were not in the call
    for name in swept:
        np.testing.assert_array_equal(swept[name][2], plain[name][2], err_msg=name)


def test_chunked_updates_equal_one_call(tiny_or_gru):
    """What the command line relies on: the updates run in chunks give the bits of `init`
    followed by all of them in one `run_updates` call. (That this equals `train`, which fuses
    `init` into the same program, so only up to rounding: the vmapped-seed test above.)"""
    tiny = tiny_or_gru
    n = tiny.config.num_updates
    chunk = next(c for c in range(n // 3, 0, -1) if n % c == 0)
    start = tiny.init(tiny.keys[0], tiny.hp)
    state, metrics = tiny.run_updates(start, tiny.hp, jnp.arange(n))
    chunked, rows = start, []
    for first in range(0, n, chunk):
        chunked, m = tiny.run_updates(chunked, tiny.hp, jnp.arange(first, first + chunk))
        rows.append(m)
    assert len(rows) >= 3
    for name in metrics:
        np.testing.assert_array_equal(np.concatenate([r[name] for r in rows]), metrics[name],
                                      err_msg=name)
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("network", ["auto", "gru", "lstm"])
@pytest.mark.parametrize("algo", ALGOS)
def test_vmapped_train_never_batches_a_qr_nor_calls_the_host(algo, network):
    """The jaxlib 0.10 CPU deadlock (docs/performance.md, `common.nn.orthogonal`): a QR with a
    batch axis, which flax's orthogonal initialiser becomes under `vmap`, can hang
    `jit(vmap(train))` at 0% CPU. Every kernel of the three files' networks, the recurrent
    cores' gates too, is drawn by `common.nn.orthogonal`, one unbatched QR per seed: the
    program traced for 3 seeds (the trace `TinyRun.batched` compiles; nothing compiled here)
    holds QRs, every one 2-D. And without live progress, as the command line builds it, the
    program calls back to Python nowhere: JAX writes no program with a host callback to the
    persistent compilation cache (the command line's own check from a real process, for
    A2C: `test_cli_trains_logs_evaluates_and_summarises_from_a_real_process`)."""
    run = tiny_run(algo, network)
    jaxpr = run.batched.trace(run.keys, stacked(run.hp, 3)).jaxpr.jaxpr
    shapes = qr_operand_shapes(jaxpr)
    assert shapes and all(len(shape) == 2 for shape in shapes), shapes
    callbacks = {eqn.primitive.name for eqn in all_eqns(jaxpr) if "callback" in eqn.primitive.name}
    assert not callbacks, callbacks


# --------------------------------------------------------------------------------------------
# Learning on a small budget (fixed seeds; the thresholds leave room for drift across machines).
# The programs compile with the suite's fast flags (`conftest.FAST_COMPILE`), as every other
# test's: XLA's defaults run them in a third of the time but take about 8 s to compile each,
# against about 2 s (the three: about 27 against 14 CPU s in all). The figures below were
# measured so; with a learning rate of 1e-12 every seed's final return stays at 21-24.
# --------------------------------------------------------------------------------------------
LEARNS = {  # overrides, keys, first updates, their mean below, final mean above, final min above
    # measured: first 5 updates' mean about 24, final 197, 236, 223, 170 (random policy: 22)
    "ppo": (dict(total_timesteps=50_000), jax.random.split(jax.random.PRNGKey(0), 4),
            5, 40, 150, 80),
    # measured: first 50 updates' mean about 24, final per seed 448, 422, 170, 319
    "a2c": (dict(total_timesteps=30_000), seed_keys(0, 4), 50, 50, 150, 80),
    # default actor_lag = 1: the lagged actors still learn. Measured: first updates about 21,
    # final 247, 296, 228, 265
    "impala": (dict(total_timesteps=100_000), jax.random.split(jax.random.PRNGKey(0), 4),
               5, 40, 150, 100),
}


@pytest.mark.parametrize("algo", ALGOS)
def test_cartpole_learns_on_a_small_budget_printing_progress_from_inside_jit_under_vmap(algo):
    """Four seeds in one `jit(vmap(train))`, built with live progress: the returns of the
    first updates are a random policy's, the final ones far above. The progress printer's
    last line, 100%, comes by itself shortly after the run (no `close` needed), once for all
    the vmapped runs."""
    overrides, keys, first_updates, first_below, mean_above, min_above = LEARNS[algo]
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="CartPole-v1", **overrides)
    train = module.make_train(config, live_progress=True)
    train.progress.stream = io.StringIO()
    _, metrics = jax.block_until_ready(jax.jit(jax.vmap(train))(keys))
    first = np.nanmean(metrics["episodic_return"][:, :first_updates])
    final = final_return(metrics["episodic_return"])
    assert first < first_below, first
    assert final.mean() > mean_above and final.min() > min_above, final
    time.sleep(train.progress.FINAL_WAIT * 10)
    out = train.progress.stream.getvalue()
    total = config.num_updates * config.batch_size
    assert out.count(f"[{algo} CartPole-v1] step {total:>12,}/{total:,} (100%)") == 1, out
    assert "SPS per run" in out


# --------------------------------------------------------------------------------------------
# The command line: once from a real process (A2C, the cheapest run), the others in-process
# (each file's `python algos/<algo>.py` entry point also runs from a real process in
# `tests/test_bad_input.py`)
# --------------------------------------------------------------------------------------------
CLI_STEPS = {"ppo": ["--total-timesteps", "8192"],
             "a2c": ["--total-timesteps", "800", "--num-envs", "4"],
             "impala": ["--total-timesteps", "1280", "--num-envs", "4", "--num-steps", "16"]}


def cli_args(algo, log_dir) -> list:
    return CLI_STEPS[algo] + ["--num-seeds", "2", "--eval-every", "10", "--log-dir", str(log_dir)]


def run_cli(algo, args, **env):
    return subprocess.run([sys.executable, f"algos/{algo}.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def check_cli_run(algo, stdout: str, log_dir):
    """Two seeds: a progress line, the summary, one run directory per seed with the default
    experiment name (the algorithm's), TensorBoard events with the evaluation's return."""
    assert f"[{algo} CartPole-v1] step" in stdout and "SPS" in stdout
    assert f"done: {algo.upper()} on CartPole-v1, 2 run(s)" in stdout, stdout
    figures = summary_figures(stdout)  # as the benchmarks read the summary line
    assert figures["sps"] > 0 and figures["min"] <= figures["mean"], figures
    runs = sorted(os.listdir(log_dir))
    assert [r.split("__")[:3] for r in runs] == [["CartPole-v1", algo, "1"],
                                                 ["CartPole-v1", algo, "2"]], runs
    for run in runs:
        (events,) = glob.glob(os.path.join(log_dir, run, "events.out.tfevents.*"))
        assert b"eval/episodic_return" in open(events, "rb").read()


@pytest.mark.subprocess
def test_cli_trains_logs_evaluates_and_summarises_from_a_real_process(tmp_path):
    """`python algos/a2c.py`: what `check_cli_run` checks, and both compiled programs (init
    and a chunk of updates) in the persistent cache; a second identical command then compiles
    nothing: JAX reports (`JAX_LOG_COMPILES`, `JAX_EXPLAIN_CACHE_MISSES`) a persistent-cache
    hit for both programs and not one miss. (The cache is the host's, the same for the three
    files; that none of their programs calls back to the host, which would keep it out of the
    cache, is checked on their traced programs: `test_vmapped_train_never_batches_a_qr...`.)"""
    args = cli_args("a2c", tmp_path / "runs")
    result = run_cli("a2c", args, ONPOLICY_JAX_CACHE=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    check_cli_run("a2c", result.stdout, tmp_path / "runs")
    cached = os.listdir(tmp_path / "cache")
    for program in ("jit_init-", "jit_run_updates-"):
        assert any(name.startswith(program) for name in cached), (program, cached)
    again = run_cli("a2c", args, ONPOLICY_JAX_CACHE=str(tmp_path / "cache"),
                    JAX_LOG_COMPILES="1", JAX_EXPLAIN_CACHE_MISSES="1")
    assert again.returncode == 0, again.stderr[-3000:]
    hits = set(re.findall(r"Persistent compilation cache hit for '(\w+)'", again.stderr))
    misses = re.findall(r"PERSISTENT COMPILATION CACHE MISS for '(\w+)'", again.stderr)
    assert {"jit_init", "jit_run_updates"} <= hits and not misses, (sorted(hits), misses)


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_cli_trains_logs_evaluates_and_summarises_in_process(algo, tmp_path, capsys):
    """`main(argv)` of `algos/<algo>.py`, in this process: what `check_cli_run` checks."""
    module = importlib.import_module(f"algos.{algo}")
    module.main(cli_args(algo, tmp_path / "runs"))
    check_cli_run(algo, capsys.readouterr().out, tmp_path / "runs")


def random_learner_batch(algo, config):
    """A global batch as `update_step` hands it to `learn`: A2C's samples [batch_size],
    IMPALA's whole trajectories [num_envs, T] (CartPole shapes, random values)."""
    module = importlib.import_module(f"algos.{algo}")
    k = jax.random.split(jax.random.PRNGKey(1), 6)
    if algo == "a2c":
        n = config.batch_size
        return module.Transition(jax.random.normal(k[0], (n, 4)),
                                 jax.random.randint(k[1], (n,), 0, 2), jnp.zeros(n),
                                 jax.random.normal(k[2], (n,)), jax.random.normal(k[3], (n,)))
    shape = (config.num_envs, config.num_steps)
    ends = jax.random.uniform(k[4], shape)
    return module.Transition(jax.random.normal(k[0], shape + (4,)),
                             jax.random.randint(k[1], shape, 0, 2),
                             jax.random.normal(k[2], shape), ends < 0.05,
                             (ends > 0.05) & (ends < 0.08), jax.random.normal(k[3], shape + (4,)),
                             jnp.full(shape, jnp.log(0.5)))


@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_learn_is_minibatch_sgd_with_the_loss_and_plain_optax(algo):
    """A2C's and IMPALA's `learn` (PPO's: `tests/test_ppo.py`, with its KL stop) give what plain
    optax on the parameter tree gives when it steps the file's top-level loss over the
    minibatches of `shuffled_minibatches` (A2C: one epoch of the whole batch, unshuffled;
    IMPALA: two epochs of two minibatches of whole trajectories), replayed with `lax.scan`."""
    import optax

    from common.envs import make_env
    from common.minibatch import shuffled_minibatches

    module = importlib.import_module(f"algos.{algo}")
    sizes = dict(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 4)
    if algo == "impala":
        sizes.update(num_minibatches=2, update_epochs=2, actor_lag=0)
    config = module.Config(env_id="CartPole-v1", optimizer="adam", anneal_lr=False, **sizes)
    hp, train = config.hparams(), module.make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    data, key = random_learner_batch(algo, config), jax.random.PRNGKey(2)
    if algo == "a2c":
        params = jax.jit(train.learn, static_argnums=3)(state, hp, data, 0)[0]
    else:
        params = jax.jit(train.learn, static_argnums=4)(state, hp, data, key, 0)[0]

    network = module.ActorCritic(make_env("CartPole-v1")[2])
    optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                            optax.adam(config.learning_rate, eps=config.opt_eps))

    def loss(p, batch):
        if algo == "a2c":
            pi, value, _ = network.apply(p, batch.obs)
            return module.a2c_loss(pi.log_prob(batch.action), pi.entropy(), value, batch, hp)[0]
        batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)  # time-major
        pi, v_t, _ = network.apply(p, batch.obs)
        v_tp1 = network.apply(p, batch.next_obs)[1]
        return module.impala_loss(pi.log_prob(batch.action), pi.entropy(), v_t, v_tp1, batch,
                                  hp)[0]

    def reference(p):
        def step(carry, batch):
            p, s = carry
            updates, s = optimizer.update(jax.grad(loss)(p, batch), s, p)
            return (optax.apply_updates(p, updates), s), None

        s = optimizer.init(p)
        if algo == "a2c":
            epochs = [jax.tree.map(lambda x: x[None], data)]
        else:
            epochs = [shuffled_minibatches(k, data, config.num_minibatches).stacked()
                      for k in jax.random.split(key, config.update_epochs)]
        for batches in epochs:
            (p, s), _ = jax.lax.scan(step, (p, s), batches)
        return p

    want = jax.jit(reference)(state.params)
    for g, w in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
    assert not np.allclose(jax.tree.leaves(params)[0], jax.tree.leaves(state.params)[0])
