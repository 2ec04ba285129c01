"""The command-line driver the algorithm files share: parse, set up, compile once, train in
chunks, log.

`main(algo, Config, make_train)` is every algorithm's `main()`. It reads the run options
(`common/host/options.py`) and the algorithm's `Config` from one flat list of flags, starts
JAX's runtime for the devices asked for (`common/host/devices.py`), and trains `num_seeds`
vmapped runs as a sequence of calls to one compiled chunk of updates (`train.run_updates`).
While the devices run one chunk, the host handles the one before (file writes on a background
thread, `logger.BackgroundWriter`):

- prints progress and writes TensorBoard (one run per seed);
- stops on a NaN/inf loss or parameter, naming the quantity, the update and the seed, and
  leaves the last checkpoint as it was (a bad state is never saved);
- evaluates the deterministic policy every `eval_every` updates (`common/evaluate.py`);
- writes the whole training state every `checkpoint_every` updates, at the end, and when
  Ctrl-C (SIGINT) or SIGTERM arrives (`common/host/checkpoint.py`), from which `--resume`
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
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from common.evaluate import evaluate
from common.host import checkpoint, logger
from common.host.devices import (Layout, fail, fetch, from_process_0, peers_alive,
                                 same_everywhere, setup_devices)
from common.host.options import RESUME_MUST_MATCH, RunOptions

NAN_BY_DESIGN = ("episodic_return", "episodic_length", "explained_variance", "eval_return")
"""Metrics that may be NaN in a healthy run (no episode finished in an update, a constant
return); every other metric and every parameter is checked for NaN/inf after each chunk."""


def main(algo: str, config_cls, make_train, argv=None):
    """`python algos/<algo>.py [flags]`: parse, set up JAX, build `train`, train and log."""
    config, run = parse(algo, config_cls, argv)
    setup_devices(run)  # before anything starts JAX's backend (make_env does)
    from common.host.prng import unroll_threefry_on_cpu

    unroll_threefry_on_cpu()  # the command line's choice: the same random bits, faster on CPU
    try:
        train = make_train(config)
    except ValueError as error:  # e.g. a network the environment cannot take
        fail(error)
    return train_and_log(algo, config, run, train)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------
def parse(algo: str, config_cls, argv=None):
    """`(config, run)` from the command line with tyro; a bad value exits 2 with one line.

    The flags of `RunOptions` and of `config_cls` form one flat list (no prefixes). tyro parses
    into copies of both classes without `__post_init__`, so that their own validation message
    reaches the user as one line rather than inside tyro's error box. With `--resume PATH`,
    the saved run gives the defaults: flags not given continue the saved run, and a given flag
    that changes it is refused by `train_and_log`.
    """
    import tyro

    unchecked = {cls: _without_checks(cls) for cls in (RunOptions, config_cls)}
    command = dataclasses.make_dataclass("Command", [
        ("run", Annotated[unchecked[RunOptions], tyro.conf.OmitArgPrefixes]),
        ("config", Annotated[unchecked[config_cls], tyro.conf.OmitArgPrefixes])])
    command.__doc__ = config_cls.__doc__
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        saved_run, saved_config = {"exp_name": algo}, {}
        resume = _flag_value(argv, "--resume")
        if resume is not None:
            record = checkpoint.load(checkpoint.resolve(resume))
            saved_run, saved_config = record["run"], record["config"]
        default = command(_build(unchecked[RunOptions], RunOptions, saved_run, skip={"resume"}),
                          _build(unchecked[config_cls], config_cls, saved_config))
        parsed = tyro.cli(command, args=argv, default=default)
        return (config_cls(**dataclasses.asdict(parsed.config)),
                RunOptions(**dataclasses.asdict(parsed.run)))
    except ValueError as error:  # checkpoint.CheckpointError included
        fail(error)


def _without_checks(cls):
    """A copy of dataclass `cls` whose `__post_init__` checks nothing."""
    return type(cls.__name__, (cls,), {"__post_init__": lambda self: None,
                                       "__doc__": cls.__doc__, "__module__": cls.__module__})


def _build(unchecked, cls, values: dict, skip=()):
    """`unchecked(**values)` keeping only the fields of `cls` (and none in `skip`)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    return unchecked(**{k: v for k, v in values.items() if k in names})


