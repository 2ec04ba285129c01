"""Hyperparameter sweep: seeds x a grid of float hyperparameters, trained in one compiled call.

Every grid point runs the same seeds (seed, seed + 1, ...), so points differ only in their
hyperparameters. The swept fields are the algorithm's `HParams` (learning rate, discount,
coefficients, epsilons, ...): they enter the program as traced values, so the whole grid is
one `jit(vmap(train))`. Structural fields (sizes, network, optimiser) go in `--set`.

    python benchmarks/sweep.py --algo impala --env-id Breakout-MinAtar --seeds 2 \
        --total-timesteps 1000000 --grid learning_rate=1e-3,3e-3 opt_eps=0.01,1e-5

prints one line per grid point (final return: mean over the last 10% of updates, per seed;
and the policy's mean entropy over the same updates, where a premature collapse shows) and
writes `benchmarks/results/sweeps/<algo>__<env>__<tag>.json` with every run's curve (at most
500 points, as `benchmarks/learning.py` saves them) and its final return and entropy.

`--pbt RANGE ...` compares population-based training (`common/pbt.py`) with the grid over the
same ranges, at the same total steps, each in one compiled call, `--experiments` times (the
grid's runs take the PBT members' keys, experiment e seeds both from `--seed` + e); `--fraction`,
`--perturb` and `--resample` are the PBT step's rule (`common/pbt.py`):

    python benchmarks/sweep.py --algo ppo --env-id Breakout-MinAtar --variant mlp5e6 \
        --pbt learning_rate=1e-4:1e-2:log ent_coef=1e-3:1e-1:log --population 8 --interval 10 \
        --grid learning_rate=3e-4,1e-3,3e-3,1e-2 ent_coef=3e-3,3e-2 --experiments 3

Each experiment also trains, with `--baseline`, the PBT population without its steps
(`jit(vmap(train))` over the same keys and initial hyperparameters: a random search); the two
programs then run `--runs` - 1 times more each (3 in all by default), alternating, and their
train times are the medians: what PBT's steps add. Writes `<algo>__<env>__<tag>.json` with
each program's compile and train seconds, every run's final return, PBT's lineage and the
curves.
"""
import argparse
import dataclasses
import importlib
import itertools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import (check_overrides, library_versions, parse_overrides,  # noqa: E402
                                save_record, settings, source_commit, thin_curves)
from common import pbt  # noqa: E402
from common.host.logger import final_return, seed_keys  # noqa: E402
from common.host.options import search_ranges, whole_number  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402


def parse_grid(items, fields):
    """`["lr=1e-3,3e-4", "gamma=0.99"]` -> {"lr": [1e-3, 3e-4], "gamma": [0.99]}; every field
    must be one of `fields` (the algorithm's float hyperparameters)."""
    grid = {}
    for item in items:
        field, sep, values = item.partition("=")
        if not sep or field not in fields:
            raise SystemExit(f"error: --grid takes FIELD=V1,V2,... with FIELD one of "
                             f"{', '.join(fields)}; got {item!r}.")
        grid[field] = [float(v) for v in values.split(",")]
    return grid


def parse_ranges(items, fields):
    """`["learning_rate=1e-4:1e-2:log", "ent_coef=0:0.05"]` -> a tuple of `pbt.Range`, read
    as the command line's `--pbt-search` reads them (`options.search_ranges`)."""
    try:
        ranges = search_ranges(items)
    except ValueError as e:
        raise SystemExit(f"error: {str(e).replace('--pbt-search', '--pbt', 1)}") from None
    for name, *_ in ranges:
        if name not in fields:
            raise SystemExit(f"error: --pbt {name!r} is not one of {', '.join(fields)}.")
    return tuple(pbt.Range(*r) for r in ranges)


