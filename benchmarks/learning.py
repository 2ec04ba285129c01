"""Learning benchmark: train N vmapped seeds of one algorithm on one environment.

    python benchmarks/learning.py --algo ppo --env-id CartPole-v1 --seeds 32

Settings are the presets of `common/presets.py` (through `benchmarks/configs.py`; override the
budget with --total-timesteps).
Prints the final return (mean over the last 10% of updates) per seed, their mean, std and
min, and the steady-state SPS; saves every seed's final return and its episodic return per
update (at most 500 points: block means of `updates_per_point` updates for longer runs), with
the command, commit and library versions, to `benchmarks/results/{algo}__{env_id}.json`.
"""

import argparse
import dataclasses
import importlib
import os
import sys
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import (VARIANTS, check_overrides, library_versions,  # noqa: E402
                                parse_overrides, save_record, settings, source_commit,
                                thin_curves)
from common.host.logger import final_return, seed_keys  # noqa: E402
from common.host.options import whole_number  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402


def cell_config(algo: str, env_id: str, total_timesteps=None, variant: str = "", **overrides):
    """The `Config` of one cell: the presets, the variant, then `overrides` and the budget."""
    cell = {**settings(algo, env_id, variant), **overrides}
    if total_timesteps is not None:
        cell["total_timesteps"] = total_timesteps
    return importlib.import_module(f"algos.{algo}").Config(env_id=env_id, **cell)


def run_cell(algo: str, env_id: str, seeds: int, total_timesteps=None, seed: int = 1,
             variant: str = "", **overrides):
    module = importlib.import_module(f"algos.{algo}")
    config = cell_config(algo, env_id, total_timesteps, variant, **overrides)
    unroll_threefry_on_cpu()  # as the command line does: the same random bits, faster on CPU
    keys = seed_keys(seed, seeds)
    start = time.perf_counter()
    train = jax.jit(jax.vmap(module.make_train(config))).lower(keys).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    _, metrics = jax.block_until_ready(train(keys))
    train_s = time.perf_counter() - start
    metrics = jax.tree.map(np.asarray, metrics)
    return config, metrics, compile_s, train_s


def make_parser() -> argparse.ArgumentParser:
    """This script's command line (`benchmarks/table.py` reads recorded commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "impala"])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--total-timesteps", type=whole_number, default=None)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="override Config fields, e.g. --set learning_rate=1e-3")
    parser.add_argument("--variant", default="", choices=["", *VARIANTS],
                        help="a named set of overrides from benchmarks/configs.py")
    parser.add_argument("--tag", default="",
                        help="suffix of the results file name (default: the variant)")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    return parser


def main():
    args = make_parser().parse_args()

    overrides = parse_overrides(args.set)
    args.total_timesteps = check_overrides(
        args.algo, importlib.import_module(f"algos.{args.algo}").Config, overrides,
        args.total_timesteps)
    config, metrics, compile_s, train_s = run_cell(args.algo, args.env_id, args.seeds,
                                                   args.total_timesteps,
                                                   variant=args.variant, **overrides)
    final = final_return(metrics["episodic_return"])
    steps = config.num_updates * config.batch_size
    print(f"{args.algo} {args.env_id}: {args.seeds} seeds x {steps:,} steps | final return "
          f"(last 10% of updates) mean {final.mean():.2f} +- {final.std():.2f} (std), "
          f"min {final.min():.2f}, max {final.max():.2f} | compile {compile_s:.1f}s, "
          f"train {train_s:.1f}s, {steps * args.seeds / train_s:,.0f} SPS (all seeds)")
    print("per seed:", " ".join(f"{x:.1f}" for x in final))

    global_step, returns, every = thin_curves(metrics["global_step"][0].tolist(),
                                              metrics["episodic_return"])
    record = {
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "commit": source_commit(),
        "versions": library_versions(),
        "config": dataclasses.asdict(config),
        "compile_s": round(compile_s, 2), "train_s": round(train_s, 2),
        "updates_per_point": every,
        "global_step": global_step,
        "episodic_return": np.round(returns, 2).tolist(),
        "final_return": np.round(final, 4).tolist(),  # from every update
    }
    tag = args.tag or args.variant
    tag = f"__{tag}" if tag else ""
    path = save_record(record, args.out_dir, f"{args.algo}__{args.env_id}{tag}")
    print("saved", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
