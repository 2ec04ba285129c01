"""Helpers several test files share."""

import dataclasses
import functools
import importlib
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp

from common.host import checkpoint, logger
from common.host.options import RunOptions

ALGOS = ("ppo", "a2c", "impala")

TINY = dict(total_timesteps=4096, num_envs=4, num_steps=32)
"""A tiny config, valid for all three algorithms."""

TINY_RUNS = {
    "ppo": dict(total_timesteps=2048, num_envs=4, num_steps=32, num_minibatches=2,
                update_epochs=2),                                   # 16 updates
    "a2c": dict(total_timesteps=400, num_envs=4, num_steps=5),      # 20 updates
    "impala": dict(total_timesteps=4 * 16 * 6, num_envs=4, num_steps=16, actor_lag=2),  # 6
}
"""The CartPole configs `tiny_run` compiles, one per algorithm."""


EXACT = {"xla_cpu_use_fusion_emitters": True}
"""Compiler options for a program that must give the same bits as a program of another shape
(updates one at a time against the whole run in one call of `train`). The suite compiles with
XLA:CPU's older loop emitters for speed (`conftest.FAST_COMPILE`), and these can fuse the same
arithmetic differently in such programs, so the last bits of a float can differ; the fusion
emitters, XLA's default and what a user's run compiles with, give equal bits. (Chunks of
several updates against all updates in one `run_updates` call are the same program but for
the trip count, and equal bit for bit either way.)"""