def timed(fn, *args):
    """`(outputs as NumPy, compile_s, train_s, run)` of `jax.jit(fn)(*args)`; `run()` times
    the compiled program again."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start

    def run():
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        return out, time.perf_counter() - start

    out, train_s = run()
    return jax.tree.map(np.asarray, out), compile_s, train_s, lambda: run()[1]


def run_pbt_experiment(train, config, space, grid: dict, key, baseline: bool, runs: int = 3):
    """One experiment: PBT from `key`, the grid's points (none: no grid) with the members'
    keys (point i takes member i's key, cycling; the same for every `space.interval`), and
    with `baseline` the PBT population without its steps, both timed `runs` times in
    alternation (train_s: the median; train_runs_s: each). Returns a dict of NumPy results
    and timings."""
    pbt_train = pbt.make_pbt_train(train, config.num_updates, space)
    member_keys, key_hparams, _ = pbt.population_keys(key, space.population)
    start_hparams = pbt.initial_hparams(key_hparams, config.hparams(), space)
    (states, metrics, lineage), compile_s, train_s, again = timed(pbt_train, key)
    out = {"pbt": dict(metrics=metrics, lineage=lineage, compile_s=compile_s, train_s=train_s,
                       start_hparams=jax.tree.map(np.asarray, start_hparams))}
    if baseline:  # then each program runs - 1 times more, alternating: the medians
        (_, metrics), compile_s, train_s, base_again = timed(jax.vmap(train), member_keys,
                                                             start_hparams)
        times = [[out["pbt"]["train_s"]], [train_s]]
        for _ in range(runs - 1):
            times[0].append(again())
            times[1].append(base_again())
        out["pbt"].update(train_s=float(np.median(times[0])), train_runs_s=times[0])
        out["baseline"] = dict(metrics=metrics, compile_s=compile_s, train_runs_s=times[1],
                               train_s=float(np.median(times[1])))
    if not grid:
        return out
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    base = config.hparams()
    grid_hparams = jax.tree.map(lambda *xs: jnp.stack(xs), *[
        base._replace(**{k: jnp.float32(v) for k, v in p.items()}) for p in points])
    grid_keys = member_keys[jnp.arange(len(points)) % space.population]
    (_, metrics), compile_s, train_s, _ = timed(jax.vmap(train), grid_keys, grid_hparams)
    out["grid"] = dict(metrics=metrics, points=points, compile_s=compile_s, train_s=train_s)
    return out


def pbt_main(args, module, config, grid):
    """`--pbt`: PBT against the grid, `--experiments` times; prints and saves the record."""
    fields = [f for f in module.HParams._fields]
    try:
        space = pbt.SearchSpace(parse_ranges(args.pbt, fields), args.population, args.interval,
                                fraction=args.fraction, perturb=args.perturb,
                                resample=args.resample)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    if config.num_updates % space.interval:
        raise SystemExit(f"error: --interval {space.interval} does not divide the run's "
                         f"{config.num_updates} updates.")
    train = module.make_train(config)
    record, summary = {"experiments": []}, []
    for e in range(args.experiments):
        result = run_pbt_experiment(train, config, space, grid,
                                    jax.random.PRNGKey(args.seed + e), args.baseline,
                                    args.runs)
        row = {}
        for name, part in result.items():
            final = final_return(part["metrics"]["episodic_return"])
            row[name] = dict(final_return=np.round(final, 2).tolist(),
                             best=round(float(np.nanmax(final)), 2),
                             median=round(float(np.nanmedian(final)), 2),
                             compile_s=round(part["compile_s"], 2),
                             train_s=round(part["train_s"], 2),
                             **({"train_runs_s": np.round(part["train_runs_s"], 2).tolist()}
                                if "train_runs_s" in part else {}))
            print(f"experiment {e} {name:8s}: best {row[name]['best']:.2f}, median "
                  f"{row[name]['median']:.2f} | compile {part['compile_s']:.1f}s, train "
                  f"{part['train_s']:.1f}s | " + " ".join(f"{x:.1f}" for x in final), flush=True)
        lineage = result["pbt"]["lineage"]
        row["lineage"] = dict(source=lineage.source.tolist(), score=np.round(
            lineage.score, 3).tolist(), hparams={r.name: np.asarray(getattr(
                lineage.hparams, r.name)).tolist() for r in space.ranges},
            start={r.name: np.asarray(getattr(result["pbt"]["start_hparams"], r.name)).tolist()
                   for r in space.ranges})
        step, curves, every = thin_curves(
            np.asarray(result["pbt"]["metrics"]["global_step"])[0].tolist(),
            np.stack([result[n]["metrics"]["episodic_return"] for n in result]))
        row["curves"] = dict(names=list(result), global_step=step, updates_per_point=every,
                             episodic_return=np.round(curves, 2).tolist())
        record["experiments"].append(row)
        summary.append(row)
    if grid:
        wins = [(r["pbt"]["best"] >= r["grid"]["best"],
                 r["pbt"]["median"] > r["grid"]["median"]) for r in summary]
        print(f"PBT best >= grid best in {sum(w[0] for w in wins)} of {len(wins)}; PBT median "
              f"> grid median in {sum(w[1] for w in wins)} of {len(wins)}")
    if args.baseline:
        ratios = [r["pbt"]["train_s"] / r["baseline"]["train_s"] for r in summary]
        print("PBT train time / the same population without PBT: "
              + " ".join(f"{x:.3f}" for x in ratios))
    record.update({
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "commit": source_commit(), "versions": library_versions(),
        "config": dataclasses.asdict(config), "grid": grid,
        "pbt": dict(ranges=[r._asdict() for r in space.ranges], population=space.population,
                    interval=space.interval, fraction=space.fraction, perturb=space.perturb,
                    resample=space.resample),
        "seeds": [args.seed + e for e in range(args.experiments)]})
    path = save_record(record, args.out_dir, f"{args.algo}__{args.env_id}__{args.tag}")
    print("saved", os.path.relpath(path, ROOT))


def run_grid(module, config, grid: dict, seeds: int, seed: int = 1):
    """Train `seeds` runs at every point of `grid` ({field: [values]}, Cartesian product) in
    one `jit(vmap(train))`. Run `i * seeds + j` is point i with seed `seed + j`.
    Returns `(points, metrics, compile_s, train_s)`, metrics [points * seeds, num_updates]."""
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    base = config.hparams()
    hparams = jax.tree.map(lambda *xs: jnp.repeat(jnp.stack(xs), seeds, axis=0),
                           *[base._replace(**{k: jnp.float32(v) for k, v in p.items()})
                             for p in points])
    keys = jnp.tile(jnp.asarray(seed_keys(seed, seeds)), (len(points), 1))
    (_, metrics), compile_s, train_s, _ = timed(jax.vmap(module.make_train(config)), keys,
                                                hparams)
    return points, metrics, compile_s, train_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "impala"])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=whole_number, default=None)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="structural Config overrides, e.g. --set num_envs=64")
    parser.add_argument("--grid", nargs="+", default=[], metavar="FIELD=V1,V2",
                        help="float hyperparameters to sweep (the Cartesian product is run)")
    parser.add_argument("--variant", default="", help="a benchmarks/configs.py VARIANTS entry")
    parser.add_argument("--pbt", nargs="+", default=None, metavar="FIELD=LOW:HIGH[:log]",
                        help="PBT against the grid over these ranges (module docstring)")
    parser.add_argument("--population", type=int, default=8, help="--pbt: members")
    parser.add_argument("--interval", type=int, default=10, help="--pbt: updates per step")
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="--pbt: share of the population replaced (and copied from)")
    parser.add_argument("--perturb", type=float, default=0.2,
                        help="--pbt: f, a copied value times 1 + U(-f, f)")
    parser.add_argument("--resample", type=float, default=0.0,
                        help="--pbt: probability a copied value is redrawn from its range")
    parser.add_argument("--experiments", type=int, default=1, help="--pbt: repetitions")
    parser.add_argument("--baseline", action="store_true",
                        help="--pbt: also the population without PBT (the time PBT adds)")
    parser.add_argument("--runs", type=int, default=None,
                        help="--baseline: timed runs of each program, alternating (median; "
                        "default 3)")
    parser.add_argument("--tag", default="sweep", help="suffix of the results file name")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results",
                                                          "sweeps"))
    args = parser.parse_args()
    if args.runs is not None and not args.baseline:
        raise SystemExit("error: --runs times --baseline's two programs; add --baseline.")
    args.runs = 3 if args.runs is None else args.runs
    if args.runs < 1:
        raise SystemExit(f"error: --runs must be at least 1, got {args.runs}.")

    module = importlib.import_module(f"algos.{args.algo}")
    grid = parse_grid(args.grid, module.HParams._fields)
    if not grid and not args.pbt:
        raise SystemExit("error: --grid FIELD=V1,V2 ... is required (optional with --pbt).")
    overrides = parse_overrides(args.set)
    args.total_timesteps = check_overrides(args.algo, module.Config, overrides,
                                           args.total_timesteps)
    cell = {**settings(args.algo, args.env_id, args.variant), **overrides}
    if args.total_timesteps is not None:
        cell["total_timesteps"] = args.total_timesteps
    try:
        config = module.Config(env_id=args.env_id, **cell)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    unroll_threefry_on_cpu()
    if args.pbt:
        return pbt_main(args, module, config, grid)
    points, metrics, compile_s, train_s = run_grid(module, config, grid, args.seeds, args.seed)
    returns = np.asarray(metrics["episodic_return"]).reshape(len(points), args.seeds, -1)
    final = final_return(returns)
    # The policy's entropy over the same last 10% of updates: a collapse shows up here first.
    entropy = final_return(np.asarray(metrics["entropy"]).reshape(len(points), args.seeds, -1))
    steps = config.num_updates * config.batch_size
    print(f"{args.algo} {args.env_id}: {len(points)} points x {args.seeds} seeds x "
          f"{steps:,} steps | compile {compile_s:.1f}s, train {train_s:.1f}s, "
          f"{steps * len(points) * args.seeds / train_s:,.0f} SPS (all runs)")
    for point, row, ent in zip(points, final, entropy):
        label = " ".join(f"{k}={v:g}" for k, v in point.items())
        print(f"  {label}: mean {row.mean():.2f}, min {row.min():.2f} | per seed "
              + " ".join(f"{x:.1f}" for x in row) + f" | entropy {ent.mean():.2f}")

    global_step, curves, every = thin_curves(np.asarray(metrics["global_step"])[0].tolist(),
                                             returns)
    record = {
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "commit": source_commit(),
        "versions": library_versions(),
        "config": dataclasses.asdict(config), "grid": grid, "points": points,
        "seeds": [args.seed + i for i in range(args.seeds)],
        "compile_s": round(compile_s, 2), "train_s": round(train_s, 2),
        "updates_per_point": every,
        "global_step": global_step,
        "episodic_return": np.round(curves, 2).tolist(),
        "final_return": np.round(final, 2).tolist(),
        "final_entropy": np.round(entropy, 3).tolist(),
    }
    path = save_record(record, args.out_dir, f"{args.algo}__{args.env_id}__{args.tag}")
    print("saved", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
