"""Learning benchmark: train N vmapped seeds of one algorithm on one environment.

    python benchmarks/learning.py --algo ppo --env-id CartPole-v1 --seeds 32
    python benchmarks/learning.py --suite playground --algos a2c impala

Settings are the presets of `common/presets.py` (through `benchmarks/configs.py`; override the
budget with --total-timesteps).
Prints the final return (mean over the last 10% of updates) per seed, their mean, std and
min, and the steady-state SPS; saves every seed's final return and its episodic return per
update (at most 500 points: block means of `updates_per_point` updates for longer runs), with
the command, commit and library versions, to `benchmarks/results/{algo}__{env_id}.json`.

`--suite playground` runs every Control Suite task of MuJoCo Playground (`playground/<Task>`,
or those of `--tasks`) end to end with each algorithm of `--algos` instead: its preset's
config with a small budget (`--num-envs` x `--num-steps` x `--updates`, 2 minibatches where
the algorithm has them), `jit(train)` compiled and run once on one key; it records the compile
and training time, the steps per second, whether every metric (but the episodic ones) and
every parameter is finite, and the returns of the episodes that ended. Writes
`benchmarks/results/playground_suite.json` (`--name`; with the commit and library versions)
and prints one line per run. A task that fails to build, compile or run is recorded with its
error and the suite goes on; it exits 1 if any did.
"""

import argparse
import dataclasses
import importlib
import os
import sys
import time
import traceback
from importlib import metadata

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import (VARIANTS, check_overrides, library_versions,  # noqa: E402
                                parse_overrides, refuse_other_mode, save_record, settings,
                                source_commit, thin_curves)
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


EPISODIC = ("episodic_return", "episodic_length", "repeated_starts")
"""Metrics that are NaN where no episode ended: left out of the suite's finiteness check."""


def suite_run(algo: str, env_id: str, num_envs: int, num_steps: int, updates: int) -> dict:
    """One run of `--suite`: the preset's config with a small budget, compiled and run once."""
    module = importlib.import_module(f"algos.{algo}")
    small = dict(num_envs=num_envs, num_steps=num_steps)
    if "num_minibatches" in {f.name for f in dataclasses.fields(module.Config)}:
        small["num_minibatches"] = 2
    config = cell_config(algo, env_id, num_envs * num_steps * updates, **small)
    start = time.perf_counter()
    compiled = jax.jit(module.make_train(config)).lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(compiled(jax.random.PRNGKey(0)))
    train_s = time.perf_counter() - start
    finite = all(bool(np.isfinite(np.asarray(v)).all()) for k, v in metrics.items()
                 if k not in EPISODIC)
    finite = finite and all(bool(np.isfinite(np.asarray(x)).all())
                            for x in jax.tree.leaves(state.params))
    returns = np.asarray(metrics["episodic_return"])
    return {"compile_s": round(compile_s, 2), "train_s": round(train_s, 3),
            "sps": round(config.num_updates * config.batch_size / train_s),
            "finite": finite, "episodes_ended": bool(np.isfinite(returns).any()),
            "returns": [round(float(r), 2) for r in returns[np.isfinite(returns)]]}


def playground_suite(parser, args) -> int:
    """`--suite playground`: every run, each recorded and printed as it ends; 1 if any
    failed."""
    from common.presets import PLAYGROUND  # the Control Suite's tasks, where installed

    suite = [env_id.removeprefix("playground/") for env_id in PLAYGROUND]
    if not suite:
        parser.error("MuJoCo Playground is not installed: pip install -e \".[playground]\"")
    tasks = args.tasks or suite
    unknown = sorted(set(tasks) - set(suite))
    if unknown:
        parser.error(f"not Control Suite tasks: {', '.join(unknown)}")
    runs, failed = [], 0
    for task in tasks:
        for algo in args.algos:
            env_id = f"playground/{task}"
            try:
                result = suite_run(algo, env_id, args.num_envs, args.num_steps, args.updates)
                ok = result["finite"] and result["episodes_ended"]
            except Exception as error:  # recorded, and the suite goes on
                result = {"error": f"{type(error).__name__}: {error}"[:500],
                          "traceback": traceback.format_exc()[-2000:]}
                ok = False
            failed += not ok
            runs.append({"algo": algo, "env_id": env_id, "ok": ok, **result})
            summary = result.get("error") or (
                f"compile {result['compile_s']:.1f}s, train {result['train_s']:.2f}s, "
                f"{result['sps']:,} SPS, finite {result['finite']}, returns {result['returns']}")
            print(f"{'ok  ' if ok else 'FAIL'} {algo:6s} {env_id:36s} {summary}", flush=True)
    path = save_record({
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "commit": source_commit(),
        "versions": {**library_versions(), **{p: metadata.version(p) for p in (
            "playground", "mujoco", "mujoco-mjx", "brax")}},
        "device": jax.devices()[0].device_kind, "num_envs": args.num_envs,
        "num_steps": args.num_steps, "updates": args.updates, "runs": runs},
        args.out_dir, args.name)
    print(f"{len(runs) - failed} of {len(runs)} runs ok; saved {os.path.relpath(path, ROOT)}")
    return 1 if failed else 0


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
    suite = parser.add_argument_group("--suite playground (the docstring says what it runs)")
    suite.add_argument("--suite", choices=["playground"], default=None)
    suite.add_argument("--algos", nargs="+", default=["ppo", "a2c", "impala"],
                       choices=["ppo", "a2c", "impala"])
    suite.add_argument("--tasks", nargs="*", default=None,
                       help="Control Suite task names (default: every one)")
    suite.add_argument("--num-envs", type=int, default=4)
    suite.add_argument("--num-steps", type=int, default=250,
                       help="a 1000-step episode ends after 4 rollouts of 250 steps")
    suite.add_argument("--updates", type=int, default=4)
    suite.add_argument("--name", default="playground_suite", help="the JSON file's name")
    return parser


CELL_ONLY = ("algo", "env_id", "seeds", "total_timesteps", "set", "variant", "tag")
SUITE_ONLY = ("algos", "tasks", "num_envs", "num_steps", "updates", "name")
"""The flags that one cell, or only `--suite`, reads: each refused in the other mode."""


def main():
    parser = make_parser()
    args = parser.parse_args()
    defaults = parser.parse_args([])
    refuse_other_mode(parser, args, defaults, "suite", SUITE_ONLY, CELL_ONLY)
    if args.suite:
        return playground_suite(parser, args)

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
    sys.exit(main())
