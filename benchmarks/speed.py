"""Speed benchmark: SPS, compile time and peak memory as the number of vmapped seeds grows.

    python benchmarks/speed.py --algo ppo --env-id CartPole-v1 --seeds 1 8 32

Each seed count runs in a fresh subprocess (so peak resident memory is that row's own): it
compiles `jit(vmap(train))`, then times `--repeats` full runs and reports the median
steady-state SPS (all seeds together, and per seed). Raw rows go to
`benchmarks/results/speed__{algo}__{env_id}.json`.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(algo, env_id, seeds, repeats, total_timesteps, num_envs):
    import importlib

    import jax

    sys.path.insert(0, ROOT)
    from benchmarks.configs import CONFIGS
    from common.logger import seed_keys

    module = importlib.import_module(f"algos.{algo}")
    settings = {**CONFIGS.get((algo, env_id), {})}
    if total_timesteps:
        settings["total_timesteps"] = total_timesteps
    if num_envs:
        settings["num_envs"] = num_envs
    config = module.Config(env_id=env_id, **settings)
    keys = seed_keys(1, seeds)
    start = time.perf_counter()
    train = jax.jit(jax.vmap(module.make_train(config))).lower(keys).compile()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(train(keys))
        times.append(time.perf_counter() - start)
    steps = config.num_updates * config.batch_size * seeds
    return {"seeds": seeds, "num_envs": config.num_envs, "steps": steps,
            "compile_s": compile_s, "times_s": times,
            "sps": steps / statistics.median(times),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=int, default=None)
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument("--row", type=int, help=argparse.SUPPRESS)  # internal: one subprocess
    args = parser.parse_args()

    if args.row is not None:
        print(json.dumps(measure(args.algo, args.env_id, args.row, args.repeats,
                                 args.total_timesteps, args.num_envs)))
        return
    rows = []
    print(f"{args.algo} {args.env_id}: median of {args.repeats} runs after compilation")
    print(f"{'seeds':>6} {'steps':>12} {'compile s':>10} {'SPS (all)':>12} {'SPS/seed':>10} "
          f"{'peak RSS MiB':>13}")
    for seeds in args.seeds:
        cmd = [sys.executable, __file__, "--algo", args.algo, "--env-id", args.env_id,
               "--row", str(seeds), "--repeats", str(args.repeats)]
        if args.total_timesteps:
            cmd += ["--total-timesteps", str(args.total_timesteps)]
        if args.num_envs:
            cmd += ["--num-envs", str(args.num_envs)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(f"{seeds:>6} {row['steps']:>12,} {row['compile_s']:>10.2f} {row['sps']:>12,.0f} "
              f"{row['sps'] / seeds:>10,.0f} {row['peak_rss_mib']:>13,.0f}", flush=True)
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results",
                           f"speed__{args.algo}__{args.env_id}.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
