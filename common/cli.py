"""The command-line driver the algorithm files share: compile once, train in chunks, log.

`train_and_log` runs `num_seeds` vmapped runs as a sequence of calls to one compiled chunk of
updates (`train.run_updates`), printing progress between chunks. Results are identical to a
single `jit(vmap(train))(keys)` call (`tests/test_ppo.py` checks it); the chunks exist so that
the compiled program holds no host callback and therefore lands in JAX's persistent
compilation cache: a second identical command skips compilation.
"""

import dataclasses
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from common import logger


def parse_config(config_cls, argv=None):
    """Build a config from the command line with tyro; a bad value exits 2 with one line.

    tyro parses into a copy of the class without `__post_init__`, so that the config's own
    validation message reaches the user as one line rather than inside tyro's error box.
    """
    import tyro

    unchecked = type(config_cls.__name__, (config_cls,),
                     {"__post_init__": lambda self: None, "__doc__": config_cls.__doc__,
                      "__module__": config_cls.__module__})
    parsed = tyro.cli(unchecked, args=argv)
    try:
        return config_cls(**{f.name: getattr(parsed, f.name)
                             for f in dataclasses.fields(config_cls)})
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def chunk_size(num_updates: int, target_chunks: int = 20) -> int:
    """The largest divisor of `num_updates` that gives at least `target_chunks` chunks.

    A divisor, so every chunk has the same length and one compiled program serves them all.
    """
    limit = max(1, num_updates // target_chunks)
    return max(d for d in range(1, limit + 1) if num_updates % d == 0)


def train_and_log(algo: str, config, train):
    """Train `config.num_seeds` runs of `train` (from `make_train`) and log them.

    Returns the metrics as NumPy arrays with leading axes `[num_seeds, num_updates]`.
    """
    logger.enable_compilation_cache()
    keys = logger.seed_keys(config.seed, config.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    num_updates, chunk = config.num_updates, chunk_size(config.num_updates)
    steps = num_updates * config.batch_size

    start = time.perf_counter()
    state = jax.jit(jax.vmap(train.init))(keys, hparams)
    run_chunk = jax.jit(jax.vmap(train.run_updates, in_axes=(0, 0, None))).lower(
        state, hparams, jnp.arange(chunk)).compile()
    compile_time = time.perf_counter() - start

    progress = logger.Progress(f"{algo.lower()} {config.env_id}", steps)
    rows = []
    start = time.perf_counter()
    progress.report(0, [])
    for first in range(0, num_updates, chunk):
        state, metrics = run_chunk(state, hparams, jnp.arange(first, first + chunk))
        metrics = jax.device_get(metrics)
        rows.append(metrics)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a chunk may finish no episode
            recent = np.nanmean(metrics["episodic_return"], axis=1)
        progress.report(int(metrics["global_step"][0, -1]), recent,
                        final=first + chunk == num_updates)
    train_time = time.perf_counter() - start
    metrics = {k: np.concatenate([r[k] for r in rows], axis=1) for k in rows[0]}

    unix_time = int(time.time())
    sps = logger.sps_points(progress.timeline, config.num_seeds)
    paths = []
    for i in range(config.num_seeds):
        name = logger.run_name(config.env_id, config.exp_name, config.seed + i, unix_time)
        paths.append(logger.write_tensorboard(
            config.log_dir, name, config, {k: v[i] for k, v in metrics.items()}, sps))
    final = logger.final_return(metrics["episodic_return"])
    more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
    print(f"done: {algo} on {config.env_id}, {config.num_seeds} run(s) x {steps:,} steps | final "
          f"return (last 10% of updates) mean {np.mean(final):.2f}, min {np.min(final):.2f} | "
          f"compile {compile_time:.1f}s, train {train_time:.1f}s "
          f"({steps * config.num_seeds / train_time:,.0f} SPS) | logs: {paths[0]}{more}")
    return metrics