def _flag_value(argv, flag: str):
    """The value of `--flag VALUE` or `--flag=VALUE` in `argv`, or None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None



# --------------------------------------------------------------------------------------------
# The run, step by step
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Session:
    """What the steps of one command share."""

    algo: str
    config: Any
    run: RunOptions
    train: Any
    layout: Layout
    template: Any
    """`jax.eval_shape` of the vmapped `train.init`: the TrainState's structure."""
    keys: Any
    hparams: Any
    state: Any = None
    first: int = 0
    """The update this process starts from (0, or the resumed checkpoint's)."""
    run_time: int = 0
    path: str = ""
    """The checkpoint file."""
    rows: list = dataclasses.field(default_factory=list)
    saved_update: int | None = None
    compile_time: float = 0.0
    train_time: float = 0.0
    files: Any = None
    """The `logger.BackgroundWriter` of the training loop (TensorBoard, checkpoints)."""

    @property
    def writer(self) -> bool:
        return jax.process_index() == 0

    def run_names(self) -> list[str]:
        return [logger.run_name(self.config.env_id, self.run.exp_name, self.run.seed + i,
                                self.run_time) for i in range(self.run.num_seeds)]


def train_and_log(algo: str, config, run: RunOptions, train):
    """Train `run.num_seeds` runs of `train` (from `make_train(config)`), checkpoint, log them.

    Returns the metrics as NumPy arrays with leading axes `[num_seeds, num_updates]` (with
    `eval_return` where evaluations ran, NaN elsewhere). A bad checkpoint or config, a
    non-finite loss or a signal ends the process (`SystemExit`) with a one-line message.
    The runs are spread over devices (and processes) as `Layout` describes; every process
    returns the same metrics, and only process 0 writes checkpoints and logs.
    """
    logger.enable_compilation_cache()  # first: every program below can come from the cache
    setup_devices(run)  # a no-op when `main` did it or JAX already runs
    start = time.perf_counter()
    session = start_or_resume(algo, config, run, train)
    if session.first == config.num_updates:
        print(f"nothing to do: {session.path} is at update {session.first} of "
              f"{config.num_updates}, the end of the run")
        return _concat(session.rows)
    run_chunk, run_eval, chunk = compile_programs(session)
    session.compile_time = time.perf_counter() - start
    train_in_chunks(session, run_chunk, run_eval, chunk)
    return summarise(session)


