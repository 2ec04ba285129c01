"""The command-line driver the algorithm files share: compile once, train in chunks, log.

`train_and_log` runs `num_seeds` vmapped runs as a sequence of calls to one compiled chunk of
updates (`train.run_updates`). Between chunks, on the host, it

- prints progress;
- stops on a NaN/inf loss or parameter, naming the quantity, the update and the seed, and
  leaves the last checkpoint as it was (a bad state is never saved);
- evaluates the deterministic policy every `eval_every` updates (`common/evaluate.py`);
- writes the whole training state every `checkpoint_every` updates, at the end, and when
  Ctrl-C (SIGINT) or SIGTERM arrives (`common/checkpoint.py`), from which `--resume`
  continues exactly.

The chunks change no number: a run chunked, interrupted and resumed equals `train.init`
followed by all the updates in one `train.run_updates` call, bitwise on the same machine
(`tests/test_checkpoint.py`). (The fused `jit(vmap(train))(keys)` is compiled as one program
with `init` inside it and can differ from both by rounding.) The chunks also keep host
callbacks out of the compiled program, so it lands in JAX's persistent compilation cache: a
second identical command skips compilation.
"""

import dataclasses
import math
import os
import signal
import sys
import threading
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from common import checkpoint, logger
from common.envs import make_env
from common.evaluate import evaluate

RUN_OPTIONS = ("exp_name", "log_dir", "live_progress", "checkpoint_every", "resume",
               "eval_every", "eval_episodes")
"""Config fields that change how a run is driven, not what it computes: a resumed run may
change them. Every other field must equal the checkpoint's."""

NAN_BY_DESIGN = ("episodic_return", "episodic_length", "explained_variance", "eval_return")
"""Metrics that may be NaN in a healthy run (no episode finished in an update, a constant
return); every other metric and every parameter is checked for NaN/inf after each chunk."""


def parse_config(config_cls, argv=None):
    """Build a config from the command line with tyro; a bad value exits 2 with one line.

    tyro parses into a copy of the class without `__post_init__`, so that the config's own
    validation message reaches the user as one line rather than inside tyro's error box. With
    `--resume PATH`, the saved run's config gives the defaults: flags not given continue the
    saved run, and a given flag that changes it is refused by `train_and_log`.
    """
    import tyro

    unchecked = type(config_cls.__name__, (config_cls,),
                     {"__post_init__": lambda self: None, "__doc__": config_cls.__doc__,
                      "__module__": config_cls.__module__})
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        default, resume = None, _flag_value(argv, "--resume")
        if resume is not None:
            saved = checkpoint.load(checkpoint.resolve(resume))["config"]
            names = {f.name for f in dataclasses.fields(config_cls)} - {"resume"}
            default = unchecked(**{k: v for k, v in saved.items() if k in names})
        parsed = tyro.cli(unchecked, args=argv, default=default)
        return config_cls(**{f.name: getattr(parsed, f.name)
                             for f in dataclasses.fields(config_cls)})
    except ValueError as error:  # checkpoint.CheckpointError included
        fail(error)


