"""Evaluate a saved run: `python -m algos.evaluate PATH [--episodes K] [--seed S]
[--capture-video OUT.gif|OUT.html]`.

Loads a checkpoint written by any of the three algorithm files, rebuilds its `Config` and
`make_train`, and plays the deterministic policy (the mode of pi) of every run it holds
(`common/evaluate.py`); `--capture-video` draws one episode of the first run as a GIF
(an HTML page for Brax; `common/host/video.py`).

Ctrl-C (or SIGTERM) at any moment: one line, exit 128 + the signal (`common/host/starting.py`).
"""

if __name__ == "__main__":  # Ctrl-C while it loads, compiles or plays: one line, exit 130
    from common.host.starting import STARTING

    STARTING.watch(line="interrupted; the evaluation stopped")

import dataclasses
import importlib
import os
import sys
from functools import partial
from typing import Annotated

import jax
import numpy as np
import tyro

from common.evaluate import evaluate, record_episode
from common.host import checkpoint, logger
from common.host.flags import tyro_cli
from common.host.video import check_renderer, save_video

ALGOS = {"ppo": "algos.ppo", "a2c": "algos.a2c", "impala": "algos.impala"}
"""The algorithms a checkpoint may name (never an arbitrary module)."""


@dataclasses.dataclass(frozen=True)
class Args:
    """Evaluate a saved run: the deterministic policy (mode of pi) of every run it holds."""

    checkpoint: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="PATH")]]
    """A checkpoint file, or a run directory holding `latest.msgpack`."""
    episodes: int = 10
    """Episodes per run, each in its own environment."""
    seed: int = 0
    """Seed of the evaluation environments."""
    capture_video: str | None = None
    """Also save a GIF of one episode of the first run to this path (Brax: an `.html` page)."""


def check_video_path(path: str):
    """Raise `ValueError` unless a file can be written at `path` (tested before the episode is
    played and drawn; a test file made here is removed)."""
    if os.path.isdir(path):
        raise ValueError(f"--capture-video {path!r} is a directory; give a file name such as "
                         "episode.gif.")
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as error:
        raise ValueError(f"cannot write the video to {path!r}: "
                         f"{error.strerror or error}.") from None
    if not existed:
        os.remove(path)


def restore_run(record: dict, path: str):
    """`(config, seeds, train, state)` of a loaded checkpoint: the algorithm's Config, the
    runs' seeds, its `make_train(config)` and the restored vmapped TrainState. A PBT run's
    (`--pbt-population`): its members' numbers in the place of the seeds, and their
    TrainState [population]."""
    if record["algo"] not in ALGOS:
        raise checkpoint.CheckpointError(f"{path!r} names an unknown algorithm "
                                         f"{record['algo']!r}.")
    module = importlib.import_module(ALGOS[record["algo"]])
    fields = {f.name for f in dataclasses.fields(module.Config)}
    config = module.Config(**{k: v for k, v in record["config"].items() if k in fields})
    train = module.make_train(config)
    seed, num_seeds = int(record["run"]["seed"]), int(record["run"]["num_seeds"])
    members = int(record["run"].get("pbt_population") or 0)
    keys = logger.seed_keys(seed, members or num_seeds)
    template = jax.eval_shape(jax.vmap(train.init), keys,
                              jax.vmap(lambda _: config.hparams())(keys))
    if members:  # a PBT run's `PBTState`: the members' states, hyperparameters, PBT key
        state = checkpoint.restore(template, record["train_state"]["states"], path)
        return config, list(range(members)), train, state
    state = checkpoint.restore(template, record["train_state"], path)
    return config, list(range(seed, seed + num_seeds)), train, state


def main(argv=None):
    """Evaluate the checkpoint named on the command line; print one line per run."""
    args = tyro_cli(Args, argv, {f.name for f in dataclasses.fields(Args)},
                    prog="python -m algos.evaluate")
    logger.enable_compilation_cache()  # a second evaluation of a run skips compiling
    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes must be a positive integer, got {args.episodes}.")
        if not 0 <= args.seed < 2**32:
            raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}.")
        record = checkpoint.load(checkpoint.resolve(args.checkpoint))
        if args.capture_video:
            check_video_path(args.capture_video)
            check_renderer(record["config"].get("env_id"), args.capture_video)
        config, seeds, train, state = restore_run(record, args.checkpoint)
    except ValueError as error:  # CheckpointError included
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    env, env_params, spec = train.env  # make_env's, as the run trained: none built here
    keys = jax.random.split(jax.random.PRNGKey(args.seed), len(seeds))
    returns, lengths = jax.jit(jax.vmap(
        lambda s, k: evaluate(partial(train.act, s), env, env_params, spec, k, args.episodes,
                              hidden=train.initial_hidden(args.episodes))
    ))(state, keys)
    print(f"evaluate: {record['algo']} on {config.env_id}, {args.checkpoint} (update "
          f"{record['update']} of {config.num_updates}), {args.episodes} episodes per run, "
          f"deterministic policy")
    run = "member" if record["run"].get("pbt_population") else "seed"  # PBT: members
    for seed, r, n in zip(seeds, np.asarray(returns), np.asarray(lengths)):
        print(f"  {run} {seed}: mean return {r.mean():.2f} (min {r.min():.2f}, "
              f"max {r.max():.2f}), mean length {n.mean():.1f}")
    print(f"mean return over {len(seeds)} run(s): {np.mean(returns):.2f}")

    if args.capture_video:
        first = jax.tree.map(lambda x: x[0], state)
        states, rewards, done = jax.device_get(jax.jit(  # to the host once, sliced there
            lambda s, k: record_episode(partial(train.act, s), env, env_params, spec, k,
                                        hidden=train.initial_hidden(1))
        )(first, keys[0]))
        length = int(np.argmax(done)) + 1 if done.any() else len(done)
        frames = [jax.tree.map(lambda x: x[t], states) for t in range(length)]
        save_video(config.env_id, env, env_params, frames, rewards[:length], args.capture_video)
        print(f"video: {args.capture_video} ({length} frames, return "
              f"{float(np.sum(rewards[:length])):.2f}, {run} {seeds[0]})")
    return returns


if __name__ == "__main__":
    main()
