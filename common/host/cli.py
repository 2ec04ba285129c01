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

The driver by concern: this file is the run, step by step (`main`, `train_and_log`:
`start_or_resume`, `compile_programs`, `train_in_chunks`) and the chunks' length
(`chunk_size`); `preflight.py` checks, before anything compiles, what a run needs (the
processes agree, the state fits in memory, run directories, the checkpoint resumed);
`session.py` holds what the steps share (`Session`) and queues checkpoints (`save`);
`stopping.py` answers Ctrl-C and SIGTERM and leaves; `output.py` is the host's work on each
chunk's results (the NaN guard, evaluation, progress, TensorBoard) and the closing summary;
`pbt.py` is a population's (`--pbt-population`) pieces of these steps, in the same loop.
"""

import concurrent.futures
import math
import os
import signal
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from common.evaluate import evaluate
from common.host import checkpoint, contract, logger, pbt, stopping
from common.host.devices import Layout, fail, fetch, from_process_0, peers_alive, setup_devices
from common.host.flags import parse
from common.host.options import RunOptions
from common.host.output import log_chunk, open_boards, summarise
from common.host.preflight import (agree_across_processes, check_fits_in_memory, claim_run_dirs,
                                   out_of_memory_is_one_line, resume_into)
from common.host.session import Session, last_checkpoint, save
from common.host.starting import STARTING, Starting, in_ipython
from common.host.stopping import Interrupt, Leave, leave_now, stop, stop_at_once, wait_for


def main(algo: str, config_cls, make_train, argv=None):
    """`python algos/<algo>.py [flags]`: parse, set up JAX, build `train`, train and log."""
    stopping.EXIT_AT_ONCE = argv is None and not in_ipython()  # a command line, not a Python call
    if stopping.EXIT_AT_ONCE:
        STARTING.watch()  # Ctrl-C before training: leave at once, even mid-compile
    try:
        config, run, resumed = parse(algo, config_cls, argv)
        setup_devices(run)  # the one call: before anything starts JAX (make_train does)
        from common.host.prng import unroll_threefry_on_cpu

        unroll_threefry_on_cpu()  # the command line's choice: the same random bits, faster on CPU
        started = time.perf_counter()  # the printed compile time counts building `train`
        try:
            train = make_train(config)
        except ValueError as error:  # e.g. a network the environment cannot take
            fail(error)
        metrics = train_and_log(algo, config, run, train, resumed, started)
        if stopping.EXIT_AT_ONCE and jax.process_count() == 1:
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
    `run.resume`, `(path, record)` of the checkpoint as `flags.parse` read it (None: it is
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
    population = run.pbt_population > 0  # members in the place of seeds: common/host/pbt.py
    session = (pbt.start_or_resume if population else start_or_resume)(algo, config, run,
                                                                        train, resumed)
    if session.first == config.num_updates:
        print(f"nothing to do: {session.path} is at update {session.first} of "
              f"{config.num_updates}, the end of the run")
        return checkpoint.concat_rows(session.rows)
    if population:
        run_chunk, run_eval, chunk = pbt.compile_programs(session, chunk_of(session))
    else:
        run_chunk, run_eval, chunk = compile_programs(session)
    first_state(session)
    compile_time = time.perf_counter() - start
    if session.writer:  # before training: a run stopped early still says what compiling took
        print(f"compiled in {compile_time:.1f}s", flush=True)
    train_time = train_in_chunks(session, run_chunk, run_eval, chunk,
                                 log=pbt.log_chunk if population else log_chunk)
    return (pbt.summarise if population else summarise)(session, compile_time, train_time)


def start_or_resume(algo: str, config, run: RunOptions, train, resumed=None) -> Session:
    """Lay the runs out on the devices and give them their first state: fresh from
    `train.init`, or with `--resume` the checkpoint's (`resumed`: its `(path, record)`, or
    None to read it here). Before anything compiles: the processes agree on the run, the
    state fits in memory, and the run's directories and checkpoint path are claimed and
    writable."""
    agree_across_processes(config, run)
    hparams_of = jax.vmap(lambda _: config.hparams())  # one copy per run
    key_shapes = jax.ShapeDtypeStruct((run.num_seeds, 2), np.uint32)  # nothing made yet
    # traced once: the template here, and below (on one device) init's program, which calls
    # this jitted function with the same shapes (an MJX reset takes seconds to trace)
    init_runs = jax.jit(jax.vmap(train.init))
    template = jax.eval_shape(init_runs, key_shapes, jax.eval_shape(hparams_of, key_shapes))
    contract.check(algo, template, contract.TrainState, "the state its train.init returns")
    layout = Layout(run, config.num_envs, template)
    check_fits_in_memory(config, template, layout)
    keys = logger.seed_keys(run.seed, run.num_seeds)
    hparams = hparams_of(keys)
    session = Session(algo, config, run, train, layout, template,
                      layout.put(keys, layout.seeds), layout.put(hparams, layout.seeds))
    if run.resume:
        resume_into(session, resumed)
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
        if layout.num_devices == 1:  # the template's trace serves: no shard_map, and the
            # arguments as they were traced there (placed on a mesh, they would trace again)
            init = jax.jit(init_runs, out_shardings=layout.shardings(layout.state))
            args = (keys, hparams)
        else:
            init = layout.spread(init_runs, (layout.seeds, layout.seeds), layout.state)
            args = (session.keys, session.hparams)
        lowered = init.lower(*args)
    except ValueError as error:  # sizes that do not split across the devices
        fail(error)
    # XLA compiles it on a thread of its own (and lets go of Python's lock) while the main
    # thread traces the training programs, which need only the state's shapes (`template`).
    compiling = concurrent.futures.ThreadPoolExecutor(1)
    session.initial = compiling.submit(lambda: partial(lowered.compile(), *args))
    compiling.shutdown(wait=False)  # its thread ends with this one task
    return session


def first_state(s: Session):
    """A fresh run's first state, from its program once compiled (`start_or_resume`)."""
    if s.initial is not None:
        init, s.initial = s.initial.result(), None
        with out_of_memory_is_one_line(s.config):
            s.state = jax.block_until_ready(init())


