"""Where XLA:CPU would hand work to its thread pool in one compiled train function.

    python benchmarks/cpu_executor.py --algo ppo --env-id CartPole-v1

XLA:CPU runs each compiled body (the program, and every loop body once per iteration) as a
graph of kernels, "thunks", on the calling thread, in first-in first-out order of readiness;
whenever, after taking one, more than 8 others are ready, it hands half of them to its thread
pool (`ThunkExecutor::Execute` and `SplitReadyQueue` in XLA's `thunk_executor.cc`). On a small
program that hand-off costs more than the work it shares.

This script compiles one seed's `train` in a subprocess with XLA's logging of every executor's
graph switched on (`TF_CPP_VMODULE=thunk_executor=9`), replays each graph one kernel at a time
in that order, and prints, per graph: its kernels, the kernels ready at its start, the most
ready at once, and the first moment more than 8 are ready (the first hand-off). The
replay is of the rules, not a measurement: it assumes every kernel finishes before the next
starts, which is what happens until the first hand-off. XLA's log cuts a message off at about
15,000 characters, so for a graph of more than about 100 kernels only the first ones can be
replayed (the output says so); `getrusage`'s voluntary context switches per update (about one
per hand-off to a sleeping thread) measure the rest.
"""

import argparse
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLIT_THRESHOLD = 8

COMPILE = """
import importlib, sys
sys.path.insert(0, {root!r})
import jax
from common.host.prng import unroll_threefry_on_cpu
unroll_threefry_on_cpu()
module = importlib.import_module("algos.{algo}")
config = module.Config(env_id={env_id!r})
train = module.make_train(config)
if {seeds}:  # jit(vmap(train)) over that many seeds
    jax.jit(jax.vmap(train)).lower(jax.random.split(jax.random.PRNGKey(0), {seeds})).compile()
else:
    jax.jit(train).lower(jax.random.PRNGKey(0)).compile()
"""


def graphs(log: str):
    """Parse the logged executor graphs: a list of (names, dependencies) per executor."""
    out = []
    for block in re.split(r"\nThunkExecutor: ", log)[1:]:
        rows = re.findall(r"thunk #(\d+): op_name=(\S+), kind=\S+, dependencies=\[(.*?)\]", block)
        index = {name: int(i) for i, name, _ in rows}
        deps = [sorted({index[d.strip()] for d in ds.split(",") if d.strip()}) for _, _, ds in rows]
        total = int(re.match(r"#thunks=(\d+)", block).group(1))
        out.append(([name for _, name, _ in rows], deps, total))
    return out


def replay(names, deps):
    """Run the graph in XLA's order on one thread: (sources, most ready, first split or None)."""
    waiting = [len(d) for d in deps]
    users = [[] for _ in names]
    for node, ds in enumerate(deps):
        for d in ds:
            users[d].append(node)
    ready = collections.deque(i for i, w in enumerate(waiting) if w == 0)
    sources, most, first_split, taken = len(ready), 0, None, 0
    while ready:
        node = ready.popleft()
        taken += 1
        most = max(most, len(ready))
        if len(ready) > SPLIT_THRESHOLD and first_split is None:
            first_split = (taken, names[node], len(ready))
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return sources, most, first_split


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="ppo", choices=("ppo", "a2c", "impala"))
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=0,
                        help="compile jit(vmap(train)) over this many seeds (0: jit(train))")
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "thunk_executor=9",
           "JAX_PLATFORMS": "cpu"}
    code = COMPILE.format(root=ROOT, algo=args.algo, env_id=args.env_id, seeds=args.seeds)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"compiling failed:\n{run.stderr[-3000:]}")
    found = [g for g in graphs(run.stderr) if g[2] > SPLIT_THRESHOLD]
    if not found:
        sys.exit("no executor graphs in XLA's log: this jaxlib may not log them "
                 "(TF_CPP_VMODULE=thunk_executor=9).")
    what = f"jit(vmap(train)), {args.seeds} seeds" if args.seeds else "jit(train)"
    print(f"{args.algo} {args.env_id}, {what}: "
          f"executor graphs with more than {SPLIT_THRESHOLD} kernels")
    print(f"{'kernels':>8} {'ready at start':>15} {'most ready':>11}  first hand-off")
    for names, deps, total in found:
        sources, most, split = replay(names, deps)
        where = ("none" if split is None
                 else f"after kernel {split[0]} ({split[1]}), {split[2]} ready")
        if len(names) < total and split is None:  # XLA's log cut the graph off
            where = f"none in the first {len(names)} (the log holds only those)"
        print(f"{total:>8} {sources:>15} {most:>11}  {where}")


if __name__ == "__main__":
    main()