def start_or_resume(algo: str, config, run: RunOptions, train) -> Session:
    """Lay the runs out on the devices and give them their first state: fresh from
    `train.init`, or the checkpoint's with `--resume`."""
    keys = logger.seed_keys(run.seed, run.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    template = jax.eval_shape(jax.vmap(train.init), keys, hparams)
    layout = Layout(run, config.num_envs, template)
    session = Session(algo, config, run, train, layout, template,
                      layout.put(keys, layout.seeds), layout.put(hparams, layout.seeds))
    if run.resume:
        session.path = checkpoint.resolve(run.resume)
        try:
            state, record = resume(session.path, algo, config, run, template)
        except checkpoint.CheckpointError as error:
            fail(error)
        session.state = layout.put(state, layout.state)
        session.first, session.run_time = record["update"], record["run_time"]
        session.rows = [record["metrics"]] if session.first > 0 else []
        session.saved_update = session.first
        return session
    try:
        init = layout.spread(jax.vmap(train.init), (layout.seeds, layout.seeds), layout.state)
        session.state = init(session.keys, session.hparams)
    except ValueError as error:  # sizes that do not split across the devices
        fail(error)
    session.run_time = int(from_process_0(int(time.time())))  # process 0's clock names the run
    session.path = os.path.join(run.log_dir, session.run_names()[0], checkpoint.LATEST)
    return session


def resume(path: str, algo: str, config, run: RunOptions, template):
    """`(train state, checkpoint record)` to continue `config`'s run of `algo` from the
    checkpoint at `path`; `CheckpointError` names what does not match."""
    record = checkpoint.load(path)
    if record["algo"] != algo:
        raise checkpoint.CheckpointError(
            f"{path!r} holds a {record['algo']} run; resume it with algos/{record['algo']}.py, "
            f"not algos/{algo}.py.")
    now = {k: getattr(run, k) for k in RESUME_MUST_MATCH}
    differences = checkpoint.config_differences(record["config"], dataclasses.asdict(config)) \
        + checkpoint.config_differences({k: record["run"].get(k) for k in now}, now)
    if differences:
        raise checkpoint.CheckpointError(f"cannot resume {path!r} with a different config "
                                         f"(saved -> now): {'; '.join(differences)}.")
    return checkpoint.restore(template, record["train_state"], path), record


def compile_programs(s: Session):
    """`(run_chunk, run_eval, chunk)`: the compiled chunk of `chunk` updates for every run,
    and the compiled evaluation (None without `--eval-every`)."""
    run, layout = s.run, s.layout
    chunk = chunk_size(s.config.num_updates, run.checkpoint_every, run.eval_every, s.first)
    state_shapes = layout.shapes(s.template, layout.state)
    run_chunk = layout.spread(jax.vmap(s.train.run_updates, in_axes=(0, 0, None)),
                              (layout.state, layout.seeds, P()), (layout.state, layout.seeds))
    run_chunk = run_chunk.lower(state_shapes, layout.shapes(s.hparams, layout.seeds),
                                layout.shapes(jnp.arange(chunk), P())).compile()
    run_eval = None
    if run.eval_every:
        from common.envs import make_env

        env, env_params, spec = make_env(s.config.env_id)
        run_eval = layout.spread(jax.vmap(lambda state, k: evaluate(
            partial(s.train.act, state), env, env_params, spec, k, run.eval_episodes)[0].mean()),
            (layout.state, layout.seeds), layout.seeds)
        run_eval = run_eval.lower(state_shapes, layout.shapes(s.keys, layout.seeds)).compile()
    return run_chunk, run_eval, chunk


def train_in_chunks(s: Session, run_chunk, run_eval, chunk: int):
    """The loop: a chunk on the devices, then on the host the NaN guard, evaluation,
    progress, TensorBoard and checkpoints; Ctrl-C or SIGTERM saves and exits.

    The host never holds the devices up: the next chunk is queued (JAX dispatches
    asynchronously) before the host looks at this one, and the file work (TensorBoard, the
    checkpoint's serialisation and write) runs in order on a background thread. The
    guarantees are those of a serial loop: only a chunk that passed the NaN guard is saved,
    a checkpoint is always the state at the end of a chunk, and every write has finished
    before the loop returns or the process exits.
    """
    config, run, num_updates = s.config, s.run, s.config.num_updates
    progress = logger.Progress(f"{s.algo} {config.env_id}", num_updates * config.batch_size,
                               stream=None if s.writer else open(os.devnull, "w"))
    boards = open_boards(s)
    start = time.perf_counter()
    progress.report(s.first * config.batch_size, [])

    def dispatch(state, begin):
        updates = s.layout.put(np.arange(begin, begin + chunk, dtype=np.int32), P())
        return run_chunk(state, s.hparams, updates)

    try:
        with Interrupt() as interrupt, peers_alive(), logger.BackgroundWriter() as s.files:
            pending = dispatch(s.state, s.first)
            for begin in range(s.first, num_updates, chunk):
                end = begin + chunk
                s.state, metrics = pending
                if end < num_updates:  # the devices start on the next chunk, the host works
                    pending = dispatch(s.state, end)
                log_chunk(s, fetch(metrics), begin, end, run_eval, progress, boards)
                stop = from_process_0(interrupt.signal or 0)  # all processes stop together
                if end == num_updates or stop or (
                        run.checkpoint_every and end % run.checkpoint_every == 0):
                    save(s, end)
                if stop and end < num_updates:
                    s.files.flush()
                    if s.writer:
                        print(f"interrupted at update {end} of {num_updates}; checkpoint: "
                              f"{s.path}\ncontinue with: python algos/{s.algo}.py --resume "
                              f"{s.path}", flush=True)
                    raise SystemExit(128 + int(stop))
    finally:  # a NaN stop and a signal too: tensorboardX writes out its own queue on close
        for board in boards:
            board.close()
    s.train_time = time.perf_counter() - start


def log_chunk(s: Session, metrics: dict, begin: int, end: int, run_eval, progress, boards):
    """On the host, for the chunk of updates [begin, end): the NaN guard, the evaluation if
    one is due, the progress line, and the TensorBoard writes (queued)."""
    run = s.run
    stop_if_not_finite(s, metrics, begin)
    if run_eval is not None and (end % run.eval_every == 0 or end == s.config.num_updates):
        metrics["eval_return"] = np.full((run.num_seeds, end - begin), np.nan, np.float32)
        metrics["eval_return"][:, -1] = fetch(run_eval(s.state, s.layout.put(
            eval_keys(run, end), s.layout.seeds)))
    s.rows.append(metrics)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a chunk may finish no episode
        recent = np.nanmean(metrics["episodic_return"], axis=1)
    progress.report(end * s.config.batch_size, recent, final=end == s.config.num_updates)
    sps = logger.sps_points(progress.timeline[-2:], run.num_seeds)
    for i, board in enumerate(boards):
        s.files.put(board.write, {k: v[i] for k, v in metrics.items()}, sps)


def open_boards(s: Session) -> list:
    """Process 0's TensorBoard runs, one per seed; a resumed run first rewrites its saved
    updates over whatever the interrupted process wrote."""
    if not s.writer:
        return []
    hparams = {**dataclasses.asdict(s.run), **dataclasses.asdict(s.config)}
    boards = [logger.TensorBoardRun(s.run.log_dir, name, hparams, purge=s.first > 0)
              for name in s.run_names()]
    if s.rows:
        for i, board in enumerate(boards):
            board.write({k: v[i] for k, v in s.rows[0].items()})
    return boards


def eval_keys(run: RunOptions, update: int):
    """The evaluation keys after `update`: independent of training's, the same on resume."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(
        logger.seed_keys(run.seed, run.num_seeds), update)


def stop_if_not_finite(s: Session, metrics: dict, begin: int):
    """Exit 1, naming the quantity, update and seed, if the chunk from `begin` went NaN/inf."""
    bad = first_non_finite(metrics, fetch(s.state.params), begin)
    if bad is not None:
        s.files.flush()  # the last good checkpoint is on disk before it is named
        quantity, update, seed = bad
        last = f"{s.path} (update {s.saved_update})" if s.saved_update is not None else \
            "none was written"
        fail(f"non-finite {quantity} in update {update + 1} (global step "
             f"{(update + 1) * s.config.batch_size:,}, seed {s.run.seed + seed}); training "
             f"stopped. Last good checkpoint: {last}.", code=1)


def save(s: Session, update: int):
    """Checkpoint the runs after `update` (every process gathers, process 0 writes)."""
    host_state = fetch(s.state)
    if s.writer:  # serialised and written on the background thread, in order
        s.files.put(checkpoint.save, s.path, algo=s.algo, config=dataclasses.asdict(s.config),
                    run=dataclasses.asdict(s.run), update=update, run_time=s.run_time,
                    train_state=host_state, metrics=_concat(s.rows))
    s.saved_update = update


def summarise(s: Session) -> dict:
    """Check the processes agree, print the one-line summary, return the metrics."""
    config, run = s.config, s.run
    metrics = _concat(s.rows)
    if jax.process_count() > 1:
        same_everywhere(s.state.params, replicated=run.parallel == "data")
    steps = config.num_updates * config.batch_size
    paths = [os.path.join(run.log_dir, name) for name in s.run_names()]
    final = logger.final_return(metrics["episodic_return"])
    more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
    trained = (config.num_updates - s.first) * config.batch_size * run.num_seeds
    where = f"{s.layout.num_devices} device(s), parallel {run.parallel}" + (
        f", {jax.process_count()} processes" if jax.process_count() > 1 else "")
    if s.writer:
        if jax.process_count() > 1:
            print(f"parameters identical on all {jax.process_count()} processes", flush=True)
        print(f"done: {s.algo.upper()} on {config.env_id}, {run.num_seeds} run(s) x "
              f"{steps:,} steps | final return (last 10% of updates) mean {np.mean(final):.2f}, "
              f"min {np.min(final):.2f} | compile {s.compile_time:.1f}s, train "
              f"{s.train_time:.1f}s ({trained / max(s.train_time, 1e-9):,.0f} SPS) on {where} "
              f"| logs: {paths[0]}{more} | checkpoint: {s.path}", flush=True)
    return metrics


# --------------------------------------------------------------------------------------------
# Host-side pieces
# --------------------------------------------------------------------------------------------
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
