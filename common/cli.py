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

Scaling out (`--num-devices`, `--parallel`, `--coordinator-address`): the same compiled chunk
runs under `jax.shard_map` over a one-axis mesh of devices (`Layout`). `--parallel seeds`
splits the `num_seeds` runs across the devices, no communication; `--parallel data` trains every
run on all devices, its environments split across them (`common/distributed.py`). On a CPU-only
machine `setup_devices` makes one XLA CPU device per core before the backend starts, so
`--num-seeds 32` uses every core. With `--coordinator-address` every process runs this same
driver on its own devices (`jax.distributed`); only process 0 writes logs and checkpoints.
"""

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
import warnings
import zlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from common import checkpoint, logger
from common.distributed import DATA_AXIS, SEEDS_AXIS
from common.envs import make_env
from common.evaluate import evaluate

RUN_OPTIONS = ("exp_name", "log_dir", "live_progress", "checkpoint_every", "resume",
               "eval_every", "eval_episodes", "num_devices", "parallel", "coordinator_address",
               "num_processes", "process_id", "distributed_timeout")
"""Config fields that change how a run is driven, not what it computes: a resumed run may
change them. Every other field must equal the checkpoint's. (A run resumed on another device
layout continues correctly but not bitwise: data-parallel devices draw their own keys.)"""

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
        setup_devices(parsed)  # before the config's checks import gymnax (and start JAX)
        return config_cls(**{f.name: getattr(parsed, f.name)
                             for f in dataclasses.fields(config_cls)})
    except ValueError as error:  # checkpoint.CheckpointError included
        fail(error)


def setup_devices(config):
    """Start JAX's runtime for `config`'s device options; call it before any JAX computation.

    - With `coordinator_address` (or `JAX_COORDINATOR_ADDRESS`) and more than one process
      (`num_processes`, or `JAX_NUM_PROCESSES`; `process_id` or `JAX_PROCESS_ID`), call
      `jax.distributed.initialize`, with gloo for CPU collectives and a heartbeat timeout of
      `distributed_timeout` seconds: if a peer dies, the others stop with an error instead of
      waiting forever.
    - On CPU, make one XLA device per core this process may run on (`os.sched_getaffinity`,
      so `taskset -c 0` means one device), or `num_devices / num_processes` of them. An
      `--xla_force_host_platform_device_count` already in `XLA_FLAGS` wins.

    Where the backend has already started (in-process callers, tests) it does nothing: the
    devices that exist are used.
    """
    try:
        from jax._src import xla_bridge
        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # private API: assume the worst
        started = True
    if started:
        return
    address = config.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    processes = config.num_processes if config.num_processes > 1 else \
        int(os.environ.get("JAX_NUM_PROCESSES", "1"))
    process_id = config.process_id if config.num_processes > 1 else \
        int(os.environ.get("JAX_PROCESS_ID", "0"))
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        local = cores if config.num_devices == 0 else max(1, config.num_devices // processes)
        jax.config.update("jax_num_cpu_devices", local)
    if processes > 1:
        if not address:
            fail("--num-processes > 1 needs --coordinator-address HOST:PORT (process 0's).")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        timeout = config.distributed_timeout
        jax.distributed.initialize(address, processes, process_id,
                                   initialization_timeout=timeout,
                                   heartbeat_timeout_seconds=timeout,
                                   shutdown_timeout_seconds=timeout)


class Layout:
    """How the runs of one CLI command are spread over devices: a one-axis mesh and the
    `PartitionSpec` of every input and output of the compiled functions.

    `parallel="seeds"`: the mesh axis is `SEEDS_AXIS`; every array's leading (seeds) axis is
    split across devices, so `num_seeds` must divide by the device count (no padding; with
    `num_devices=0` the largest device count that divides it is used).
    `parallel="data"`: the mesh axis is `DATA_AXIS`; parameters, optimiser state, keys and
    metrics are replicated, the environments (`TrainState.env`, axis 1 after the seeds) split.
    """

    def __init__(self, config, template):
        available = jax.device_count()
        wanted = config.num_devices
        if wanted > available:
            fail(f"--num-devices {wanted}: only {available} device(s) here "
                 f"({jax.devices()[0].platform}).")
        if config.parallel == "seeds":
            if wanted == 0:
                wanted = available if jax.process_count() > 1 else \
                    max(d for d in range(1, available + 1) if config.num_seeds % d == 0)
            if config.num_seeds % wanted:
                fail(f"--num-seeds {config.num_seeds} does not divide among {wanted} devices; "
                     "pick a multiple (or --num-devices that divides it).")
            self.axis, self.seeds, self.replicated = SEEDS_AXIS, P(SEEDS_AXIS), P(SEEDS_AXIS)
            self.state = jax.tree.map(lambda _: P(SEEDS_AXIS), template)
        else:
            wanted = wanted or available
            if config.num_envs % wanted:
                fail(f"--parallel data: --num-envs {config.num_envs} does not divide among "
                     f"{wanted} devices.")
            self.axis, self.seeds, self.replicated = DATA_AXIS, P(), P()
            self.state = jax.tree.map(lambda _: P(), template)._replace(
                env=jax.tree.map(lambda _: P(None, DATA_AXIS), template.env))
        if jax.process_count() > 1 and wanted != available:
            fail(f"with {jax.process_count()} processes every device takes part: "
                 f"--num-devices must be 0 or {available}.")
        self.num_devices = wanted
        self.mesh = jax.sharding.Mesh(np.array(jax.devices()[:wanted]), (self.axis,))

    def spread(self, fn, in_specs, out_specs):
        """`jit(shard_map(fn))` over the mesh."""
        return jax.jit(jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs,
                                     out_specs=out_specs, check_vma=False))

    def put(self, tree, specs):
        """Host values (NumPy or single-device arrays) as global arrays laid out by `specs`;
        every process passes the whole value and keeps its own devices' part. `specs`: a
        tree like `tree`'s, or one `PartitionSpec` for every leaf."""
        if isinstance(specs, P):
            specs = jax.tree.map(lambda _: specs, tree)

        def one(x, spec):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, NamedSharding(self.mesh, spec),
                                                lambda index: x[index])
        return jax.tree.map(one, tree, specs)

    def shapes(self, tree, specs):
        """`jax.ShapeDtypeStruct`s of `tree` with the shardings of `specs` (for `lower`)."""
        if isinstance(specs, P):
            specs = jax.tree.map(lambda _: specs, tree)
        return jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(self.mesh, spec)), tree, specs)