def compile_programs(s: Session):
    """`(run_chunk, run_eval, chunk)`: `run_chunk(state, hparams, updates)` runs the updates
    numbered `updates` for every run and returns `(state, metrics, finite)` (`finite[i]`: run
    i's parameters hold no NaN/inf, checked on the device so the host fetches one flag per
    run, not the parameters), compiled for chunks of `chunk` updates and, where `chunk` does
    not divide the updates left, for the shorter last one; and the compiled evaluation (None
    without `--eval-every`)."""
    run, layout = s.run, s.layout
    chunk = chunk_of(s)
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


def train_in_chunks(s: Session, run_chunk, run_eval, chunk: int, log=log_chunk):
    """The loop: a chunk on the devices, then on the host the NaN guard, evaluation,
    progress, TensorBoard and checkpoints; Ctrl-C or SIGTERM saves and exits.

    `run_chunk(state, hparams, updates)` returns the state after the chunk, then what `log`
    takes, fetched to the host, before `(begin, end, run_eval, progress, boards)`:
    `output.log_chunk`'s `(metrics, finite)`, or PBT's (`common/host/pbt.py`).

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
                state, *results = pending
                if end < num_updates:  # the devices start on the next chunk, the host works
                    pending = dispatch(state, end)
                if not wait_for((state, *results), interrupt, interruptible=alone):
                    stop(s, begin, interrupt.signal)  # s.state: the checked state at begin
                s.state = state
                log(s, *fetch(results), begin, end, run_eval, progress, boards)
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


def chunk_of(s: Session) -> int:
    """The chunk length of the session's run: `chunk_size` of its updates, its checkpoint and
    evaluation cadences and the update it starts from; for a population (`--pbt-population`),
    of its intervals instead, so that every chunk is whole intervals (the cadences and the
    resumed update are whole intervals: `flags.check_population`)."""
    run, unit = s.run, s.run.pbt_interval if s.run.pbt_population else 1
    runs = run.pbt_population or run.num_seeds
    return unit * chunk_size(s.config.num_updates // unit, run.checkpoint_every // unit,
                             run.eval_every // unit, s.first // unit,
                             steps_per_update=s.config.batch_size * runs * unit)


def divisors(n: int) -> set:
    """The divisors of `n` >= 1, in O(sqrt(n)) steps."""
    return {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}
