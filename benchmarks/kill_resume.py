"""SIGKILL a command-line run at many moments, resume each, and compare with an uninterrupted
run: how many end bitwise equal. Prints one line per kill and the count.

    python benchmarks/kill_resume.py [--kills 16] [--algo ppo] [--out FILE.json]

The run is a small CartPole config with a checkpoint every 4 updates (so kills land before,
during and after checkpoint writes, including the rotation of `latest.previous.msgpack`).
The k-th kill comes `k / kills` of the way through the uninterrupted run's wall time,
measured from its first progress line. Every process shares one compilation cache.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from common.host import checkpoint  # noqa: E402

ARGS = ["--env-id", "CartPole-v1", "--total-timesteps", "262144", "--num-envs", "4",
        "--num-steps", "32", "--num-seeds", "2", "--checkpoint-every", "4",
        "--num-devices", "1"]  # 2,048 updates


def start(algo, log_dir, env):
    return subprocess.Popen([sys.executable, f"algos/{algo}.py", *ARGS, "--log-dir", log_dir],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def first_progress(run) -> float:
    while line := run.stdout.readline():
        if "step" in line:
            return time.monotonic()
    raise RuntimeError(run.stderr.read()[-2000:])


def final(log_dir) -> dict:
    (path,) = glob.glob(os.path.join(log_dir, "*", checkpoint.LATEST))
    return checkpoint.load(path)


def same(a: dict, b: dict) -> bool:
    import jax

    leaves = lambda r: jax.tree.leaves(r["train_state"]) + jax.tree.leaves(r["metrics"])  # noqa
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(leaves(a), leaves(b),
                                                                  strict=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=16)
    parser.add_argument("--algo", default="ppo", choices=["ppo", "a2c", "impala"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "ONPOLICY_JAX_CACHE": os.path.join(d, "cache"),
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        ref_dir = os.path.join(d, "reference")
        run = start(args.algo, ref_dir, env)
        began = first_progress(run)
        run.communicate()
        duration = time.monotonic() - began
        reference = final(ref_dir)
        print(f"uninterrupted run: {duration:.1f} s of training after its first progress line")
        rows = []
        for k in range(args.kills):
            log_dir = os.path.join(d, f"kill{k}")
            run = start(args.algo, log_dir, env)
            began = first_progress(run)
            time.sleep(max(0.0, began + duration * k / args.kills - time.monotonic()))
            run.kill()
            run.communicate()
            paths = glob.glob(os.path.join(log_dir, "*", checkpoint.LATEST))
            killed_at = checkpoint.load(paths[0])["update"] if paths else None
            resume = [sys.executable, f"algos/{args.algo}.py", "--resume",
                      paths[0] if paths else log_dir]
            if paths:
                result = subprocess.run(resume, cwd=ROOT, env=env, capture_output=True,
                                        text=True)
                ok = result.returncode == 0 and same(final(log_dir), reference)
            else:  # killed before the first checkpoint: nothing to resume, start again
                ok = None
            rows.append({"kill": k, "after_s": duration * k / args.kills,
                         "checkpoint_update": killed_at, "bitwise_equal": ok})
            print(f"kill {k:2d} at {duration * k / args.kills:5.2f} s: checkpoint at update "
                  f"{killed_at}, resumed run bitwise equal: {ok}", flush=True)
    resumed = [r for r in rows if r["bitwise_equal"] is not None]
    equal = sum(bool(r["bitwise_equal"]) for r in resumed)
    print(f"{equal} of {len(resumed)} resumed runs bitwise equal to the uninterrupted run "
          f"({len(rows) - len(resumed)} killed before their first checkpoint)")
    if args.out:
        from benchmarks.configs import source_commit

        commit = source_commit()
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "algo": args.algo, "args": ARGS, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
