"""The command-line driver the algorithm files share: parse, set up, compile once, train in
chunks, log.

`main(algo, Config, make_train)` is every algorithm's `main()`. It reads the run options
(`common/host/options.py`) and the algorithm's `Config` from one flat list of flags, starts
JAX's runtime for the devices asked for (`common/host/devices.py`), and trains `num_seeds`
vmapped runs as a sequence of calls to one compiled chunk of updates (`train.run_updates`;
a shorter last chunk is a second program, `chunk_size`). What it uses of the algorithm (its
`Config`, and the pieces `train` carries) is listed, and checked, in `common/host/contract.py`.
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

import concurrent.futures
import contextlib
import dataclasses
import errno
import math
import os
import queue
import signal
import sys
import threading
import time
import warnings
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from common.evaluate import evaluate
from common.host import checkpoint, contract, logger
from common.host.devices import (Layout, differing_processes, fail, fetch, from_process_0,
                                 peers_alive, same_everywhere, setup_devices)
from common.host.flags import flag_of, parse, parse_command  # noqa: F401  (parse: for callers)
from common.host.options import RESUME_MUST_MATCH, RunOptions
from common.host.starting import SIGNALS, STARTING, Starting, in_ipython

NAN_BY_DESIGN = ("episodic_return", "episodic_length", "repeated_starts", "explained_variance",
                 "eval_return")
"""Metrics that may be NaN in a healthy run (no episode finished in an update, a constant
return); every other metric and every parameter is checked for NaN/inf after each chunk."""


def main(algo: str, config_cls, make_train, argv=None):
    """`python algos/<algo>.py [flags]`: parse, set up JAX, build `train`, train and log."""
    global EXIT_AT_ONCE
    EXIT_AT_ONCE = argv is None and not in_ipython()  # a command line, not Python's call
    if EXIT_AT_ONCE:
        STARTING.watch()  # Ctrl-C before training: leave at once, even mid-compile
    try:
        config, run, resumed = parse_command(algo, config_cls, argv)
        setup_devices(run)  # the one call: before anything starts JAX (make_train does)
        from common.host.prng import unroll_threefry_on_cpu

        unroll_threefry_on_cpu()  # the command line's choice: the same random bits, faster on CPU
        started = time.perf_counter()  # the printed compile time counts building `train`
        try:
            train = make_train(config)
        except ValueError as error:  # e.g. a network the environment cannot take
            fail(error)
        metrics = train_and_log(algo, config, run, train, resumed, started)
        if EXIT_AT_ONCE and jax.process_count() == 1:
            leave_now(0)  # every file is written: skip the 0.4 s of tearing JAX down
        return metrics
    except KeyboardInterrupt:  # Ctrl-C before training, from Python (training handles its own)
        print(f"\n{Starting.LINE}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    except BrokenPipeError:  # `... --help | head`: the reader left, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    finally:
        STARTING.stop()


# --------------------------------------------------------------------------------------------
# The run, step by step
# --------------------------------------------------------------------------------------------
class CheckpointWriter:
    """The writer thread's side of checkpointing: `write` runs there, queued by `save`, and
    alone touches `packed`; the main thread learns what it wrote only from `written`."""

    def __init__(self):
        self.packed = checkpoint.Rows()
        """The metric rows as checkpoints hold them, each chunk serialised once."""
        self.written = queue.SimpleQueue()
        """`(update, file)` of each checkpoint written, in order: the hand-over to the main
        thread (a `SimpleQueue`, safe to read from a signal handler)."""

    def write(self, path: str, keep_previous: bool, metrics: list, **record):
        """Write the checkpoint `record` to `path` (`metrics`: the chunks' rows so far, those
        not yet in `packed` serialised now), the file it replaces kept as the previous one
        with `keep_previous`."""
        for rows in metrics[len(self.packed):]:
            self.packed.append(rows)
        checkpoint.save(path, keep_previous=keep_previous, metrics=self.packed, **record)
        self.written.put((record["update"], path))


@dataclasses.dataclass
class Session:
    """What the steps of one command share, all of it the main thread's.

    The writer thread (`files`, a `logger.BackgroundWriter`) is never handed the session:
    each call queued there gets the values it needs as arguments (`save`, `log_chunk`), its
    own state is `checkpoints`' (touched there only), and what it wrote comes back to the main
    thread through the queue `checkpoints.written`."""

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
    initial: Any = None
    """A fresh run's first-state program while XLA compiles it (a `Future` of the compiled
    `train.init`; `first_state` runs it), None once run or when resumed."""
    first: int = 0
    """The update this process starts from (0, or the resumed checkpoint's)."""
    run_time: int = 0
    names: list = dataclasses.field(default_factory=list)
    """The runs' directory names under `run.log_dir`, one per seed (`claim_run_dirs`)."""
    path: str = ""
    """The checkpoint file."""
    rows: list = dataclasses.field(default_factory=list)
    """The metric rows so far, one dict of arrays [num_seeds, chunk] per chunk."""
    saved_update: int | None = None
    """The update of the last checkpoint queued for writing to `path`, or that `path` held
    when the run resumed from it (None: `path` holds no state of this run, and the next
    checkpoint replaces the file there rather than keeping it as the previous one)."""
    last_written: tuple[int, str] | None = None
    """`(update, file)` of the last checkpoint known to be on disk: the file resumed from,
    then those `checkpoints.written` reports (`last_checkpoint`)."""
    checkpoints: CheckpointWriter = dataclasses.field(default_factory=CheckpointWriter)
    """The writer thread's side of checkpointing: the main thread only queues its `write`
    and takes from its `written`."""
    recent: Any = None
    """Per run, the mean return of the latest chunk in which it finished an episode (NaN
    before its first), for the progress line."""
    files: Any = None
    """The `logger.BackgroundWriter` of the training loop (TensorBoard, checkpoints)."""

    @property
    def writer(self) -> bool:
        return jax.process_index() == 0


def train_and_log(algo: str, config, run: RunOptions, train, resumed=None,
                  started: float | None = None):
    """Train `run.num_seeds` runs of `train` (from `make_train(config)`), checkpoint, log them.

    Returns the metrics as NumPy arrays with leading axes `[num_seeds, num_updates]` (with
    `eval_return` where evaluations ran, NaN elsewhere). A bad checkpoint or config, a
    non-finite loss or a signal ends the process (`SystemExit`) with a one-line message.
    The runs are spread over devices (and processes) as `Layout` describes; every process
    returns the same metrics, and only process 0 writes checkpoints and logs.

    JAX already runs (building `train` started it), on the devices `setup_devices(run)`
    chose where it ran first (`main` does, before `make_train`). `resumed`: with
    `run.resume`, `(path, record)` of the checkpoint as `parse_command` read it (None: it is
    read here). `started`: the `time.perf_counter()` at which building `train` began, where
    the compile time printed at the end counts from (None: this call's start).
    """
    logger.enable_compilation_cache()  # first: every program below can come from the cache
    contract.check(algo, config, contract.Config, "its Config")
    contract.check(algo, train, contract.Train, "the train its make_train returns")
    if config.num_updates >= 2**31:
        fail(f"--total-timesteps {config.total_timesteps} makes {config.num_updates:,} "
             "updates, more than the 2**31 - 1 a run can count; use fewer steps or a larger "
             "batch.")
    start = time.perf_counter() if started is None else started
    session = start_or_resume(algo, config, run, train, resumed)
    if session.first == config.num_updates:
        print(f"nothing to do: {session.path} is at update {session.first} of "
              f"{config.num_updates}, the end of the run")
        return checkpoint.concat_rows(session.rows)
    run_chunk, run_eval, chunk = compile_programs(session)
    first_state(session)
    compile_time = time.perf_counter() - start
    train_time = train_in_chunks(session, run_chunk, run_eval, chunk)
    return summarise(session, compile_time, train_time)


def start_or_resume(algo: str, config, run: RunOptions, train, resumed=None) -> Session:
    """Lay the runs out on the devices and give them their first state: fresh from
    `train.init`, or with `--resume` the checkpoint's (`resumed`: its `(path, record)`, or
    None to read it here). Before anything compiles: the processes agree on the run, the
    state fits in memory, and the run's directories and checkpoint path are claimed and
    writable."""
    agree_across_processes(config, run)
    hparams_of = jax.vmap(lambda _: config.hparams())  # one copy per run
    key_shapes = jax.ShapeDtypeStruct((run.num_seeds, 2), np.uint32)  # nothing made yet
    template = jax.eval_shape(lambda k: jax.vmap(train.init)(k, hparams_of(k)), key_shapes)
    contract.check(algo, template, contract.TrainState, "the state its train.init returns")
    layout = Layout(run, config.num_envs, template)
    check_fits_in_memory(config, template, layout)
    keys = logger.seed_keys(run.seed, run.num_seeds)
    hparams = hparams_of(keys)
    session = Session(algo, config, run, train, layout, template,
                      layout.put(keys, layout.seeds), layout.put(hparams, layout.seeds))
    if run.resume:
        given, record = resumed or (checkpoint.resolve(run.resume), None)
        try:
            if record is None:
                record = checkpoint.load(given)
            state = resume(given, record, algo, config, run, template)
            session.path = checkpoint.home(given)
            if session.writer:
                checkpoint.check_writable(session.path)
        except checkpoint.CheckpointError as error:
            fail(error)
        now = checkpoint.library_versions()
        changed = [f"{k} {v} -> {now.get(k)}" for k, v in record["versions"].items()
                   if now.get(k) != v]
        if changed and session.writer:
            print(f"note: {session.path} was written with other versions ({', '.join(changed)});"
                  " the run continues, but need not match an uninterrupted run bitwise.",
                  file=sys.stderr, flush=True)
        session.state = layout.put(state, layout.state)
        session.first, session.run_time = record["update"], record["run_time"]
        session.names = list(record["run_names"])
        if session.writer:  # its TensorBoard runs go on there: one line now if they cannot
            reopen_run_dirs(run, session.names)
        session.rows = [record["metrics"]] if session.first > 0 else []
        # Resumed from the previous file, `path` does not hold this state: a stop before the
        # next checkpoint writes it there, and until then messages name the file resumed.
        session.saved_update = session.first if session.path == given else None
        session.last_written = session.first, given
        return session
    session.run_time = int(from_process_0(int(time.time())))  # process 0's clock names the run
    session.names = claim_run_dirs(config, run, session.run_time, session.writer)
    session.path = os.path.join(run.log_dir, session.names[0], checkpoint.LATEST)
    if session.writer:
        try:
            checkpoint.check_writable(session.path)
        except checkpoint.CheckpointError as error:
            fail(error)
    try:
        init = layout.spread(jax.vmap(train.init), (layout.seeds, layout.seeds), layout.state)
        lowered = init.lower(session.keys, session.hparams)
    except ValueError as error:  # sizes that do not split across the devices
        fail(error)
    # XLA compiles it on a thread of its own (and lets go of Python's lock) while the main
    # thread traces the training programs, which need only the state's shapes (`template`).
    compiling = concurrent.futures.ThreadPoolExecutor(1)
    session.initial = compiling.submit(lowered.compile)
    compiling.shutdown(wait=False)  # its thread ends with this one task
    return session


def first_state(s: Session):
    """A fresh run's first state, from its program once compiled (`start_or_resume`)."""
    if s.initial is not None:
        init, s.initial = s.initial.result(), None
        with out_of_memory_is_one_line(s.config):
            s.state = jax.block_until_ready(init(s.keys, s.hparams))


def claim_run_dirs(config, run: RunOptions, run_time: int, writer: bool) -> list[str]:
    """Create the runs' directories, `{log_dir}/{env_id}__{exp_name}__{seed}__{unix_time}`,
    and return their names. A run never shares a directory: when one exists (another run
    started in the same second, even from another process), the names get the next free
    suffix, `...__{unix_time}-2`, `-3`, ... Only process 0 creates them; every process
    returns the same names. A directory that cannot be made exits with one line."""
    def names(n):
        suffix = "" if n == 1 else f"-{n}"
        return [logger.run_name(config.env_id, run.exp_name, run.seed + i, run_time) + suffix
                for i in range(run.num_seeds)]

    n = 1
    if writer:
        where = os.path.join(run.log_dir, names(1)[0])
        if os.path.exists(run.log_dir) and not os.path.isdir(run.log_dir):
            fail(f"--log-dir {run.log_dir!r} is a file, not a directory; choose another.")
        try:
            os.makedirs(run.log_dir, exist_ok=True)
            for n in range(1, 10_000):
                paths = [os.path.join(run.log_dir, name) for name in names(n)]
                try:
                    os.mkdir(paths[0])  # atomic: the first run's directory is the claim
                except FileExistsError:
                    continue
                where = paths[0]
                made = [paths[0]]
                try:
                    for path in paths[1:]:
                        os.mkdir(path)
                        made.append(path)
                    break
                except FileExistsError:  # a run with overlapping seeds: give all back
                    for path in reversed(made):
                        os.rmdir(path)
            else:
                fail(f"no free run directory like {where!r} after 10,000 tries.")
        except OSError as error:
            hint = " (shorten --exp-name)" if error.errno == errno.ENAMETOOLONG else ""
            fail(f"cannot create the run directory {where!r}: {error.strerror or error}{hint}; "
                 "choose a writable --log-dir.")
    return names(int(from_process_0(n)))


def reopen_run_dirs(run: RunOptions, names: list[str]):
    """A resumed run's directories under `run.log_dir`, made again where missing; exits with
    one line, before anything compiles, where one cannot be made or written."""
    for name in names:
        where = os.path.join(run.log_dir, name)
        try:
            os.makedirs(where, exist_ok=True)
            if not os.access(where, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), where)
        except OSError as error:
            fail(f"cannot write the run directory {where!r}: {error.strerror or error}; "
                 f"choose a writable --log-dir.")