def fetch(tree):
    """Global arrays to NumPy on this host (gathered across processes where needed)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return jax.tree.map(lambda x: np.asarray(x) if x.is_fully_replicated else
                            multihost_utils.process_allgather(x, tiled=True), tree)
    return jax.device_get(tree)


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
    The runs are spread over devices (and processes) as `Layout` describes; every process
    returns the same metrics, and only process 0 writes checkpoints and logs.
    """
    logger.enable_compilation_cache()  # first: every program below can come from the cache
    name = algo.lower()
    setup_devices(config)  # a no-op when parse_config did it or JAX already runs
    writer = jax.process_index() == 0
    keys = logger.seed_keys(config.seed, config.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    num_updates, batch_size = config.num_updates, config.batch_size
    steps = num_updates * batch_size

    start = time.perf_counter()
    template = jax.eval_shape(jax.vmap(train.init), keys, hparams)
    layout = Layout(config, template)
    seeds, state_specs = layout.seeds, layout.state
    keys, hparams = layout.put(keys, seeds), layout.put(hparams, seeds)
    if config.resume:
        path = checkpoint.resolve(config.resume)
        try:
            state, record = resume(path, name, config, template)
        except checkpoint.CheckpointError as error:
            fail(error)
        state = layout.put(state, state_specs)
        first, run_time = record["update"], record["run_time"]
        rows = [record["metrics"]] if first > 0 else []
        saved_update = first
    else:
        try:
            init = layout.spread(jax.vmap(train.init), (seeds, seeds), state_specs)
            state = init(keys, hparams)
        except ValueError as error:  # sizes that do not split across the devices
            fail(error)
        first, run_time, rows, saved_update = 0, int(time.time()), [], None
        # Every process names the run from process 0's clock.
        run_time = int(_from_process_0(run_time))
        path = os.path.join(config.log_dir, logger.run_name(
            config.env_id, config.exp_name, config.seed, run_time), checkpoint.LATEST)

    if first == num_updates:
        print(f"nothing to do: {path} is at update {first} of {num_updates}, the end of the run")
        return _concat(rows)

    chunk = chunk_size(num_updates, config.checkpoint_every, config.eval_every, first)
    run_chunk = layout.spread(jax.vmap(train.run_updates, in_axes=(0, 0, None)),
                              (state_specs, seeds, P()), (state_specs, seeds)).lower(
        layout.shapes(template, state_specs), layout.shapes(hparams, seeds),
        layout.shapes(jnp.arange(chunk), P())).compile()
    if config.eval_every:
        env, env_params, spec = make_env(config.env_id)
        run_eval = layout.spread(jax.vmap(lambda s, k: evaluate(
            partial(train.act, s), env, env_params, spec, k, config.eval_episodes)[0].mean()),
            (state_specs, seeds), seeds).lower(
            layout.shapes(template, state_specs), layout.shapes(keys, seeds)).compile()
    compile_time = time.perf_counter() - start

    def save(update):
        host_state = fetch(state)  # every process takes part in gathering it
        if writer:
            checkpoint.save(path, algo=name, config=dataclasses.asdict(config), update=update,
                            run_time=run_time, train_state=host_state, metrics=_concat(rows))

    progress = logger.Progress(f"{name} {config.env_id}", steps,
                               stream=None if writer else open(os.devnull, "w"))
    # TensorBoard as training goes (process 0): one run per seed, each chunk written when it
    # ends; a resumed run rewrites its saved updates over whatever the earlier process wrote.
    runs = [logger.run_name(config.env_id, config.exp_name, config.seed + i, run_time)
            for i in range(config.num_seeds)]
    boards = [logger.TensorBoardRun(config.log_dir, run, config, purge=first > 0)
              for run in runs] if writer else []
    if rows:  # resumed: the saved updates first
        for i, board in enumerate(boards):
            board.write({k: v[i] for k, v in rows[0].items()})
    start = time.perf_counter()
    progress.report(first * batch_size, [])
    with Interrupt() as interrupt, peers_alive():
        for begin in range(first, num_updates, chunk):
            end = begin + chunk
            state, metrics = run_chunk(state, hparams,
                                       layout.put(np.arange(begin, end, dtype=np.int32), P()))
            metrics = fetch(metrics)
            bad = first_non_finite(metrics, fetch(state.params), begin)
            if bad is not None:
                quantity, update, seed = bad
                last = f"{path} (update {saved_update})" if saved_update is not None else \
                    "none was written"
                fail(f"non-finite {quantity} in update {update + 1} (global step "
                     f"{(update + 1) * batch_size:,}, seed {config.seed + seed}); training "
                     f"stopped. Last good checkpoint: {last}.", code=1)
            if config.eval_every and (end % config.eval_every == 0 or end == num_updates):
                # Keys fold in the update: independent of training's, the same on resume.
                eval_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(
                    logger.seed_keys(config.seed, config.num_seeds), end)
                metrics["eval_return"] = np.full((config.num_seeds, chunk), np.nan, np.float32)
                metrics["eval_return"][:, -1] = fetch(run_eval(state,
                                                               layout.put(eval_keys, seeds)))
            rows.append(metrics)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a chunk may finish no episode
                recent = np.nanmean(metrics["episodic_return"], axis=1)
            progress.report(end * batch_size, recent, final=end == num_updates)
            sps = logger.sps_points(progress.timeline[-2:], config.num_seeds)
            for i, board in enumerate(boards):
                board.write({k: v[i] for k, v in metrics.items()}, sps)
            every = config.checkpoint_every
            stop = _from_process_0(interrupt.signal or 0)  # all processes stop together
            if end == num_updates or (every and end % every == 0) or stop:
                save(end)
                saved_update = end
            if stop and end < num_updates:
                if writer:
                    print(f"interrupted at update {end} of {num_updates}; checkpoint: {path}\n"
                          f"continue with: python algos/{name}.py --resume {path}", flush=True)
                raise SystemExit(128 + int(stop))
    train_time = time.perf_counter() - start
    metrics = _concat(rows)
    if jax.process_count() > 1:
        same_everywhere(state.params, replicated=config.parallel == "data")

    for board in boards:
        board.close()
    paths = [os.path.join(config.log_dir, run) for run in runs]
    final = logger.final_return(metrics["episodic_return"])
    more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
    trained = (num_updates - first) * batch_size * config.num_seeds
    where = f"{layout.num_devices} device(s), parallel {config.parallel}" + (
        f", {jax.process_count()} processes" if jax.process_count() > 1 else "")
    if writer:
        if jax.process_count() > 1:
            print(f"parameters identical on all {jax.process_count()} processes", flush=True)
        print(f"done: {algo} on {config.env_id}, {config.num_seeds} run(s) x {steps:,} steps | "
              f"final return (last 10% of updates) mean {np.mean(final):.2f}, min "
              f"{np.min(final):.2f} | compile {compile_time:.1f}s, train {train_time:.1f}s "
              f"({trained / max(train_time, 1e-9):,.0f} SPS) on {where} | logs: {paths[0]}{more}"
              f" | checkpoint: {path}", flush=True)
    return metrics


@contextlib.contextmanager
def peers_alive():
    """With several processes, turn a failed collective (a peer died or hung up) into one
    clear line and exit status 1, at once. (A peer that stops without closing its connections is
    caught by JAX's distributed heartbeat instead, which aborts the process with its own
    message after `--distributed-timeout` seconds.)"""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if jax.process_count() == 1:
            raise
        first_line = str(error).strip().splitlines()[0][:300]
        print(f"error: process {jax.process_index()} lost contact with another process of "
              f"this {jax.process_count()}-process run ({first_line}); stopping. The last "
              "checkpoint is intact: --resume it once every process is back.",
              file=sys.stderr, flush=True)
        # Leave at once: a normal exit would wait in jax.distributed's shutdown barrier for
        # the dead peer, then abort.
        os._exit(1)


def same_everywhere(params, replicated: bool):
    """Several processes: check that every process ends with the same parameters (a CRC of
    them compared with process 0's; data-parallel: also every local device's copy), else fail.
    """
    if replicated:  # every device holds a copy: all of this process's must agree
        copies = [[np.asarray(s.data) for s in leaf.addressable_shards]
                  for leaf in jax.tree.leaves(params)]
        if any(not np.array_equal(c, cs[0]) for cs in copies for c in cs):
            fail(f"process {jax.process_index()}: the devices' parameters differ.", code=1)
        host = [cs[0] for cs in copies]
    else:
        host = jax.tree.leaves(fetch(params))
    crc = zlib.crc32(b"".join(np.ascontiguousarray(x).tobytes() for x in host)) & 0x7FFFFFFF
    if _from_process_0(crc) != crc:
        fail(f"process {jax.process_index()} ended with parameters that differ from process "
             "0's.", code=1)


def _from_process_0(value: int) -> int:
    """Process 0's `value` on every process (itself with one process)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


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