def fail(message, code: int = 2):
    """Print `error: message` on one line of stderr and exit with `code`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code) from None


def _flag_value(argv, flag: str):
    """The value of `--flag VALUE` or `--flag=VALUE` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def chunk_size(num_updates: int, *boundaries: int, target_chunks: int = 20) -> int:
    """The largest divisor of `num_updates` that gives at least `target_chunks` chunks and
    also divides every positive number in `boundaries`.

    A divisor, so every chunk has the same length and one compiled program serves them all;
    `boundaries` are the checkpoint and evaluation cadences and the update a run resumes from,
    so that each falls exactly on the end of a chunk.
    """
    common = num_updates
    for b in boundaries:
        if b > 0:
            common = math.gcd(common, b)
    limit = min(common, max(1, num_updates // target_chunks))
    return max(d for d in range(1, limit + 1) if common % d == 0)


def first_non_finite(metrics: dict, params, first_update: int):
    """`(quantity, update, seed index)` of the earliest NaN/inf in a chunk, or None.

    `metrics` are the chunk's rows [num_seeds, chunk] (names in `NAN_BY_DESIGN` skipped),
    `params` the vmapped parameters after the chunk (a bad one is dated to its last update).
    """
    found = []
    for name, rows in metrics.items():
        bad = ~np.isfinite(np.asarray(rows))
        if name not in NAN_BY_DESIGN and bad.any():
            seed, step = min(np.argwhere(bad), key=lambda sc: sc[1])
            found.append((first_update + int(step), name, int(seed)))
    last = first_update + next(iter(metrics.values())).shape[1] - 1
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        bad = ~np.isfinite(np.asarray(leaf)).reshape(leaf.shape[0], -1).all(axis=1)
        if bad.any():
            found.append((last, f"parameter {jax.tree_util.keystr(path)}", int(np.argmax(bad))))
    if not found:
        return None
    update, name, seed = min(found, key=lambda f: f[0])
    return name, update, seed


class Interrupt:
    """Catches Ctrl-C (SIGINT) and SIGTERM while training: `signal` is set, the loop finishes
    its chunk, writes a checkpoint and exits. A second signal acts at once (the previous
    handlers are back), which the atomic checkpoint writes make safe."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signal, self.previous = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal() works only there
            for s in self.SIGNALS:
                previous = signal.signal(s, self._handle)
                self.previous[s] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum, frame):
        self.signal = signum
        self.__exit__()
        print(f"\n{signal.Signals(signum).name}: stopping after this chunk to write a "
              "checkpoint (send it again to stop at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}


def resume(path: str, name: str, config, template):
    """`(train state, checkpoint record)` to continue `config`'s run of algorithm `name` from
    the checkpoint at `path`; `CheckpointError` names what does not match."""
    record = checkpoint.load(path)
    if record["algo"] != name:
        raise checkpoint.CheckpointError(
            f"{path!r} holds a {record['algo']} run; resume it with algos/{record['algo']}.py, "
            f"not algos/{name}.py.")
    differences = checkpoint.config_differences(record["config"], dataclasses.asdict(config),
                                                RUN_OPTIONS)
    if differences:
        raise checkpoint.CheckpointError(f"cannot resume {path!r} with a different config "
                                         f"(saved -> now): {'; '.join(differences)}.")
    return checkpoint.restore(template, record["train_state"], path), record


def train_and_log(algo: str, config, train):
    """Train `config.num_seeds` runs of `train` (from `make_train`), checkpoint, and log them.

    Returns the metrics as NumPy arrays with leading axes `[num_seeds, num_updates]` (with
    `eval_return` where evaluations ran, NaN elsewhere). A bad checkpoint or config, a
    non-finite loss or a signal ends the process (`SystemExit`) with a one-line message.
    """
    logger.enable_compilation_cache()  # first: every program below can come from the cache
    name = algo.lower()
    keys = logger.seed_keys(config.seed, config.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    num_updates, batch_size = config.num_updates, config.batch_size
    steps = num_updates * batch_size

    start = time.perf_counter()
    init = jax.vmap(train.init)
    template = jax.eval_shape(init, keys, hparams)
    if config.resume:
        path = checkpoint.resolve(config.resume)
        try:
            state, record = resume(path, name, config, template)
        except checkpoint.CheckpointError as error:
            fail(error)
        first, run_time = record["update"], record["run_time"]
        rows = [record["metrics"]] if first > 0 else []
        saved_update = first
    else:
        state, first, run_time, rows, saved_update = jax.jit(init)(keys, hparams), 0, \
            int(time.time()), [], None
        path = os.path.join(config.log_dir, logger.run_name(
            config.env_id, config.exp_name, config.seed, run_time), checkpoint.LATEST)

    if first == num_updates:
        print(f"nothing to do: {path} is at update {first} of {num_updates}, the end of the run")
        return _concat(rows)

    chunk = chunk_size(num_updates, config.checkpoint_every, config.eval_every, first)
    run_chunk = jax.jit(jax.vmap(train.run_updates, in_axes=(0, 0, None))).lower(
        template, hparams, jnp.arange(chunk)).compile()
    if config.eval_every:
        env, env_params, spec = make_env(config.env_id)
        run_eval = jax.jit(jax.vmap(lambda s, k: evaluate(
            partial(train.act, s), env, env_params, spec, k, config.eval_episodes)[0].mean())
        ).lower(template, keys).compile()
    compile_time = time.perf_counter() - start

    def save(update):
        checkpoint.save(path, algo=name, config=dataclasses.asdict(config), update=update,
                        run_time=run_time, train_state=state, metrics=_concat(rows))

    progress = logger.Progress(f"{name} {config.env_id}", steps)
    start = time.perf_counter()
    progress.report(first * batch_size, [])
    with Interrupt() as interrupt:
        for begin in range(first, num_updates, chunk):
            end = begin + chunk
            state, metrics = run_chunk(state, hparams, jnp.arange(begin, end))
            metrics = jax.device_get(metrics)
            bad = first_non_finite(metrics, state.params, begin)
            if bad is not None:
                quantity, update, seed = bad
                last = f"{path} (update {saved_update})" if saved_update is not None else \
                    "none was written"
                fail(f"non-finite {quantity} in update {update + 1} (global step "
                     f"{(update + 1) * batch_size:,}, seed {config.seed + seed}); training "
                     f"stopped. Last good checkpoint: {last}.", code=1)
            if config.eval_every and (end % config.eval_every == 0 or end == num_updates):
                # Keys fold in the update: independent of training's, the same on resume.
                eval_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, end)
                metrics["eval_return"] = np.full((config.num_seeds, chunk), np.nan, np.float32)
                metrics["eval_return"][:, -1] = jax.device_get(run_eval(state, eval_keys))
            rows.append(metrics)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a chunk may finish no episode
                recent = np.nanmean(metrics["episodic_return"], axis=1)
            progress.report(end * batch_size, recent, final=end == num_updates)
            every = config.checkpoint_every
            if end == num_updates or (every and end % every == 0) or interrupt.signal:
                save(end)
                saved_update = end
            if interrupt.signal and end < num_updates:
                print(f"interrupted at update {end} of {num_updates}; checkpoint: {path}\n"
                      f"continue with: python algos/{name}.py --resume {path}", flush=True)
                raise SystemExit(128 + interrupt.signal)
    train_time = time.perf_counter() - start
    metrics = _concat(rows)

    sps = logger.sps_points(progress.timeline, config.num_seeds)
    paths = []
    for i in range(config.num_seeds):
        run = logger.run_name(config.env_id, config.exp_name, config.seed + i, run_time)
        paths.append(logger.write_tensorboard(
            config.log_dir, run, config, {k: v[i] for k, v in metrics.items()}, sps))
    final = logger.final_return(metrics["episodic_return"])
    more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
    trained = (num_updates - first) * batch_size * config.num_seeds
    print(f"done: {algo} on {config.env_id}, {config.num_seeds} run(s) x {steps:,} steps | final "
          f"return (last 10% of updates) mean {np.mean(final):.2f}, min {np.min(final):.2f} | "
          f"compile {compile_time:.1f}s, train {train_time:.1f}s "
          f"({trained / max(train_time, 1e-9):,.0f} SPS) | logs: {paths[0]}{more} | "
          f"checkpoint: {path}")
    return metrics


def _concat(rows: list) -> dict:
    """Join per-chunk metric dicts along the update axis; a metric missing from a chunk (an
    evaluation that did not run then) is NaN there."""
    if not rows:
        return {}
    names = dict.fromkeys(k for r in rows for k in r)

    def column(r, k):
        if k in r:
            return np.asarray(r[k])
        return np.full(np.shape(next(iter(r.values()))), np.nan, np.float32)

    return {k: np.concatenate([column(r, k) for r in rows], axis=1) for k in names}
