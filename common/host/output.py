"""What the host does with each chunk's results, and the run's last line: the NaN guard
(`stop_if_not_finite`), the evaluation when due (`eval_keys`), the progress line
(`recent_returns`), the TensorBoard rows (`open_boards`, `write_boards`), all from `log_chunk`;
then `summarise`.
"""

import dataclasses
import os
import warnings

import jax
import numpy as np

from common.host import checkpoint, logger
from common.host.devices import fail, fetch, same_everywhere
from common.host.options import RunOptions
from common.host.session import Session, last_checkpoint


NAN_BY_DESIGN = ("episodic_return", "episodic_length", "repeated_starts", "explained_variance",
                 "eval_return")
"""Metrics that may be NaN in a healthy run (no episode finished in an update, a constant
return); every other metric and every parameter is checked for NaN/inf after each chunk."""


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


EVAL_STREAM = 0x6576616C
"""The number (`eval` in ASCII) folded into a run's seed key to start its evaluation keys."""


def eval_keys(run: RunOptions, update: int):
    """The evaluation keys after `update`: independent of training's, the same on resume.

    They come from a stream of their own, `fold_in(fold_in(seed key, EVAL_STREAM), update)`.
    Folding the update into the seed key itself would not do: JAX's Threefry keys are
    partitionable, `fold_in(key, i)` is `split(key, n)[i]`, and `init` splits the seed key in
    3 (the carried key, the network's, the environments'), so evaluations after updates 1 and 2
    would play with the network's and the environments' keys."""
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
    return fold(fold(logger.seed_keys(run.seed, run.num_seeds), EVAL_STREAM), update)


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


def write_boards(boards: list, metrics: dict, sps_points):
    """On the writer thread: each run's rows of `metrics` [num_seeds, updates] to its board
    (one queued call for all of them, not one hand-over to the thread per run)."""
    for i, board in enumerate(boards):
        board.write({k: v[i] for k, v in metrics.items()}, sps_points)


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
