"""Peak memory and speed of the MinAtar CNN: `common.nn.Conv` against `flax.linen.Conv`.

    python benchmarks/cnn_memory.py --seeds 1 4 8

PPO's Breakout-MinAtar preset (64 envs x 128 steps, the CNN torso), `jit(vmap(train))` over
`--seeds` seeds for `--updates` whole updates, once with `common.nn.Conv` (im2col: one matrix
product over the shifted copies of the padded image) and once with `flax.linen.Conv` in its
place (the same parameters and outputs). Every row runs in a fresh subprocess, so its peak
resident memory is its own; the row also gives XLA's own account of the compiled program
(`memory_analysis()`: the temporary buffers, and the arguments and outputs). Prints a table
and writes `benchmarks/results/cnn_memory.json`.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_ID = "Breakout-MinAtar"


def measure(conv: str, seeds: int, updates: int) -> dict:
    import flax.linen as nn
    import jax

    sys.path.insert(0, ROOT)
    import algos.ppo as ppo
    from common.host.logger import seed_keys
    from common.host.prng import unroll_threefry_on_cpu
    from common.presets import preset

    unroll_threefry_on_cpu()  # as the command line does
    if conv == "flax":
        ppo.Conv = nn.Conv  # the network looks the layer up when it is traced
    settings = {k: v for k, v in preset("ppo", ENV_ID).items() if k != "total_timesteps"}
    batch = ppo.Config(env_id=ENV_ID, **settings).batch_size
    config = ppo.Config(env_id=ENV_ID, **settings, total_timesteps=updates * batch)
    keys = seed_keys(1, seeds)
    start = time.perf_counter()
    train = jax.jit(jax.vmap(ppo.make_train(config))).lower(keys).compile()
    compile_s = time.perf_counter() - start
    analysis = train.memory_analysis()
    start = time.perf_counter()
    jax.block_until_ready(train(keys))
    train_s = time.perf_counter() - start
    mib = 1024 * 1024
    return {"conv": conv, "seeds": seeds, "updates": updates, "compile_s": compile_s,
            "train_s": train_s, "sps": updates * batch * seeds / train_s,
            "xla_temp_mib": analysis.temp_size_in_bytes / mib,
            "xla_args_outputs_mib": (analysis.argument_size_in_bytes
                                     + analysis.output_size_in_bytes) / mib,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--updates", type=int, default=1,
                        help="whole updates per run (peak memory is reached in the first)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "cnn_memory.json"))
    parser.add_argument("--row", nargs=2, help=argparse.SUPPRESS)  # internal: CONV SEEDS
    args = parser.parse_args()
    if args.row:
        print(json.dumps(measure(args.row[0], int(args.row[1]), args.updates)))
        return

    sys.path.insert(0, ROOT)
    from benchmarks.configs import source_commit

    print(f"{'conv':>6} {'seeds':>5} {'compile s':>9} {'SPS':>8} {'XLA temp MiB':>12} "
          f"{'args+out MiB':>12} {'peak RSS MiB':>12}")
    rows = []
    for seeds in args.seeds:
        for conv in ("ours", "flax"):
            out = subprocess.run([sys.executable, __file__, "--row", conv, str(seeds),
                                  "--updates", str(args.updates)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{conv:>6} {seeds:>5} {row['compile_s']:>9.1f} {row['sps']:>8,.0f} "
                  f"{row['xla_temp_mib']:>12,.0f} {row['xla_args_outputs_mib']:>12,.0f} "
                  f"{row['peak_rss_mib']:>12,.0f}", flush=True)
    record = {"command": " ".join(["benchmarks/cnn_memory.py", *sys.argv[1:]]),
              "commit": source_commit(), "env_id": ENV_ID, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