def check_fits_in_memory(config, template, layout: Layout):
    """Refuse, with one line, a training state larger than the memory there is (the chunk
    program holds it twice: its input and its output)."""
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(template))
    per_device = 2 * state_bytes / max(1, layout.num_devices if layout.seeds != P() else 1)
    local = [d for d in layout.mesh.devices.flat if d.process_index == jax.process_index()]
    available = available_memory(local[0], len(local))
    if available is not None and per_device > available:
        runs = jax.tree.leaves(template)[0].shape[0]
        fail(f"does not fit in memory: the training state of {runs} run(s) is "
             f"{state_bytes / 2**30:.1f} GiB, and the program holds it twice (its input and "
             f"its output: {per_device / 2**30:.1f} GiB on each device), where "
             f"{available / 2**30:.1f} GiB is available; reduce {shrinkable(config)}.")


def available_memory(device, num_devices: int) -> float | None:
    """Bytes one device can still allocate: an accelerator's own limit, or on CPU this
    machine's available memory shared by the CPU devices (None when unknown)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024 / max(1, num_devices)
    except (OSError, KeyError, ValueError):
        return None


def shrinkable(config) -> str:
    """The flags that set the size of a run's state and batch, for `config`'s algorithm."""
    names = [n for n in ("num_envs", "num_steps", "hidden_size", "actor_lag")
             if hasattr(config, n)]
    return ", ".join(flag_of(n) for n in ("num_seeds", *names))


@contextlib.contextmanager
def out_of_memory_is_one_line(config):
    """Turn XLA's out-of-memory error (while allocating the state or running a chunk) into
    one line and exit status 1."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        text = str(error)
        if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
            raise
        first = text.strip().splitlines()[0][:200]
        fail(f"does not fit in memory ({first}); reduce {shrinkable(config)}.", code=1)


