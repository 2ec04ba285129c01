"""PPO on Brax locomotion with an accelerator, sized to fit one 15-minute device session.

    SOURCE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/gpu_brax.py --out-dir OUT
    python benchmarks/gpu_brax.py --dry-run        # the plumbing, on a CPU, in about a minute

Each task runs the command line, `algos/ppo.py --env-id brax/<task> --num-seeds 4`, with
PureJaxRL's accelerator settings (`PPO_BRAX_ACCELERATOR` in `common/presets.py`: 5e7 steps,
2048 envs x 10 steps, 32 minibatches; Ant with 4096 environments), under a wall-clock limit
that is its share of `--budget` seconds. At its limit a run gets SIGINT, which saves the last
whole chunk of updates as Ctrl-C does, so a run that is slower than hoped still reports how
far it got. The per-update returns of the four seeds then go to
`OUT/ppo__brax-<task>.json`, in the format of `benchmarks/learning.py`'s results, which
`benchmarks/table.py` reads; `train_s` is the wall time from start to stop (compile
included) and `steps` how many steps each seed trained.

The lent machine (Python 3.12, its own jax, flax, optax, numpy and scipy, no network) lacks
Brax, MuJoCo and this project's other dependencies: `bash benchmarks/gpu_deps.sh` builds them
here as one archive to carry (its header says how to unpack it there); the tasks run with this
checkout on `PYTHONPATH`, installed or not. Without Brax the script stops at once with one
line.
"""

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import library_versions, save_record, source_commit  # noqa: E402
from common.presets import PPO_BRAX_ACCELERATOR  # noqa: E402

ACCELERATOR = [word for name in ("num_envs", "num_steps", "num_minibatches", "total_timesteps")
               for word in (f"--{name.replace('_', '-')}", str(PPO_BRAX_ACCELERATOR[name]))]
"""The accelerator preset's sizes as flags, for the tasks whose preset is sized for a CPU
(Hopper); its other settings are the CPU preset's too."""
TASKS = [("brax/ant", ["--num-envs", "4096"], 0.5),
         ("brax/halfcheetah", [], 0.25),
         ("brax/hopper", ACCELERATOR, 0.25)]
"""(task, flags beside its preset, share of the budget)."""
DRY_RUN = [("brax/inverted_pendulum", ["--num-envs", "8", "--num-steps", "8",
                                       "--num-minibatches", "2", "--total-timesteps", "1000000"],
            1.0)]
"""The same plumbing at CPU scale: stopped by its limit long before its budget of steps."""


def run_task(env_id: str, flags: list, limit_s: float, seeds: int, out_dir: str) -> dict:
    """Train `seeds` seeds of PPO on `env_id` from the command line for at most `limit_s`
    seconds; its results record, saved to `out_dir`."""
    from common.host import checkpoint
    from common.host.logger import final_return

    log_dir = tempfile.mkdtemp(prefix="gpu-brax-")
    command = ["algos/ppo.py", "--env-id", env_id, "--num-seeds", str(seeds), *flags,
               "--log-dir", log_dir]
    print("===", " ".join(command), f"(limit {limit_s:.0f} s)", flush=True)
    start = time.perf_counter()
    pythonpath = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    run = subprocess.Popen([sys.executable, *command], cwd=ROOT,  # installed or not
                           env={**os.environ, "PYTHONPATH": pythonpath})
    try:
        run.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)  # saves the last whole chunk, then exits
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never let one task eat the others' time
            run.kill()
            run.wait()
    wall = time.perf_counter() - start
    paths = [os.path.join(d, checkpoint.LATEST) for d, _, files in os.walk(log_dir)
             if checkpoint.LATEST in files]
    if not paths:
        print(f"{env_id}: no whole chunk of updates within {limit_s:.0f} s", flush=True)
        return {}
    saved = checkpoint.load(paths[0])
    metrics = saved["metrics"]
    record = {
        "command": " ".join(command[:-2]),  # without the temporary log directory
        "commit": source_commit(),
        "versions": library_versions(),
        "config": saved["config"],
        "limit_s": round(limit_s, 1), "train_s": round(wall, 2),
        "steps": int(metrics["global_step"][0, -1]),
        "global_step": metrics["global_step"][0].tolist(),
        "episodic_return": np.round(metrics["episodic_return"], 2).tolist(),
        "final_return": np.round(final_return(metrics["episodic_return"]), 2).tolist(),
    }
    path = save_record(record, out_dir, f"ppo__{env_id}")
    print(f"{env_id}: {record['steps']:,} steps per seed in {wall:.0f} s, final return per "
          f"seed {record['final_return']} -> {path}", flush=True)
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=660.0,
                        help="seconds for all tasks together, compiling included")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out-dir", default=None,
                        help="default: benchmarks/results/gpu (a dry run: a temporary folder)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the inverted pendulum at CPU scale, stopped after --budget s "
                             "(give about 60)")
    args = parser.parse_args()
    if importlib.util.find_spec("brax") is None:
        raise SystemExit("error: Brax is not installed here (see this script's docstring).")
    out_dir = args.out_dir or (tempfile.mkdtemp(prefix="gpu-brax-dry-") if args.dry_run else
                               os.path.join(ROOT, "benchmarks", "results", "gpu"))
    for env_id, flags, share in DRY_RUN if args.dry_run else TASKS:
        run_task(env_id, flags, share * args.budget, args.seeds, out_dir)


if __name__ == "__main__":
    main()
