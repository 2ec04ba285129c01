"""Side-by-side speed of one algorithm in this checkout and in another git revision.

    python benchmarks/vs_revision.py --rev HEAD~3 --algo ppo --seeds 8 --repeats 7
    taskset -c 1 python benchmarks/vs_revision.py --rev main --seeds 32 --total-timesteps 50000
    python benchmarks/vs_revision.py --rev HEAD~1 --set network=gru --set hidden_size=128
    python benchmarks/vs_revision.py --tree /tmp/old --rev abc1234   # no git history here

"Measure before and after, side by side, in one sitting": the revision's `algos/` and `common/`
are extracted with `git archive` into a temporary folder, and both versions of
`make_train(Config(env_id=..., total_timesteps=..., **overrides))` (`--set`; each revision's
own `Config` defaults otherwise, no presets) are compiled in this one process as
`jit(vmap(train))` over the same keys, run once each untimed, then timed in alternation (this
checkout, the revision, this checkout, ...) so that machine noise hits both alike. Both run
with the Threefry lowering the command line selects on a CPU (`common/host/prng.py`). Prints
compile times, the median SPS of each, the ratio of the medians and the final returns, plus
whether the two StableHLO programs are byte-identical (then the ratio measures only noise) and
which `Config` fields the two revisions' defaults set differently (then it is not the same
config). Saves the raw timings as JSON with this checkout's commit (and whether its `algos/` or
`common/` differ from it) and the revision's.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import (check_overrides, parse_overrides, source_commit,  # noqa: E402
                                time_in_alternation)
from common.host.logger import final_return  # noqa: E402
from common.host.options import whole_number  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402

PACKAGES = ("algos", "common")


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


@contextlib.contextmanager
def other_tree(root: str):
    """Inside the block, `import algos.X` and `common.X` load from `root`; afterwards the
    modules loaded from there leave `sys.modules` and this checkout's come back (objects made
    inside the block keep working: they hold their own modules)."""
    saved = {name: module for name, module in sys.modules.items() if _ours(name)}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        yield
    finally:
        sys.path.remove(root)
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


def extract(rev: str, into: str) -> str:
    """The full commit of `rev`, with its `algos/` and `common/` written under `into`."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise ValueError(f"--rev {rev!r} is not a commit of this repository")
    archive = subprocess.run(["git", "archive", commit.stdout.strip(), *PACKAGES], cwd=ROOT,
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return commit.stdout.strip()


def build(algo: str, env_id: str, total_timesteps: int, overrides: dict):
    """`(train, config)` of `algos.<algo>` as currently importable."""
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id=env_id, total_timesteps=total_timesteps, **overrides)
    return module.make_train(config), config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="the git revision to compare against")
    parser.add_argument("--tree", help="instead of extracting --rev: a folder already holding "
                        "the other version's algos/ and common/ (`git archive REV algos common "
                        "| tar -x -C DIR`), for a machine without this repository's history; "
                        "--rev, if given, only names it")
    parser.add_argument("--algo", choices=("ppo", "a2c", "impala"), default="ppo")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--total-timesteps", type=whole_number, default=None,
                        help="steps per seed (default 100000)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a Config field for both revisions (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None,
                        help="default: benchmarks/results/vs_revision__ALGO__seedsN.json")
    args = parser.parse_args()
    if args.seeds < 1 or args.repeats < 1:
        parser.error("--seeds and --repeats must be at least 1")
    if args.rev is None and args.tree is None:
        parser.error("give --rev (a git revision) or --tree (a folder with its algos/, common/)")
    if args.tree is not None and not all(os.path.isdir(os.path.join(args.tree, p))
                                         for p in PACKAGES):
        parser.error(f"--tree {args.tree!r} must hold the folders algos/ and common/")
    overrides = parse_overrides(args.set)
    config_cls = importlib.import_module(f"algos.{args.algo}").Config
    total = check_overrides(args.algo, config_cls, overrides, args.total_timesteps)
    args.total_timesteps = 100_000 if total is None else total
    out = args.out or f"benchmarks/results/vs_revision__{args.algo}__seeds{args.seeds}.json"

    unroll_threefry_on_cpu()  # process-wide: both versions compile with it
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    runners, compiled, compile_s, program = {}, {}, {}, {}

    def add(name):  # traced and compiled while `name`'s tree is the one imported
        try:
            runners[name] = build(args.algo, args.env_id, args.total_timesteps, overrides)
        except (TypeError, ValueError) as error:  # a bad value, or a field `name` lacks
            parser.error(f"{name}'s Config: {error}")
        train = runners[name][0]
        start = time.perf_counter()
        lowered = jax.jit(jax.vmap(train)).lower(keys)
        compiled[name] = lowered.compile()
        compile_s[name] = time.perf_counter() - start
        program[name] = hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]
        print(f"compiled {name} in {compile_s[name]:.1f}s (StableHLO {program[name]})",
              flush=True)

    with tempfile.TemporaryDirectory(prefix="vs-revision-") as tmp:
        if args.tree is not None:
            tmp, rev_commit = args.tree, args.rev or "tree"
        else:
            try:  # first: a bad --rev stops before anything compiles
                rev_commit = extract(args.rev, tmp)
            except ValueError as error:
                parser.error(str(error))
        add("this checkout")
        with other_tree(tmp):
            add(f"rev {rev_commit[:10]}")

    mine, theirs = list(runners)
    fields = [dataclasses.asdict(runners[name][1]) for name in (mine, theirs)]
    differ = sorted(k for k in fields[0].keys() | fields[1].keys()
                    if fields[0].get(k, "absent") != fields[1].get(k, "absent"))
    if differ:  # each revision's own defaults: not the same config
        print(f"note: the two Configs differ in {', '.join(differ)}", flush=True)
    sizes = {name: c.num_updates * c.batch_size * args.seeds for name, (_, c) in runners.items()}
    sps, outputs = time_in_alternation(compiled, (keys,), sizes, args.repeats)
    returns = {name: final_return(out[1]["episodic_return"]) for name, out in outputs.items()}

    median = {name: statistics.median(v) for name, v in sps.items()}
    identical = program[mine] == program[theirs]
    print(f"\n{args.algo} {args.env_id}, {args.seeds} seed(s) x {args.total_timesteps:,} steps, "
          f"medians of {args.repeats}:")
    for name in runners:
        print(f"  {name:>18}: {median[name]:>12,.0f} SPS, compile {compile_s[name]:.1f}s, "
              f"final return {float(returns[name].mean()):.1f}")
    print(f"  ratio: {median[mine] / median[theirs]:.3f}"
          + (" (the two programs are byte-identical: this is noise)" if identical else ""))
    modified = subprocess.run(["git", "status", "--porcelain", *PACKAGES], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() != ""
    record = dict(commit=source_commit(), checkout_modified=modified, rev=args.rev,
                  tree=args.tree,
                  rev_commit=rev_commit, algo=args.algo, env_id=args.env_id, overrides=overrides,
                  seeds=args.seeds,
                  total_timesteps=args.total_timesteps, repeats=args.repeats,
                  cpus=os.cpu_count(), device=str(jax.devices()[0]),
                  identical_programs=identical, config_fields_differing=differ,
                  ratio=median[mine] / median[theirs],
                  runs={name: dict(sps=sps[name], median_sps=median[name],
                                   compile_s=compile_s[name], stablehlo=program[name],
                                   final_return=float(returns[name].mean()))
                        for name in runners})
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