def agree_across_processes(config, run: RunOptions):
    """With several processes: stop every one of them, with one line, unless all were given
    the same config and run options (all but `--process-id`)."""
    mine = {**dataclasses.asdict(config),
            **{k: v for k, v in dataclasses.asdict(run).items() if k != "process_id"}}
    differ = differing_processes(repr(sorted(mine.items())).encode())
    if differ:
        fail(f"process(es) {', '.join(map(str, differ))} of this {jax.process_count()}-process "
             "run were started with other flags than process 0; start every process with the "
             "same flags (only --process-id differs).")


def resume(path: str, record: dict, algo: str, config, run: RunOptions, template):
    """The train state to continue `config`'s run of `algo` from the checkpoint `record`
    (read from `path`), taken out of the record (no host copy of it stays for the run);
    `CheckpointError` names what does not match."""
    checkpoint.check_algo(record, algo, path)
    now = {k: getattr(run, k) for k in RESUME_MUST_MATCH}
    differences = checkpoint.config_differences(record["config"], dataclasses.asdict(config)) \
        + checkpoint.config_differences({k: record["run"].get(k) for k in now}, now)
    if differences:
        raise checkpoint.CheckpointError(f"cannot resume {path!r} with a different config "
                                         f"(saved -> now): {'; '.join(differences)}. Resume "
                                         f"with the saved values (leave those flags out), or "
                                         f"start a new run without --resume.")
    return checkpoint.restore(template, record.pop("train_state"), path)


