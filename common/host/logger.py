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
    "learning_rate": "charts/learning_rate",
    "eval_return": "eval/episodic_return",
}


def tag(name: str) -> str:
    """TensorBoard tag of a metric: `charts/...` for the CleanRL charts, else `losses/...`."""
    return TAGS.get(name, f"losses/{name}")


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
    reports them together when the next update arrives (or on `close`).
    """

    def __init__(self, name: str, total_steps: int, min_interval: float = 1.0, stream=None):
        self.name, self.total_steps, self.min_interval = name, total_steps, min_interval
        self.stream = stream or sys.stdout
        self.start = None  # (step, time) of the first report: SPS excludes compilation
        self.last_print = -math.inf
        self.pending = None  # [update, step, returns] gathered from callbacks
        self.timeline = []  # (global_step, wall time) of every report

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
        sps = (step - self.start[0]) / elapsed if elapsed > 0 else float("nan")
        eta = f"{(self.total_steps - step) / sps:6.1f}s" if sps > 0 else "   n/a"
        print(f"[{self.name}] step {step:>12,}/{self.total_steps:,} "
              f"({100 * step / self.total_steps:3.0f}%) | return {ret} | "
              f"{sps:>10,.0f} SPS per run | ETA {eta}", file=self.stream, flush=True)

    def __call__(self, update, global_step, returns):
        if self.pending is not None and self.pending[0] != int(update):
            self.close(final=False)
        if self.pending is None:
            self.pending = [int(update), int(global_step), []]
        self.pending[2].append(float(returns))

    def report_from_jit(self, update, num_updates: int, global_step, returns):
        """Inside `jit`: report about 50 times over a run of `num_updates` (`report_progress`)."""
        report_progress(self, update, num_updates, max(1, num_updates // 50), global_step,
                        returns)

    def close(self, final: bool = True):
        """Report what the callbacks gathered last."""
        if self.pending is not None:
            _, step, returns = self.pending
            self.pending = None
            self.report(step, returns, final=final)


class TensorBoardRun:
    """One TensorBoard run, written as training goes: the hyperparameter table, then every
    metric per update and charts/SPS. tensorboardX writes events from its own queue: `write`
    flushes the file, and only `close` guarantees that every queued event is on disk.

    `purge=True` (a resumed run): hide every event an earlier process wrote to this run
    directory (tensorboardX's `purge_step`), so the caller rewrites the saved updates and no
    step shows twice however far the interrupted process had logged.
    """

    def __init__(self, log_dir: str, name: str, hparams: dict, purge: bool = False):
        from tensorboardX import SummaryWriter

        self.path = os.path.join(log_dir, name)
        self.writer = SummaryWriter(self.path, purge_step=0 if purge else None)
        rows = "\n".join(f"|{k}|{v}|" for k, v in hparams.items())
        self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + rows)

    def write(self, metrics: dict, sps_points=()):
        """`metrics` maps names to 1-D arrays, one row per update, and holds `global_step`;
        `sps_points` are `(global_step, SPS)` pairs measured on the host."""
        from tensorboardX.proto.summary_pb2 import Summary

        # One event per update holding every metric: the same scalars as `add_scalar` per
        # metric, written about 7x faster (this runs once per seed and update).
        file_writer = self.writer._get_file_writer()  # what `add_scalar` itself writes to
        names = [k for k in metrics if k != "global_step"]
        tags = [tag(k) for k in names]
        columns = np.stack([np.asarray(metrics[k], np.float64) for k in names], axis=-1)
        for step, row in zip(np.asarray(metrics["global_step"]).tolist(), columns.tolist()):
            values = [Summary.Value(tag=t, simple_value=v) for t, v in zip(tags, row)
                      if math.isfinite(v)]
            file_writer.add_summary(Summary(value=values), int(step))
        for step, sps in sps_points:
            self.writer.add_scalar("charts/SPS", sps, int(step))
        self.writer.flush()

    def close(self):
        self.writer.close()


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
