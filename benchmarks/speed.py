"""Speed benchmark: SPS, compile time and peak memory as the work grows.

    python benchmarks/speed.py --algo ppo --env-id CartPole-v1 --seeds 1 8 32 128
    python benchmarks/speed.py --algo ppo --num-envs 4 16 64 256 1024 4096 --updates 8

Every row (one seed count x one `num_envs`) runs in a fresh subprocess, so peak resident
memory is that row's own: it compiles `jit(vmap(train))`, then times `--repeats` full runs and
reports the median steady-state SPS (all seeds together, and per seed). The run length is the
per-environment setting of `benchmarks/configs.py` (plus `--variant`), or `--total-timesteps`,
or `--updates` whole updates of the row's own batch size. Raw rows go to
`benchmarks/results/speed__{algo}__{env_id}[__{variant}].json` (a seeds sweep) or
`speed_envs__...json` (a `num_envs` sweep), with the commit, the JAX version and the CPUs the
rows ran on; `--plot FILE.png` draws SPS against the swept
quantity on log-log axes from every such file given with `--from`.
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


def measure(algo, env_id, seeds, repeats, total_timesteps, num_envs, updates, variant):
    import importlib

    import jax

    sys.path.insert(0, ROOT)
    from benchmarks.configs import settings as cell_settings
    from common.host.logger import seed_keys
    from common.host.prng import unroll_threefry_on_cpu

    unroll_threefry_on_cpu()  # as the command line does: the same random bits, faster on CPU

    module = importlib.import_module(f"algos.{algo}")
    settings = cell_settings(algo, env_id, variant)
    if num_envs:
        settings["num_envs"] = num_envs
    if total_timesteps:
        settings["total_timesteps"] = total_timesteps
    if updates:
        batch = module.Config(env_id=env_id, **{**settings, "total_timesteps": 10**9}).batch_size
        settings["total_timesteps"] = updates * batch
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


def plot(files, out):
    """SPS against seeds or num_envs, log-log, one line per results file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for path in files:
        record = json.load(open(path))
        x_name = record.get("sweep", "seeds")
        rows = record["rows"]
        ax.plot([r[x_name] for r in rows], [r["sps"] for r in rows], "o-",
                label=record.get("label", os.path.basename(path)))
        ax.set_xlabel("parallel environments per run (one seed)" if x_name == "num_envs"
                      else "vmapped seeds")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel("environment steps per second")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


def main():
    sys.path.insert(0, ROOT)
    from common.host.options import whole_number

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "impala"])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="vmapped seeds per row (default: 1 8 32; 1 for a num_envs sweep)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[0],
                        help="environments per run (several: a num_envs sweep; 0: configs.py)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=whole_number, default=None)
    parser.add_argument("--updates", type=int, default=None,
                        help="run this many updates of each row's batch size instead")
    from benchmarks.configs import VARIANTS
    parser.add_argument("--variant", default="", choices=["", *VARIANTS],
                        help="a named VARIANTS entry of configs.py")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--plot", metavar="PNG", help="only draw --from files to this PNG")
    parser.add_argument("--from", dest="files", nargs="*", default=[])
    parser.add_argument("--row", nargs=2, type=int, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()

    if args.plot:
        return plot(args.files, args.plot)
    if args.row is not None:
        print(json.dumps(measure(args.algo, args.env_id, args.row[0], args.repeats,
                                 args.total_timesteps, args.row[1], args.updates,
                                 args.variant)))
        return
    sweep = "num_envs" if len(args.num_envs) > 1 else "seeds"
    if args.seeds is None:
        args.seeds = [1] if sweep == "num_envs" else [1, 8, 32]
    rows = []
    print(f"{args.algo} {args.env_id} {args.variant}: median of {args.repeats} runs after "
          f"compilation")
    print(f"{'seeds':>6} {'num_envs':>9} {'steps':>12} {'compile s':>10} {'SPS (all)':>12} "
          f"{'SPS/seed':>10} {'peak RSS MiB':>13}")
    for seeds in args.seeds:
        for num_envs in args.num_envs:
            cmd = [sys.executable, __file__, "--algo", args.algo, "--env-id", args.env_id,
                   "--row", str(seeds), str(num_envs), "--repeats", str(args.repeats),
                   "--variant", args.variant]
            if args.total_timesteps:
                cmd += ["--total-timesteps", str(args.total_timesteps)]
            if args.updates:
                cmd += ["--updates", str(args.updates)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(f"{seeds:>6} {row['num_envs']:>9} {row['steps']:>12,} {row['compile_s']:>10.2f}"
                  f" {row['sps']:>12,.0f} {row['sps'] / seeds:>10,.0f} "
                  f"{row['peak_rss_mib']:>13,.0f}", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    name = f"speed{'_envs' if sweep == 'num_envs' else ''}__{args.algo}__{args.env_id}" \
           f"{'__' + args.variant if args.variant else ''}.json"
    label = f"{args.algo} {args.env_id}{' ' + args.variant if args.variant else ''}"
    from importlib import metadata

    from benchmarks.configs import source_commit
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump({"command": " ".join(sys.argv), "commit": source_commit(),
                   "jax": metadata.version("jax"), "cpus": len(os.sched_getaffinity(0)),
                   "sweep": sweep, "label": label, "rows": rows}, f, indent=1)
    print(f"saved {os.path.join(args.out_dir, name)}")


if __name__ == "__main__":
    main()
