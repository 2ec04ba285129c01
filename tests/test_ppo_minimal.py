"""`algos/ppo_minimal.py`, the one-file PPO to copy: it works alone in an empty folder, computes
the same numbers as `algos/ppo.py` where their configs coincide, learns CartPole, vmaps over
seeds, and refuses bad configs with one clear line."""

import ast
import contextlib
import dataclasses
import functools
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from algos import ppo, ppo_minimal
from helpers import qr_operand_shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "algos", "ppo_minimal.py")
ALLOWED = {"dataclasses", "difflib", "math", "signal", "sys", "time", "typing", "distrax", "flax",
           "jax", "numpy", "optax", "gymnax", "tyro"}
TINY = dict(total_timesteps=512, num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2)


# ------------------------------------------------------------------ alone, in an empty folder
def test_the_file_is_short_and_imports_only_jax_libraries():
    source = open(SOURCE).read()
    assert len(source.splitlines()) <= 400
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.add(node.module.split(".")[0])
    assert imported <= ALLOWED, imported - ALLOWED


SCRIPT = """
import runpy, sys
sys.path.insert(0, ".")
import ppo_minimal
assert "gymnax" not in sys.modules, "importing the file started gymnax (and JAX's backend)"
import jax, numpy as np
config = ppo_minimal.Config(env_id="Pendulum-v1", **{tiny})  # continuous actions, from Python
state, metrics = jax.jit(ppo_minimal.make_train(config))(jax.random.PRNGKey(0))
assert np.isfinite(np.asarray(metrics["value_loss"])).all()
print("Pendulum-v1 trained", int(metrics["global_step"][-1]))
sys.argv = ["ppo_minimal.py", "--env-id", "CartPole-v1", *{flags}]  # discrete, as a script
runpy.run_path("ppo_minimal.py", run_name="__main__")
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("algos", "common", "benchmarks"))
assert not ours, ours
"""