def stacked(hparams, n: int):
    """`n` copies of `hparams` with a leading axis, for `vmap(train)(keys, hparams)`."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), hparams)


class TinyRun:
    """The tiny CartPole config of `algos/<algo>.py` (`TINY_RUNS`), each program compiled at
    most once per test process (`tiny_run`).

    `keys` are 3 seeds. `batched` is `jit(vmap(train))`, `init` and `run_updates` the jitted
    pieces, `alone(key, hp)` one run of all the updates from them (`init`, then one
    `run_updates` call), `single` `jit(train)`, and `result` (computed on first use)
    `batched(keys, hp for 3 runs)`. Call `single` and `batched` with explicit hparams, so that
    each compiles once. `train` prints no progress (`live_progress=False`): a program with a
    host callback is never written to the persistent compilation cache, and these programs
    are shared through it by the test files on other workers.
    """

    def __init__(self, algo: str, **overrides):
        self.module = importlib.import_module(f"algos.{algo}")
        self.config = self.module.Config(**{"env_id": "CartPole-v1", **TINY_RUNS[algo],
                                            **overrides})
        self.hp = self.config.hparams()
        self.train = self.module.make_train(self.config)
        self.keys = jax.random.split(jax.random.PRNGKey(42), 3)
        self.single = jax.jit(self.train)
        self.batched = jax.jit(jax.vmap(self.train))
        self.init = jax.jit(self.train.init)
        self.run_updates = jax.jit(self.train.run_updates)

    def alone(self, key, hp):
        """`(TrainState, metrics)` of one run: `init`, then all its updates in one
        `run_updates` call (the pieces the command line runs)."""
        return self.run_updates(self.init(key, hp), hp, jnp.arange(self.config.num_updates))

    @functools.cached_property
    def result(self):
        return self.batched(self.keys, stacked(self.hp, 3))


@functools.cache
def tiny_run(algo: str, network: str = "auto") -> TinyRun:
    """The `TinyRun` of `algo`, shared by every test of this process; `network="gru"` or
    `"lstm"`: the same run with a small recurrent network on velocity-hidden CartPole
    (`GRU_RUN`, with that core)."""
    recurrent = {**GRU_RUN, "network": network} if network in ("gru", "lstm") else {}
    return TinyRun(algo, **recurrent)


GRU_RUN = dict(env_id="MaskedCartPole-v1", network="gru", hidden_size=16)
"""What `tiny_run(algo, "gru")` changes."""


def initial_state(algo: str, num_seeds: int = 1, **overrides):
    """`(config, train, vmapped initial TrainState)` of a tiny config of `algos/<algo>.py`."""
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(**{**TINY, **overrides})
    train = module.make_train(config)
    keys = logger.seed_keys(1, num_seeds)
    return config, train, jax.jit(jax.vmap(train.init))(
        keys, jax.vmap(lambda _: config.hparams())(keys))


def save_initial(path, algo: str, num_seeds: int = 1, **overrides) -> str:
    """A checkpoint of a freshly initialised run of `algos/<algo>.py` (nothing trained)."""
    config, _, state = initial_state(algo, num_seeds, **overrides)
    checkpoint.save(str(path), algo=algo, config=dataclasses.asdict(config),
                    run=dataclasses.asdict(RunOptions(num_seeds=num_seeds, exp_name=algo)),
                    run_names=[f"{algo}_run_{i}" for i in range(num_seeds)], update=0,
                    run_time=0, train_state=state, metrics={})
    return str(path)


def record_progress(monkeypatch, interrupt_after: int | None = None) -> list:
    """The step counts the command line reports from now on (`logger.Progress.report` patched
    to record them): a resumed run's first report is the step it resumed from, one report a
    chunk after that, so a test sees that it continued rather than trained from the start.
    `interrupt_after`: raise SIGINT in this process after that many reports (Ctrl-C while
    the run prints its progress)."""
    steps = []
    report = logger.Progress.report

    def recorded(self, step, *args, **kwargs):
        report(self, step, *args, **kwargs)
        steps.append(int(step))
        if len(steps) == interrupt_after:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(logger.Progress, "report", recorded)
    return steps


def inner_jaxprs(eqn) -> list:
    """The programs nested in the equation `eqn`: a scan's or while's body, a jitted call's,
    a cond's branches (open jaxprs, whether the equation holds them closed or open)."""
    found = []
    for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def all_eqns(jaxpr):
    """Every equation of `jaxpr` and of the programs nested in it, each before those nested
    in it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for inner in inner_jaxprs(eqn):
            yield from all_eqns(inner)


def qr_operand_shapes(jaxpr) -> list:
    """The operand shapes of every QR decomposition in `jaxpr`, nested programs included (a
    batched QR, under `vmap`, is the jaxlib 0.10 CPU deadlock's trigger)."""
    return [v.aval.shape for eqn in all_eqns(jaxpr)
            if eqn.primitive.name in ("qr", "geqrf", "geqp3")  # not "sqrt"
            for v in eqn.invars]


def interrupted_while_importing(args: list, cwd: str):
    """Start `python -X importtime *args` in `cwd`, send Ctrl-C once JAX has been imported
    (`-X importtime` writes a line as each module is done), and return `(returncode, stderr
    lines but the import times', stdout)`."""
    run = subprocess.Popen([sys.executable, "-X", "importtime", *args], cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in run.stderr:
        if line.split("|")[-1].strip() == "jax":
            break
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    lines = [line for line in err.splitlines()
             if line.strip() and not line.startswith("import time:")]
    return run.returncode, lines, out


def traces_around_make_env(monkeypatch, env_cls, backend: str, *make_env_args) -> tuple:
    """The calls of `env_cls.reset` and `.step_env` (their Python running, as when traced)
    that `make_env(*make_env_args)` makes with `jax.default_backend()` forced to `backend`,
    and those after it, when a program of a first state and a 6-step rollout with the default
    pool is traced for 2 seeds x 2 environments (`jit(...).trace`: the Python runs there, not
    in lowering): `(during make_env, both together)`."""
    from common.envs import make_env
    from common.rollout import reset, rollout

    calls = []

    def counted(method):
        def run(self, *args, **kwargs):
            calls.append(method.__name__)
            return method(self, *args, **kwargs)
        return run

    monkeypatch.setattr(env_cls, "reset", counted(env_cls.reset))
    monkeypatch.setattr(env_cls, "step_env", counted(env_cls.step_env))
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    env, params, spec = make_env(*make_env_args)
    during = list(calls)

    def policy(key, obs, first, hidden):
        return jax.random.normal(key, (obs.shape[0], spec.action_dim)), (), hidden

    def run(key):
        return rollout(env, params, spec, policy, reset(env, params, key, 2), key, 6)

    jax.jit(jax.vmap(run)).trace(jax.random.split(jax.random.PRNGKey(0), 2))
    return during, calls
