"""Scaling benchmark: the command line on 1, 2 and 4 devices or processes, both ways of spreading.

    python benchmarks/scaling.py                 # both tables (a few minutes on 2 cores)
    python benchmarks/scaling.py --only seeds    # just the independent-seeds table
    python benchmarks/scaling.py --only start-to-exit --repeats 4   # 32 seeds, whole command

Every row runs `algos/ppo.py` itself, as a user would, in fresh subprocesses (`--repeats` times;
the median SPS is reported, compilation excluded: the CLI's own "done:" line measures training
time only, and the persistent compilation cache makes repeats skip compiling):

- `seeds`: `--num-seeds 32`, PPO CartPole. "1 core" pins the process to core 0 with `taskset`
  (one XLA device), once with XLA's default thread pool and once with `NPROC=1`; the better of
  the two is the single-core baseline. Then 2 and 4 XLA CPU devices in one process
  (`--num-devices`, the CLI's default is one per core), and 2 processes pinned one per core
  with `jax.distributed` on 127.0.0.1.
- `data`: one agent per seed, data-parallel (`--parallel data`), 4 seeds x 32 envs: the same
  global batch on 1, 2, 4 devices and on 2 processes; the final returns should agree within
  seed noise (the runs differ because each device draws its own environment keys).
- `start-to-exit`: `python algos/ppo.py --num-seeds 32` with its default budget (5e5 steps per
  seed), the whole command's wall time from start to exit, pinned to core 0 against free to
  use every core (the default layout), in alternating pairs after one run of each that fills
  the compilation cache (reported too, as the cold pair): the throughput ratio is
  pinned wall / free wall.

Raw rows (commands, every repeat's SPS and final returns) go to
`benchmarks/results/scaling__ppo__CartPole-v1[__seeds|__data|__start_to_exit].json`, with the
commit that made them.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import source_commit, summary_figures  # noqa: E402
from common.host.options import whole_number  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(args, processes: int = 1, pin: bool = False, env_extra=None, timeout=900):
    """Run the PPO CLI (in `processes` coordinated processes); `(SPS, final mean, final min,
    wall seconds)`: the first three from process 0's summary line, the last from start to
    the exit of every process."""
    env = {**os.environ, **(env_extra or {})}
    log_dir = tempfile.mkdtemp(prefix="scaling-")
    base = [sys.executable, "algos/ppo.py", *args, "--log-dir", log_dir]
    if processes == 1:
        commands = [(["taskset", "-c", "0"] if pin else []) + base]
    else:
        address = f"127.0.0.1:{free_port()}"
        commands = [(["taskset", "-c", str(i % os.cpu_count())] if pin else []) + base + [
            "--coordinator-address", address, "--num-processes", str(processes),
            "--process-id", str(i)] for i in range(processes)]
    start = time.perf_counter()
    runs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for c in commands]
    outs = [r.communicate(timeout=timeout) for r in runs]
    wall = time.perf_counter() - start
    for r, (out, err) in zip(runs, outs):
        if r.returncode != 0:
            raise RuntimeError(f"{commands} failed ({r.returncode}):\n{err[-3000:]}")
    figures = summary_figures(outs[0][0])
    return figures["sps"], figures["mean"], figures["min"], wall


def start_to_exit(repeats: int) -> list[dict]:
    """The default 32-seed command pinned to one core and free, alternating (see the module
    docstring); one row per pair, the first the cold pair."""
    args, rows = ["--num-seeds", "32"], []
    cache = {"ONPOLICY_JAX_CACHE": tempfile.mkdtemp(prefix="scaling-cache-")}  # empty: cold
    print(f"start to exit: python algos/ppo.py --num-seeds 32, pinned to core 0 and free, "
          f"1 cold pair and {repeats} warm pairs")
    for i in range(repeats + 1):
        pinned, free = run_once(args, pin=True, env_extra=cache), run_once(args, env_extra=cache)
        rows.append({"pair": "cold" if i == 0 else "warm", "pinned_wall_s": pinned[3],
                     "free_wall_s": free[3], "pinned_sps": pinned[0], "free_sps": free[0],
                     "ratio": pinned[3] / free[3], "final_mean": free[1]})
        print(f"  {rows[-1]['pair']}: pinned {pinned[3]:6.1f} s ({pinned[0]:,.0f} SPS), free "
              f"{free[3]:6.1f} s ({free[0]:,.0f} SPS): {rows[-1]['ratio']:.2f}x", flush=True)
    warm = rows[1:]
    if warm:
        pinned = statistics.median(r["pinned_wall_s"] for r in warm)
        free = statistics.median(r["free_wall_s"] for r in warm)
        print(f"  warm medians: pinned {pinned:.1f} s, free {free:.1f} s: {pinned / free:.2f}x")
    return rows


def measure(name, args, repeats, **kwargs):
    results = [run_once(args, **kwargs) for _ in range(repeats)]
    sps = [r[0] for r in results]
    row = {"setup": name, "args": args, **{k: v for k, v in kwargs.items() if k != "env_extra"},
           "env": kwargs.get("env_extra") or {}, "sps_runs": sps,
           "sps": statistics.median(sps), "final_mean": results[-1][1],
           "final_min": results[-1][2]}
    print(f"  {name:<44} {row['sps']:>12,.0f} SPS   final return mean {row['final_mean']:7.2f} "
          f"min {row['final_min']:7.2f}   ({', '.join(f'{s:,.0f}' for s in sps)})", flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["seeds", "data", "start-to-exit"], default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--total-timesteps", type=whole_number, default=100_000,
                        help="steps per seed (seeds table)")
    args = parser.parse_args()
    os.environ.setdefault("ONPOLICY_JAX_CACHE", os.path.join(tempfile.gettempdir(),
                                                             "onpolicy-jax-scaling-cache"))
    # Every row sets its own devices; an inherited forced device count would override them.
    os.environ.pop("XLA_FLAGS", None)
    rows = []
    if args.only == "start-to-exit":
        rows = start_to_exit(args.repeats)
    if args.only in (None, "seeds"):
        seeds = ["--num-seeds", "32", "--total-timesteps", str(args.total_timesteps)]
        print(f"independent seeds: PPO CartPole, 32 seeds x {args.total_timesteps:,} steps, "
              f"median of {args.repeats}")
        rows.append(measure("1 core (taskset -c 0), 1 device", seeds + ["--num-devices", "1"],
                            args.repeats, pin=True))
        rows.append(measure("1 core (taskset -c 0), 1 device, NPROC=1",
                            seeds + ["--num-devices", "1"], args.repeats, pin=True,
                            env_extra={"NPROC": "1"}))
        for devices in (2, 4):
            rows.append(measure(f"{devices} devices, 1 process", seeds + ["--num-devices",
                                                                          str(devices)],
                                args.repeats))
        rows.append(measure("2 processes x 1 device, pinned", seeds, args.repeats,
                            processes=2, pin=True))
        base = max(r["sps"] for r in rows[:2])
        for r in rows:
            r["speedup_vs_1_core"] = r["sps"] / base
        print("  speed-up over the better single-core row: " + ", ".join(
            f"{r['setup']}: {r['speedup_vs_1_core']:.2f}x" for r in rows[2:]))
    if args.only in (None, "data"):
        data = ["--parallel", "data", "--num-seeds", "4", "--num-envs", "32",
                "--total-timesteps", "200000"]
        print("data-parallel: PPO CartPole, 4 seeds x 32 envs (global batch), 200,000 steps, "
              f"median of {args.repeats}")
        first = len(rows)
        for devices in (1, 2, 4):
            rows.append(measure(f"data-parallel, {devices} device(s)",
                                data + ["--num-devices", str(devices)], args.repeats))
        rows.append(measure("data-parallel, 2 processes x 1 device, pinned", data,
                            args.repeats, processes=2, pin=True))
        for r in rows[first:]:
            r["speedup_vs_1_device"] = r["sps"] / rows[first]["sps"]
    suffix = f"__{args.only.replace('-', '_')}" if args.only else ""
    path = os.path.join(ROOT, "benchmarks", "results", f"scaling__ppo__CartPole-v1{suffix}.json")
    with open(path, "w") as f:
        json.dump({"command": " ".join(["python", *sys.argv]), "commit": source_commit(),
                   "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    print(f"raw rows: {path}")


if __name__ == "__main__":
    main()
