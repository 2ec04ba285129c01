"""Host-side plumbing for the command line: live progress, TensorBoard, seeds, run names, and
the background thread that writes files while training goes on.

Nothing in this module runs inside `jit` except `report_progress`, which sends a few scalars
out of the compiled loop with `jax.debug.callback` (it works under `vmap`: the callback runs
once per vmapped run, and `Progress` averages what arrives for the same update).
"""

import math
import os
import queue
import sys
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# CleanRL's TensorBoard tags, so curves from both libraries overlay in one dashboard.
TAGS = {
    "episodic_return": "charts/episodic_return",
    "episodic_length": "charts/episodic_length",
    "repeated_starts": "charts/repeated_starts",
    "learning_rate": "charts/learning_rate",
    "eval_return": "eval/episodic_return",
    "SPS": "charts/SPS",
}


AT_OWN_STEP = {"eval_return"}
"""Metrics made only at some updates (NaN elsewhere), written at their own steps rather than
as block means stamped at the block's last update."""


def tag(name: str) -> str:
    """TensorBoard tag of a metric: `charts/...` for the CleanRL charts, a name with its own
    prefix as it is (`pbt/learning_rate`), else `losses/...`."""
    return TAGS.get(name, name if "/" in name else f"losses/{name}")


def enable_compilation_cache():
    """Turn on JAX's persistent compilation cache, so a second identical run skips compiling."""
    path = os.environ.get("ONPOLICY_JAX_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "onpolicy-jax", "xla"))
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def seed_keys(seed: int, num_seeds: int):
    """One PRNG key per run, uint32 [num_seeds, 2]: run i uses seed `seed + i`, so it can be
    replayed alone.

    Seeds are 64-bit: seed s is the key `[s >> 32, s & 0xFFFFFFFF]`, which is what
    `jax.random.PRNGKey(s)` gives for every s below 2**32 (and, with 64-bit JAX, for every s),
    built in NumPy so that no seed overflows a 32-bit integer on the way.
    """
    seeds = [seed + i for i in range(num_seeds)]
    if seeds and not 0 <= min(seeds) <= max(seeds) < 2**64:
        raise ValueError(f"seeds must be in [0, 2**64), got {seeds[0]}..{seeds[-1]}.")
    return np.array([[s >> 32, s & 0xFFFFFFFF] for s in seeds], dtype=np.uint32)


def run_name(env_id: str, exp_name: str, seed: int, unix_time: int) -> str:
    """CleanRL's run name, `{env_id}__{exp_name}__{seed}__{unix_time}` (a `/` in the id, as in
    `brax/ant`, becomes `-`: the name is one directory)."""
    return f"{env_id.replace('/', '-')}__{exp_name}__{seed}__{unix_time}"


def report_progress(callback, update, num_updates: int, every: int, global_step, returns):
    """Inside `jit`: call `callback(update, global_step, returns)` every `every` updates.

    `update` must be the unbatched loop counter (from `jnp.arange`), so that under `vmap` the
    branch stays a branch and the callback is not run on every update.
    """
    report = jnp.logical_or(update % every == 0, update == num_updates - 1)
    # debug.callback's batching rule calls `callback` once per vmapped run.
    lax.cond(report, lambda: jax.debug.callback(callback, update, global_step, returns),
             lambda: None)


class Progress:
    """Prints `step, return, SPS, ETA` while training, at most once per `min_interval` seconds.

    The CLI calls `report` between compiled chunks. Inside `jit`, `report_progress` calls the
    object itself once per vmapped run and update; it averages the runs of an update and
    reports them together when the next update arrives, or, for the last update, once no
    more of its runs have arrived for `FINAL_WAIT` seconds (or on `close`).
    """

    FINAL_WAIT = 0.1

    def __init__(self, name: str, total_steps: int, min_interval: float = 1.0, stream=None):
        self.name, self.total_steps, self.min_interval = name, total_steps, min_interval
        self.stream = stream or sys.stdout
        self.start = None  # (step, time) of the first report: SPS excludes compilation
        self.last_print = -math.inf
        self.pending = None  # [update, step, returns] gathered from callbacks
        self.timeline = []  # (global_step, wall time) of every report
        self.lock, self.timer = threading.Lock(), None  # the last update's report, delayed

    def report(self, step: int, returns, final: bool = False):
        """Record that `step` steps (per run) are done; `returns` are the runs' recent returns."""
        now = time.perf_counter()
        self.timeline.append((int(step), now))
        if self.start is None:
            self.start = (int(step), now)
        if not final and now - self.last_print < self.min_interval:
            return
        self.last_print = now
        finite = [float(r) for r in np.ravel(returns) if math.isfinite(r)]
        ret = f"{np.mean(finite):9.2f}" if finite else "      n/a"
        elapsed = now - self.start[1]
        sps = (step - self.start[0]) / elapsed if elapsed > 0 else 0.0
        eta = f"{(self.total_steps - step) / sps:6.1f}s" if sps > 0 else "   n/a"
        rate = f"{sps:>10,.0f}" if sps > 0 else "       n/a"  # the first report: no interval yet
        print(f"[{self.name}] step {step:>12,}/{self.total_steps:,} "
              f"({100 * step / self.total_steps:3.0f}%) | return {ret} | "
              f"{rate} SPS per run | ETA {eta}", file=self.stream, flush=True)

    def __call__(self, update, global_step, returns):
        with self.lock:
            if self.pending is not None and self.pending[0] != int(update):
                self._report_pending(final=False)
            if self.pending is None:
                self.pending = [int(update), int(global_step), []]
            self.pending[2].append(float(returns))
        if int(global_step) >= self.total_steps:  # no next update will report this one
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(self.FINAL_WAIT, self.close)
            self.timer.start()

    def report_from_jit(self, update, num_updates: int, global_step, returns):
        """Inside `jit`: report about 50 times over a run of `num_updates` (`report_progress`)."""
        report_progress(self, update, num_updates, max(1, num_updates // 50), global_step,
                        returns)

    def close(self):
        """Report what the callbacks gathered last."""
        with self.lock:
            self._report_pending(final=True)

    def _report_pending(self, final: bool):
        if self.pending is not None:
            _, step, returns = self.pending
            self.pending = None
            self.report(step, returns, final=final)


POINTS_PER_CHART = 1000
"""TensorBoard shows at most 1000 points of a scalar chart by default (a reservoir sample,
`--samples_per_plugin scalars=1000`); a run with more updates writes block means instead."""


def log_every(num_updates: int, requested: int = 0) -> int:
    """Updates per TensorBoard point: `requested` when given, else the fewest that keep a run
    within `POINTS_PER_CHART` points."""
    return requested or max(1, -(-num_updates // POINTS_PER_CHART))


def block_means(steps, columns, every: int):
    """Means of consecutive blocks of `every` rows (NaNs ignored: an update that finished no
    episode, an update without evaluation), each at the last step of its block.

    `steps` [n], `columns` [n, k] -> ([ceil(n / every)], [ceil(n / every), k]); a last
    block shorter than `every` is averaged over its own rows. All-NaN blocks stay NaN.
    """
    steps, columns = np.asarray(steps), np.asarray(columns, np.float64)
    n, k = columns.shape
    blocks = -(-n // every)
    padded = np.full((blocks * every, k), np.nan)
    padded[:n] = columns
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(padded.reshape(blocks, every, k), axis=1)
    return steps[np.minimum(np.arange(1, blocks + 1) * every, n) - 1], means


class TensorBoardRun:
    """One TensorBoard run, written as training goes: the hyperparameter table, then every
    metric and charts/SPS. Each point is the mean of `every` consecutive updates
    (`block_means`; `every=1`: one point per update); a block split across two `write` calls
    waits for its remaining updates, and `close` writes a last, shorter block. `write`
    returns with the events in the file (handed to the OS, not synced to the disk until
    `close`); call it from one thread at a time.

    `purge=True` (a resumed run): hide every event an earlier process wrote to this run
    directory (a SessionLog START at step 0, as tensorboardX's `purge_step=0` writes), so the
    caller rewrites the saved updates and no step shows twice however far the interrupted
    process had logged.

    The events go straight into tensorboardX's `EventsWriter`, without `SummaryWriter`'s own
    queue and thread: the caller already writes off the training loop's thread
    (`BackgroundWriter`), and that queue pickles every event through a `multiprocessing`
    pipe, which more than doubles the cost of an event.
    """

    def __init__(self, log_dir: str, name: str, hparams: dict, purge: bool = False,
                 every: int = 1):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.summary import text

        self.path, self.every, self.held = os.path.join(log_dir, name), every, None
        self.templates = {}  # `_template`
        os.makedirs(self.path, exist_ok=True)
        self.events = EventsWriter(os.path.join(self.path, "events"))  # + the version event
        if purge:
            self._event(step=0, session_log=_session_start())
        rows = "\n".join(f"|{k}|{v}|" for k, v in hparams.items())
        self._event(step=0, summary=text("hyperparameters", "|param|value|\n|-|-|\n" + rows))
        self._to_file()

    def _event(self, **fields):
        from tensorboardX.proto.event_pb2 import Event

        self.events.write_event(Event(wall_time=time.time(), **fields))

    def write(self, metrics: dict, sps_points=()):
        """`metrics` maps names to 1-D arrays, one row per update, and holds `global_step`;
        `sps_points` are `(global_step, SPS)` pairs measured on the host."""
        if self.held is not None:  # the start of a block that the last call did not finish
            metrics = _joined(self.held, metrics)
        n = len(metrics["global_step"])
        whole = n - n % self.every
        self.held = {k: np.asarray(v)[whole:] for k, v in metrics.items()} if whole < n else None
        self._points({k: np.asarray(v)[:whole] for k, v in metrics.items()})
        for step, sps in sps_points:
            self._points({"global_step": np.array([step]), "SPS": np.array([sps])}, every=1)
        self._to_file()

    def _to_file(self):
        """Hand the buffered events to the operating system, where TensorBoard reads them.
        Not `EventsWriter.flush`, which also fsyncs the file at every call (a quarter of
        what writing a chunk's points costs): a run killed mid-way loses nothing the OS
        holds, and a resumed run rewrites its points from the checkpoint. `close` syncs."""
        self.events._py_recordio_writer._writer.flush()  # tensorboardX 2.6.5's file object

    def _points(self, metrics: dict, every: int | None = None):
        """One event per point holding every finite metric (scalars, as `add_scalar` writes
        them); an evaluation is a point of its own, at the step it was made."""
        steps = np.asarray(metrics["global_step"])
        names = [k for k in metrics if k != "global_step" and k not in AT_OWN_STEP]
        for k in AT_OWN_STEP & metrics.keys():
            values = np.asarray(metrics[k], np.float64)
            made = np.isfinite(values)
            self._events(steps[made], values[made, None], [k])
        if names:
            columns = np.stack([np.asarray(metrics[k], np.float64) for k in names], axis=-1)
            self._events(*block_means(steps, columns, every or self.every), names)

    def _events(self, steps, rows, names: list):
        """One event per step, holding each metric of `names` finite in its row of `rows`."""
        tags, finite = [tag(k) for k in names], np.isfinite(rows)
        for step, row, present in zip(steps.tolist(), rows.tolist(), finite.tolist()):
            event, values = self._template(tags, tuple(present))
            event.step, event.wall_time = int(step), time.time()
            for value, x in zip(values, (x for x, p in zip(row, present) if p)):
                value.simple_value = x
            self.events.write_event(event)

    def _template(self, tags: list, present: tuple):
        """An Event holding a scalar for each of `tags` that is `present`, reused for every
        point with these metrics: filling in a protobuf message costs a fifth of building one."""
        key = (tuple(tags), present)
        if key not in self.templates:
            from tensorboardX.proto.event_pb2 import Event
            from tensorboardX.proto.summary_pb2 import Summary

            event = Event(summary=Summary(value=[Summary.Value(tag=t)
                                                 for t, p in zip(tags, present) if p]))
            self.templates[key] = event, list(event.summary.value)
        return self.templates[key]

    def close(self):
        if self.held is not None:
            held, self.held = self.held, None
            self._points(held)
        self.events.close()


def _session_start():
    from tensorboardX.proto.event_pb2 import SessionLog

    return SessionLog(status=SessionLog.START)


def _joined(first: dict, second: dict) -> dict:
    """Two runs of rows one after the other; a metric missing from one is NaN there."""
    def column(rows, k):
        if k in rows:
            return np.asarray(rows[k])
        return np.full(len(rows["global_step"]), np.nan)

    return {k: np.concatenate([column(first, k), column(second, k)])
            for k in dict.fromkeys([*first, *second])}


def sps_points(timeline, seeds: int):
    """`(global_step, SPS)` between consecutive progress reports, counting all vmapped seeds."""
    return [(s1, seeds * (s1 - s0) / (t1 - t0))
            for (s0, t0), (s1, t1) in zip(timeline, timeline[1:]) if t1 > t0]


def final_return(episodic_return, fraction: float = 0.1):
    """Mean episodic return over the last `fraction` of updates (NaNs ignored), per run.

    `episodic_return` has shape [..., num_updates]; the result has shape [...].
    """
    episodic_return = np.asarray(episodic_return, np.float64)
    tail = max(1, int(round(episodic_return.shape[-1] * fraction)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: no episode finished
        return np.nanmean(episodic_return[..., -tail:], axis=-1)


class BackgroundWriter:
    """A thread that runs the host's file work (TensorBoard, checkpoints) in order, so that the
    training loop does not wait for it.

    `put(fn, *args, **kwargs)` queues a call; `flush()` waits until every queued call has run.
    Leaving the `with` block flushes and ends the thread, also when an exception leaves it (a
    queued checkpoint is always written out). After a queued call raises, the queued calls are
    skipped while that error waits to be raised in the caller (by the next `put` or `flush`,
    or on leaving the block); after that, queued calls run again.
    """

    def __init__(self):
        self.jobs, self.error, self.thread = queue.Queue(), None, None

    def __enter__(self):
        self.thread = threading.Thread(target=self._work, name="writer", daemon=True)
        self.thread.start()
        return self

    def _work(self):
        while (job := self.jobs.get()) is not None:
            fn, args, kwargs = job
            try:
                if self.error is None:
                    fn(*args, **kwargs)
            except BaseException as error:  # noqa: B036  (handed to the main thread)
                self.error = error
            finally:
                self.jobs.task_done()

    def _raise(self):
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def put(self, fn, *args, **kwargs):
        self._raise()
        self.jobs.put((fn, args, kwargs))

    def flush(self):
        self.jobs.join()
        self._raise()

    def __exit__(self, exc_type, *exc):
        self.jobs.join()
        self.jobs.put(None)
        self.thread.join()
        if exc_type is None:
            self._raise()
        elif self.error is not None:
            print(f"error: writing logs or a checkpoint also failed: {self.error}",
                  file=sys.stderr, flush=True)