def run_alone(args, tmp_path):
    """Run `python -I args` in `tmp_path` without PYTHONPATH (the repository is still installed
    editable, so a stray `import common` would succeed: the callers check what was loaded)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-I", *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.subprocess
def test_copied_alone_it_trains_from_python_and_its_command_line_without_the_repository(
        tmp_path):
    """One process in an empty folder holding only the file: imported (which starts neither
    gymnax nor JAX's backend), it trains Pendulum (continuous actions) from Python; then,
    run as a script (`runpy`, `__name__ == "__main__"`), its command line trains CartPole
    (discrete). Not one module of the repository is loaded: not in `sys.modules` at the end,
    nor in what `-X importtime` lists on stderr (every module the process imported)."""
    shutil.copy(SOURCE, tmp_path / "ppo_minimal.py")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    result = run_alone(["-X", "importtime", "-c", SCRIPT.format(tiny=TINY, flags=flags)],
                       tmp_path)
    assert "Pendulum-v1 trained 512" in result.stdout, result.stdout
    assert "CartPole-v1: final episodic return" in result.stdout and "SPS" in result.stdout
    assert "(512 steps, compiled in" in result.stdout, result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tyro" in imported and "gymnax" in imported  # the listing works
    ours = sorted(m for m in imported if m.split(".")[0] in ("algos", "common", "benchmarks"))
    assert not ours, ours


COMPILE_LOG = {"compiling": "Finished jaxpr to MLIR module conversion jit(train)",
               "training": "Finished XLA compilation of jit(train)"}
"""What JAX logs (`JAX_LOG_COMPILES`) as `train`'s program goes to XLA's compiler, and as
it comes back from it."""
JAX_LOG_LINES = ("Finished tracing ", "Compiling ", "Finished jaxpr to MLIR module conversion ",
                 "Finished XLA compilation ")


@pytest.mark.subprocess
@pytest.mark.parametrize("phase", ["importing", "compiling", "training"])
def test_ctrl_c_ends_its_command_line_at_once_without_a_traceback(phase):
    """SIGINT's default action, set before the imports: the process ends at once wherever it
    is, inside XLA's compiler too (no interpreter teardown under running compiler threads),
    and a shell reports exit status 130 (the next test: only where it runs as a script).
    Sent 0.5 s in, while JAX loads; or as soon as JAX logs that `train`'s program went to
    XLA's compiler, or came back from it (`COMPILE_LOG`)."""
    env = {**os.environ, **({} if phase == "importing" else {"JAX_LOG_COMPILES": "1"})}
    run = subprocess.Popen([sys.executable, SOURCE, "--total-timesteps", "100000000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, run.kill)  # a log line that never comes fails, not hangs
    watchdog.start()
    try:
        if phase == "importing":
            time.sleep(0.5)
        else:
            logged = next((line for line in run.stderr if line.startswith(COMPILE_LOG[phase])),
                          None)
            assert logged, run.communicate()
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = run.communicate(timeout=60)
    finally:
        watchdog.cancel()
    assert time.monotonic() - sent < 5.0
    assert run.returncode == -signal.SIGINT, (run.returncode, err[-2000:])
    # nothing after the signal, no traceback, no last words; at most a compile-log line JAX
    # wrote before the signal arrived (a busy machine may hold this process up)
    assert out == "" and [line for line in err.splitlines()
                          if not line.startswith(JAX_LOG_LINES)] == [], err[-2000:]


@pytest.mark.parametrize("run_name, ipython, default_action", [
    ("__main__", False, True),          # python ppo_minimal.py
    ("__main__", True, False),          # IPython's %run: Ctrl-C stays the session's
    ("ppo_minimal", False, False),      # import ppo_minimal
])
def test_only_a_script_takes_ctrl_c_s_default_action(run_name, ipython, default_action,
                                                     monkeypatch):
    """The file's top level run as `run_name` (`--help`: `main()` parses and exits)."""
    if ipython:
        monkeypatch.setitem(sys.modules, "IPython", type(sys)("IPython"))
    monkeypatch.setattr(sys, "argv", ["ppo_minimal.py", "--help"])
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) if run_name == "__main__" else contextlib.nullcontext():
            runpy.run_path(SOURCE, run_name=run_name)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert after is (signal.SIG_DFL if default_action else before)


# ------------------------------------------------------------------ the same numbers as ppo.py
MATCH = {  # CartPole: episodes terminate; Pendulum: continuous, truncated at step 200
    "CartPole-v1": dict(num_envs=4, num_steps=32, total_timesteps=3 * 128),   # 3 updates
    "Pendulum-v1": dict(num_envs=2, num_steps=128, total_timesteps=2 * 256),  # 2 updates
}


@functools.cache
def minimal_train(config: ppo_minimal.Config):
    """`(train, jit(train))` of the file's `make_train(config)`, built once per config: the
    CartPole program of the comparison below also serves the vmapped-seeds test."""
    train = ppo_minimal.make_train(config)
    return train, jax.jit(train)


@pytest.mark.parametrize("env_id", MATCH)
def test_same_numbers_as_algos_ppo_where_the_configs_coincide(env_id):
    """MLP, gymnax, no normalisation, one minibatch (so that the two files' different shuffles
    do not matter), default epochs: the same key gives the same parameters, environments and
    metrics, to float rounding (measured: parameters within 6e-8, metrics within 2e-6 relative).
    """
    shared = dict(env_id=env_id, num_minibatches=1, **MATCH[env_id])
    assert dataclasses.asdict(ppo_minimal.Config(**shared)).items() <= \
        dataclasses.asdict(ppo.Config(**shared)).items()
    key = jax.random.PRNGKey(3)
    full, full_metrics = jax.jit(ppo.make_train(ppo.Config(**shared)))(key)
    mini, mini_metrics = minimal_train(ppo_minimal.Config(**shared))[1](key)

    assert jax.tree.structure(full.params) == jax.tree.structure(mini.params)
    worst = 0.0
    for (path, a), b in zip(jax.tree.leaves_with_path(full.params), jax.tree.leaves(mini.params)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
    np.testing.assert_array_equal(mini.obs, full.env.obs)
    np.testing.assert_allclose(mini.episode_return, full.env.episode_return, rtol=1e-6)
    np.testing.assert_array_equal(mini.episode_length, full.env.episode_length)
    # the one metric it lacks: starts from a pool, which it does not have (a reset every step)
    assert set(mini_metrics) == set(full_metrics) - {"repeated_starts"}
    for name in mini_metrics:
        np.testing.assert_allclose(mini_metrics[name], full_metrics[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        diff = np.abs(np.asarray(mini_metrics[name], float) - np.asarray(full_metrics[name]))
        print(f"{env_id} {name}: largest difference {np.nanmax(diff, initial=0.0):.1e}")
    ended = np.asarray(full_metrics["episodic_length"])
    if env_id == "Pendulum-v1":  # a truncation in the second update, and GAE bootstrapped it
        np.testing.assert_array_equal(ended, [np.nan, 200.0])
    else:
        assert np.isfinite(ended).all() and (ended < 100).all()  # terminations
    print(f"{env_id}: largest parameter difference {worst:.1e}")


def test_vmapped_train_never_batches_a_qr():
    """The jaxlib 0.10 CPU deadlock (docs/performance.md): a vmapped orthogonal initialiser is a
    batched QR, which can hang `jit(vmap(train))`. The file's `orthogonal` runs one per seed."""
    train = ppo_minimal.make_train(ppo_minimal.Config(env_id="CartPole-v1", **TINY))
    jaxpr = jax.make_jaxpr(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(0), 2)).jaxpr
    shapes = qr_operand_shapes(jaxpr)
    assert shapes and all(len(shape) == 2 for shape in shapes), shapes


def test_vmapped_seeds_equal_each_seed_alone():
    """The CartPole config of the comparison with `algos/ppo.py` (its program, compiled once)."""
    config = ppo_minimal.Config(env_id="CartPole-v1", num_minibatches=1, **MATCH["CartPole-v1"])
    train, single = minimal_train(config)
    keys = jax.random.split(jax.random.PRNGKey(7), 2)
    states, metrics = jax.jit(jax.vmap(train))(keys)
    for i in range(2):
        state, alone = single(keys[i])
        for name in metrics:
            np.testing.assert_allclose(metrics[name][i], alone[name], rtol=1e-4, atol=1e-6,
                                       err_msg=f"seed {i}: {name}")
        for a, b in zip(jax.tree.leaves(states.params), jax.tree.leaves(state.params)):
            np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-6)
    assert metrics["global_step"].shape == (2, config.num_updates)
    assert not np.allclose(metrics["value_loss"][0], metrics["value_loss"][1])  # seeds differ


# ------------------------------------------------------------------ learning
def test_it_learns_cartpole():
    """Key 0, 50k steps, the default config otherwise (about 3 CPU s here). Measured: the
    same run with learning rate 1e-12 returns 23.3 over the last 10% of updates (22.2-23.4
    over keys 0-2), the first 5 updates 24.2; the trained policy 190 over the last 10%
    (189-264 over keys 0-2; at 100k steps 232-289)."""
    config = ppo_minimal.Config(env_id="CartPole-v1", total_timesteps=50_000)
    _, metrics = jax.jit(ppo_minimal.make_train(config))(jax.random.PRNGKey(0))
    returns = np.asarray(metrics["episodic_return"])
    assert np.nanmean(returns[:5]) < 40, returns[:5]
    final = np.nanmean(returns[-config.num_updates // 10:])
    assert final > 150, final


# ------------------------------------------------------------------ the config
def test_defaults_are_algos_ppo_s():
    mini, full = dataclasses.asdict(ppo_minimal.Config()), dataclasses.asdict(ppo.Config())
    assert mini.items() <= full.items(), {k: (v, full.get(k)) for k, v in mini.items()
                                          if full.get(k) != v}
    for name in ("batch_size", "minibatch_size", "num_updates"):
        assert getattr(ppo_minimal.Config(), name) == getattr(ppo.Config(), name)
    assert ppo_minimal.HParams._fields == ppo.HParams._fields


@pytest.mark.parametrize("overrides, message", [
    (dict(num_envs=0), "--num-envs must be a positive integer, got 0."),
    (dict(num_envs=3, num_steps=5), "num_envs * num_steps = 15 is not divisible by "
                                    "--num-minibatches 4"),
    (dict(num_envs=1, num_steps=4), "--norm-adv needs minibatches of 2 samples or more"),
    (dict(total_timesteps=100), "--total-timesteps must be at least one rollout"),
    (dict(gamma=1.5), "--gamma must be in [0, 1], got 1.5."),
    (dict(learning_rate=float("nan")), "--learning-rate must be > 0, got nan."),
    (dict(env_id="CartPole-v2"), "Did you mean 'CartPole-v1'"),
])
def test_bad_configs_raise_one_clear_line(overrides, message):
    """Building the Config raises: nothing is compiled (make_train is never reached)."""
    with pytest.raises(ValueError) as error:
        ppo_minimal.Config(**overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