def compile_programs(s: Session):
    """`(run_chunk, run_eval, chunk)`: `run_chunk(state, hparams, updates)` runs the updates
    numbered `updates` for every run and returns `(state, metrics, finite)` (`finite[i]`: run
    i's parameters hold no NaN/inf, checked on the device so the host fetches one flag per
    run, not the parameters), compiled for chunks of `chunk` updates and, where `chunk` does
    not divide the updates left, for the shorter last one; and the compiled evaluation (None
    without `--eval-every`)."""
    run, layout = s.run, s.layout
    chunk = chunk_size(s.config.num_updates, run.checkpoint_every, run.eval_every, s.first,
                       steps_per_update=s.config.batch_size * run.num_seeds)
    state_shapes = layout.shapes(s.template, layout.state)

    def run_updates(state, hparams, updates):  # the name the compilation cache files carry
        state, metrics = s.train.run_updates(state, hparams, updates)
        finite = [jnp.isfinite(p).all() for p in jax.tree.leaves(state.params)]
        return state, metrics, jnp.stack(finite).all()

    def compile_chunk(length: int):
        return layout.compile(jax.vmap(run_updates, in_axes=(0, 0, None)),
                              (layout.state, layout.seeds, P()),
                              (layout.state, layout.seeds, layout.seeds),
                              state_shapes, layout.shapes(s.hparams, layout.seeds),
                              layout.shapes(jnp.arange(length), P()))

    left = s.config.num_updates - s.first  # a resumed run may have less than a chunk left
    programs = {n: compile_chunk(n) for n in sorted({min(chunk, left), left % chunk}) if n}

    def run_chunk(state, hparams, updates):
        return programs[updates.shape[0]](state, hparams, updates)

    run_eval = None
    if run.eval_every:
        env, env_params, spec = s.train.env
        run_eval = layout.spread(jax.vmap(lambda state, k: evaluate(
            partial(s.train.act, state), env, env_params, spec, k, run.eval_episodes,
            hidden=s.train.initial_hidden(run.eval_episodes))[0].mean()),
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

    A signal is acted on at once, not at the end of a chunk: while the devices compute, the
    host waits on an event rather than inside XLA (`wait_for`), so when Ctrl-C arrives it
    saves the last state
    that passed the NaN guard and leaves without waiting for the queued chunks (one
    process; with several, every process stops together at the end of the chunk, which
    process 0 decides). A second signal stops at once, leaving the last checkpoint on disk.
    A checkpoint that cannot be written (a full disk) stops the run with one line; the
    checkpoint before it is intact. Returns the seconds the loop took.
    """
    config, run, num_updates = s.config, s.run, s.config.num_updates
    progress = logger.Progress(f"{s.algo} {config.env_id}", num_updates * config.batch_size,
                               stream=None if s.writer else open(os.devnull, "w"))
    boards = open_boards(s)
    start = time.perf_counter()
    progress.report(s.first * config.batch_size, [])
    alone = jax.process_count() == 1

    def dispatch(state, begin):  # the last chunk may be shorter
        updates = np.arange(begin, min(begin + chunk, num_updates), dtype=np.int32)
        return run_chunk(state, s.hparams, s.layout.put(updates, P()))

    try:
        with Interrupt(partial(stop_at_once, s)) as interrupt, peers_alive(), \
                out_of_memory_is_one_line(config), logger.BackgroundWriter() as s.files:
            pending = dispatch(s.state, s.first)
            for begin in range(s.first, num_updates, chunk):
                end = min(begin + chunk, num_updates)
                state, metrics, finite = pending
                if end < num_updates:  # the devices start on the next chunk, the host works
                    pending = dispatch(state, end)
                if not wait_for((state, metrics, finite), interrupt, interruptible=alone):
                    stop(s, begin, interrupt.signal)  # s.state: the checked state at begin
                s.state = state
                log_chunk(s, fetch(metrics), fetch(finite), begin, end, run_eval, progress,
                          boards)
                signum = from_process_0(interrupt.signal or 0)  # all processes stop together
                if end == num_updates or signum or (
                        run.checkpoint_every and end % run.checkpoint_every == 0):
                    save(s, end)
                if signum and end < num_updates:
                    stop(s, end, signum)
    except OSError as error:  # a checkpoint (or TensorBoard file) that could not be written
        name = error.filename or "a file"
        if os.path.basename(str(name)).startswith(".tmp-"):  # a checkpoint's temporary file
            name = s.path
        fail(f"could not write {name} ({error.strerror or error}); "
             f"training stopped. Last complete checkpoint: {last_checkpoint(s)}.", code=1)
    except Leave as leave:
        code = leave.code
    else:
        code = None
    finally:  # a NaN stop and a signal too: tensorboardX writes out its own queue on close
        for board in boards:
            board.close()
    if code is not None:
        leave_now(code)
    return time.perf_counter() - start


EXIT_AT_ONCE = False
"""Set by `main` for a command-line process: a stopped run leaves with `os._exit` once its
files are written, instead of letting Python wait for the chunks still queued on the devices
(an in-process caller gets `SystemExit` and waits)."""


class Leave(Exception):
    """The training loop stops early with exit status `code` (its files are written)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def leave_now(code: int):
    """Exit with `code`: at once from the command line (`EXIT_AT_ONCE`), else `SystemExit`."""
    if EXIT_AT_ONCE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def wait_for(tree, interrupt, interruptible: bool) -> bool:
    """Wait until every array of `tree` is computed; False, at once, when a signal arrived
    first and `interruptible`.

    A helper thread blocks on the arrays and sets an event; the main thread waits on the
    event, which (unlike a wait inside XLA) lets a signal's handler run at once, and wakes
    the moment the arrays are ready."""
    done = threading.Event()

    def block():
        try:
            jax.block_until_ready(tree)
        except Exception:  # noqa: BLE001  (the main thread's fetch raises it again)
            pass
        done.set()

    threading.Thread(target=block, name="wait-for-chunk", daemon=True).start()
    while not done.wait(timeout=0.05):  # a signal's handler runs inside the wait
        if interruptible and interrupt.signal:
            return False
    return True


def stop(s: Session, update: int, signum: int):
    """After a signal: the state after `update` is saved (unless it already was), every file
    written, and the loop left with exit status 128 + signal."""
    if s.saved_update != update:
        save(s, update)
    s.files.flush()
    if s.writer:
        where = "" if jax.process_count() == 1 else \
            " (on one process; on several, add each one's process flags)"
        print(f"interrupted at update {update} of {s.config.num_updates}; checkpoint: "
              f"{s.path}\ncontinue with: python algos/{s.algo}.py --resume {s.path}{where}",
              flush=True)
    raise Leave(128 + int(signum))


def stop_at_once(s: Session, signum: int):
    """A second signal: leave now. The checkpoint being written, if any, is abandoned (its
    temporary file removed); the last one written stays as it was."""
    for tmp in list(checkpoint.writing):
        with contextlib.suppress(OSError):
            os.remove(tmp)
    print(f"{signal.Signals(signum).name} again: stopped at once. Last complete checkpoint: "
          f"{last_checkpoint(s)}.", file=sys.stderr, flush=True)
    leave_now(128 + int(signum))


def last_checkpoint(s: Session) -> str:
    """`path (update N)` of the last checkpoint on disk, for messages (on the main thread,
    from a signal's handler too: it takes what the writer thread reported)."""
    with contextlib.suppress(queue.Empty):
        while True:
            s.last_written = s.checkpoints.written.get_nowait()
    if s.last_written is None:
        return "none was written"
    update, path = s.last_written
    return f"{path} (update {update})"


def recent_returns(rows: list, recent=None) -> np.ndarray:
    """Per run, the mean episodic return of the latest chunk of `rows` (newest last) in
    which it finished an episode, else its value in `recent` (else NaN): a chunk that
    finishes no episode (long episodes, short chunks) keeps the last figure."""
    newest = np.full(len(rows[-1]["episodic_return"]), np.nan)
    for chunk in reversed(rows):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a chunk may finish no episode
            newest = np.where(np.isnan(newest), np.nanmean(chunk["episodic_return"], axis=1),
                              newest)
        if not np.isnan(newest).any():
            break
    return newest if recent is None else np.where(np.isnan(newest), recent, newest)


def log_chunk(s: Session, metrics: dict, finite, begin: int, end: int, run_eval, progress,
              boards):
    """On the host, for the chunk of updates [begin, end): the NaN guard (`finite`: per run,
    whether its parameters are), the evaluation if one is due, the progress line, and the
    TensorBoard writes (queued)."""
    run = s.run
    steps = (np.arange(begin, end, dtype=np.int64) + 1) * s.config.batch_size
    metrics["global_step"] = np.broadcast_to(steps, (run.num_seeds, end - begin)).copy()
    stop_if_not_finite(s, metrics, finite, begin)
    if run_eval is not None:  # NaN but after an evaluation: every chunk has the same columns
        metrics["eval_return"] = np.full((run.num_seeds, end - begin), np.nan, np.float32)
    if run_eval is not None and (end % run.eval_every == 0 or end == s.config.num_updates):
        metrics["eval_return"][:, -1] = fetch(run_eval(s.state, s.layout.put(
            eval_keys(run, end), s.layout.seeds)))
    s.rows.append(metrics)
    s.recent = recent_returns(s.rows if s.recent is None else [metrics], s.recent)
    progress.report(end * s.config.batch_size, s.recent, final=end == s.config.num_updates)
    sps = logger.sps_points(progress.timeline[-2:], run.num_seeds)
    if boards:
        s.files.put(write_boards, boards, metrics, sps)


def write_boards(boards: list, metrics: dict, sps_points):
    """On the writer thread: each run's rows of `metrics` [num_seeds, updates] to its board
    (one queued call for all of them, not one hand-over to the thread per run)."""
    for i, board in enumerate(boards):
        board.write({k: v[i] for k, v in metrics.items()}, sps_points)


def open_boards(s: Session) -> list:
    """Process 0's TensorBoard runs, one per seed; a resumed run first rewrites its saved
    updates over whatever the interrupted process wrote."""
    if not s.writer:
        return []
    hparams = {**dataclasses.asdict(s.run), **dataclasses.asdict(s.config)}
    every = logger.log_every(s.config.num_updates, s.run.log_every)
    boards = [logger.TensorBoardRun(s.run.log_dir, name, hparams, purge=s.first > 0,
                                    every=every) for name in s.names]
    if s.rows:
        for i, board in enumerate(boards):
            board.write({k: v[i] for k, v in s.rows[0].items()})
    return boards


def eval_keys(run: RunOptions, update: int):
    """The evaluation keys after `update`: independent of training's, the same on resume."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(
        logger.seed_keys(run.seed, run.num_seeds), update)


def stop_if_not_finite(s: Session, metrics: dict, finite, begin: int):
    """Exit 1, naming the quantity, update and seed, if the chunk from `begin` went NaN/inf
    (the parameters are fetched only when a run's `finite` flag says one is bad)."""
    params = None if np.all(finite) else fetch(s.state.params)
    bad = first_non_finite(metrics, params, begin)
    if bad is not None:
        s.files.flush()  # the last good checkpoint is on disk before it is named
        quantity, update, seed = bad
        last = last_checkpoint(s)
        fail(f"non-finite {quantity} in update {update + 1} (global step "
             f"{(update + 1) * s.config.batch_size:,}, seed {s.run.seed + seed}); training "
             f"stopped. Last good checkpoint: {last}.", code=1)


def save(s: Session, update: int):
    """Checkpoint the runs after `update` (every process gathers, process 0 writes).

    One process: the state is copied to the host on the background thread, with the rest of
    the work (the arrays never change once computed). Several: every process gathers it
    here, in the same order (a collective)."""
    state = s.state if jax.process_count() == 1 else fetch(s.state)
    if s.writer:  # fetched, serialised and written on the background thread, in order
        s.files.put(s.checkpoints.write, s.path, keep_previous=s.saved_update is not None,
                    metrics=list(s.rows), algo=s.algo, config=dataclasses.asdict(s.config),
                    run=dataclasses.asdict(s.run), run_names=list(s.names), update=update,
                    run_time=s.run_time, train_state=state)
    s.saved_update = update


def summarise(s: Session, compile_time: float, train_time: float) -> dict:
    """Check the processes agree, print the one-line summary, return the metrics."""
    config, run = s.config, s.run
    metrics = checkpoint.concat_rows(s.rows)
    if jax.process_count() > 1:
        same_everywhere(s.state.params, replicated=run.parallel == "data")
    steps = config.num_updates * config.batch_size
    paths = [os.path.join(run.log_dir, name) for name in s.names]
    final = logger.final_return(metrics["episodic_return"])
    more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
    trained = (config.num_updates - s.first) * config.batch_size * run.num_seeds
    where = f"{s.layout.num_devices} device(s), parallel {run.parallel}" + (
        f", {jax.process_count()} processes" if jax.process_count() > 1 else "")
    if s.writer:
        if jax.process_count() > 1:
            print(f"parameters identical on all {jax.process_count()} processes", flush=True)
        print(f"done: {s.algo.upper()} on {config.env_id}, {run.num_seeds} run(s) x "
              f"{steps:,} steps | final return (last 10% of updates) {final_return_text(final)} "
              f"| compile {compile_time:.1f}s, train {train_time:.1f}s "
              f"({trained / max(train_time, 1e-9):,.0f} SPS) on {where} "
              f"| logs: {paths[0]}{more} | checkpoint: {s.path}", flush=True)
    return metrics


def final_return_text(final) -> str:
    """`mean M, min m` of the runs' final returns, over the runs where an episode ended in the
    last 10% of updates (a NaN return: none did), and how many had none."""
    ended = final[np.isfinite(final)]
    if not ended.size:
        return "n/a: no episode ended"
    missing = f" ({final.size - ended.size} of {final.size} runs: no episode ended)" \
        if ended.size < final.size else ""
    return f"mean {ended.mean():.2f}, min {ended.min():.2f}{missing}"


# --------------------------------------------------------------------------------------------
# Host-side pieces
# --------------------------------------------------------------------------------------------
MIN_CHUNK_STEPS = 2**18
"""A chunk's fewest environment steps, summed over the runs, before `chunk_size` takes fewer
than 20 chunks (down to 8): the host's fixed work per chunk (a checkpoint, TensorBoard, the
NaN guard, about 10 ms of CPU for 8 A2C runs) costs a short run of a fast program several
percent at 20 chunks (docs/performance.md)."""


def chunk_size(num_updates: int, *boundaries: int, steps_per_update: int = 0) -> int:
    """The chunk length L: about 20 chunks, or as few as 8 where chunks would hold fewer than
    `MIN_CHUNK_STEPS` environment steps (`steps_per_update`: every run's steps in one update;
    0: 20 chunks). L divides every number in `boundaries` between 0 and `num_updates` (the
    checkpoint and evaluation cadences, and the update a run resumes from; a cadence as long as
    the run falls only on its end), so that each falls exactly on the end of a chunk; the
    chunks run from the resume point in steps of L, and the last one is shorter where L does
    not divide `num_updates` (`num_updates % L` updates, a second compiled program).

    One program where it can: of the L that divide `num_updates` as well and give between a
    quarter of and four times the target count, the one whose count is closest to it (by
    ratio; a tie takes more chunks). 781 updates = 11 x 71 run as 11 chunks, not 71, which,
    where every chunk is a barrier between the devices (one program over several, as
    data-parallel runs have), cost 8 IMPALA seeds on 2 devices 9% of their speed. Otherwise
    (a prime number of updates, or a cadence sharing no factor with it) the L closest to the
    target count, with a shorter last chunk, never thousands of chunks of a few updates.
    """
    target = 20
    if steps_per_update:
        target = min(20, max(8, num_updates * steps_per_update / MIN_CHUNK_STEPS))
    cadence = 0  # gcd(0, b) = b: the cadences' common divisor (0: none)
    for b in boundaries:
        if 0 < b < num_updates:  # a cadence as long as the run falls only on its end
            cadence = math.gcd(cadence, b)
    closeness = lambda d: (abs(math.log(num_updates / d / target)), d)  # noqa: E731
    even = divisors(math.gcd(num_updates, cadence))
    near = [d for d in even if target / 4 <= num_updates / d <= 4 * target]
    if near:
        return min(near, key=closeness)
    if not cadence:
        return max(1, round(num_updates / target))
    return min((d for d in divisors(cadence) if d <= num_updates), key=closeness)


def divisors(n: int) -> set:
    """The divisors of `n` >= 1, in O(sqrt(n)) steps."""
    return {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}


def first_non_finite(metrics: dict, params, first_update: int):
    """`(quantity, update, seed index)` of the earliest NaN/inf in a chunk, or None.

    `metrics` are the chunk's rows [num_seeds, chunk] (names in `NAN_BY_DESIGN` skipped),
    `params` the vmapped parameters after the chunk (a bad one is dated to its last update;
    None: known to be finite).
    """
    found = []
    for name, rows in metrics.items():
        bad = ~np.isfinite(np.asarray(rows))
        if name not in NAN_BY_DESIGN and bad.any():
            seed, step = min(np.argwhere(bad), key=lambda sc: sc[1])
            found.append((first_update + int(step), name, int(seed)))
    last = first_update + next(iter(metrics.values())).shape[1] - 1
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:  # None: no leaves
        bad = ~np.isfinite(np.asarray(leaf)).reshape(leaf.shape[0], -1).all(axis=1)
        if bad.any():
            found.append((last, f"parameter {jax.tree_util.keystr(path)}", int(np.argmax(bad))))
    if not found:
        return None
    update, name, seed = min(found, key=lambda f: f[0])
    return name, update, seed


class Interrupt:
    """Catches Ctrl-C (SIGINT) and SIGTERM while training: `signal` is set and the loop saves
    and exits (`train_in_chunks`). A second signal calls `second(signum)`; leaving the block
    puts the previous handlers back."""

    SIGNALS = SIGNALS

    def __init__(self, second):
        self.signal, self.previous, self.second = None, {}, second

    def __enter__(self):
        STARTING.stop()  # from here, signals come to the handlers below
        if threading.current_thread() is threading.main_thread():  # signal() works only there
            for s in self.SIGNALS:
                previous = signal.signal(s, self._handle)
                self.previous[s] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            self.second(signum)
            return
        self.signal = signum
        print(f"\n{signal.Signals(signum).name}: saving the last complete update and stopping "
              "(send it again to stop at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}
