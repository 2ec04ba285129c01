"""Every algorithm on every Brax task: a few updates each, to show that all of them run.

    python benchmarks/brax_all.py                      # ppo, a2c, impala x the presets' tasks
    python benchmarks/brax_all.py --algos ppo --envs brax/ant --backend spring

For each (algorithm, task) it builds the algorithm's `Config` with small sizes (8 envs x 8
steps, `--updates` updates, normalised observations and rewards) and the chosen physics
pipeline, compiles `jit(train)`, runs it, and checks that the last update's losses and entropy
are finite and that the parameters are not all zero. Prints one line per pair (compile and run
time, the last update's losses) and exits non-zero if any pair fails. Nothing is saved: this
is a check, not a result.
"""

import argparse
import importlib
import os
import sys
import time

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402
from common.presets import BRAX  # noqa: E402

SMALL = {"ppo": dict(num_minibatches=2, update_epochs=2), "a2c": {}, "impala": {}}
"""Per-algorithm sizes that fit 8 envs x 8 steps."""


def check(algo: str, env_id: str, backend: str, updates: int) -> str:
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id=env_id, brax_backend=backend, num_envs=8, num_steps=8,
                           total_timesteps=updates * 64, normalize_obs=True,
                           normalize_reward=True, **SMALL[algo])
    key = jax.random.PRNGKey(0)
    start = time.perf_counter()
    train = jax.jit(module.make_train(config)).lower(key).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(train(key))
    run_s = time.perf_counter() - start
    losses = {k: float(np.asarray(v)[-1]) for k, v in metrics.items()
              if k.endswith("loss") or k == "entropy"}
    bad = [k for k, v in losses.items() if not np.isfinite(v)]
    leaves = jax.tree.leaves(state.params)
    if not any(np.any(np.asarray(x) != 0) for x in leaves) or bad:
        raise RuntimeError(f"non-finite losses {bad}" if bad else "parameters are all zero")
    shown = ", ".join(f"{k} {v:.3g}" for k, v in losses.items())
    return f"compile {compile_s:5.1f}s, {updates} updates {run_s:5.2f}s | {shown}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c", "impala"])
    parser.add_argument("--envs", nargs="+", default=list(BRAX))
    parser.add_argument("--backend", default="positional")
    parser.add_argument("--updates", type=int, default=3)
    args = parser.parse_args()
    unroll_threefry_on_cpu()  # as the command line does
    failed = []
    for env_id in args.envs:
        for algo in args.algos:
            try:
                line = check(algo, env_id, args.backend, args.updates)
                print(f"{algo:6s} {env_id:24s} ok: {line}", flush=True)
            except Exception as error:  # report every pair, then fail
                failed.append((algo, env_id))
                print(f"{algo:6s} {env_id:24s} FAILED: {type(error).__name__}: {error}",
                      flush=True)
    print(f"{len(args.algos) * len(args.envs) - len(failed)} of "
          f"{len(args.algos) * len(args.envs)} ran", ", failed: " + str(failed) if failed else "")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
