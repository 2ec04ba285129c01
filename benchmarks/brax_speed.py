"""Brax stepping speed on this machine: SPS per physics pipeline against the number of
environments, and where a step's time goes.

    python benchmarks/brax_speed.py --env-id brax/hopper --backends spring positional generalized \
        --num-envs 16 64 256 1024
    python benchmarks/brax_speed.py --env-id brax/hopper --backends positional --num-envs 64 \
        --profile

Each row steps `num_envs` environments with uniformly random actions through the rollout every
algorithm uses (`common/rollout.py`: the same `BraxEnv` step, automatic reset and packed scan),
`--steps` steps per call, jitted; after one warm-up call it times `--repeats` calls and keeps the
median. SPS counts environment steps. `--profile` also records one call with `jax.profiler` and
counts the XLA:CPU kernels (thunks) a rollout step executes and the microseconds they take,
grouped by kind, and the loops and conditionals that run them (their spans hold kernels
counted already, so they are counted apart). The trace itself slows each kernel down:
compare its figures with each other, not with the SPS. Rows go to
`benchmarks/results/brax_speed__{env}[__profile].json`, with the command, commit and versions.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import library_versions, save_record, source_commit  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402
from common.rollout import reset, rollout  # noqa: E402


def random_rollout(env_id: str, backend: str, num_envs: int, steps: int):
    """A jitted `(state, key) -> (state, total reward)` of `steps` random steps, and a state."""
    env, params, spec = make_env(env_id, backend)

    def policy(key, obs, first, hidden):
        action = jax.random.uniform(key, (obs.shape[0], spec.action_dim), minval=-1.0,
                                    maxval=1.0)
        return action, (), hidden

    @jax.jit
    def run(state, key):
        state, trajectory = rollout(env, params, spec, policy, state, key, steps)
        return state, trajectory.reward.sum()

    state = jax.jit(lambda key: reset(env, params, key, num_envs))(jax.random.PRNGKey(0))
    return run, state


def kernel_profile(run, state, steps: int) -> dict:
    """Kernels (XLA:CPU thunks) executed per rollout step and their traced time, by kind."""
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        jax.block_until_ready(run(state, jax.random.PRNGKey(7)))
        jax.profiler.stop_trace()
        path = glob.glob(os.path.join(tmp, "**", "perfetto_trace.json.gz"), recursive=True)[0]
        with gzip.open(path) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    us, calls, loops = collections.Counter(), collections.Counter(), 0
    for event in events:
        name = event.get("name", "")
        if (event.get("ph") != "X" or name.startswith(("$", "end: ", "PjitFunction"))
                or "ThunkExecutor" in name):
            continue  # Python frames, the executor's own spans and kernels' end markers
        kind = re.sub(r"\.\d+$", "", name)
        if kind in ("while", "conditional", "call"):
            loops += 1  # a span around kernels that are counted themselves
            continue
        us[kind] += event.get("dur", 0) / steps
        calls[kind] += 1 / steps
    top = [{"kind": k, "us_per_step": round(v, 1), "calls_per_step": round(calls[k], 1)}
           for k, v in us.most_common(12)]
    return {"kernels_per_step": round(sum(calls.values())), "traced_us_per_step":
            round(sum(us.values())), "loops_per_step": round(loops / steps, 1), "top": top}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="brax/hopper")
    parser.add_argument("--backends", nargs="+", default=["spring", "positional", "generalized"])
    parser.add_argument("--num-envs", nargs="+", type=int, default=[16, 64, 256, 1024])
    parser.add_argument("--steps", type=int, default=50, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="count kernels per step")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args()
    unroll_threefry_on_cpu()  # as the command line does

    rows = []
    for backend in args.backends:
        for num_envs in args.num_envs:
            start = time.perf_counter()
            run, state = random_rollout(args.env_id, backend, num_envs, args.steps)
            state, _ = jax.block_until_ready(run(state, jax.random.PRNGKey(1)))  # compiles
            compile_s = time.perf_counter() - start
            times = []
            for i in range(args.repeats):
                start = time.perf_counter()
                state, _ = jax.block_until_ready(run(state, jax.random.PRNGKey(2 + i)))
                times.append(time.perf_counter() - start)
            step_s = statistics.median(times) / args.steps
            row = {"backend": backend, "num_envs": num_envs, "sps": round(num_envs / step_s),
                   "ms_per_step": round(step_s * 1e3, 3), "build_and_compile_s":
                   round(compile_s, 1)}
            if args.profile:
                row["profile"] = kernel_profile(run, state, args.steps)
            rows.append(row)
            extra = (f" | {row['profile']['kernels_per_step']} kernels and "
                     f"{row['profile']['loops_per_step']} loops per step" if args.profile else "")
            print(f"{args.env_id} {backend:11s} {num_envs:5d} envs: {row['sps']:9,d} SPS, "
                  f"{row['ms_per_step']:8.2f} ms per step, build+compile {compile_s:.0f}s"
                  f"{extra}", flush=True)

    record = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "commit": source_commit(), "versions": library_versions(),
              "cpus": len(os.sched_getaffinity(0)), "nproc": os.environ.get("NPROC"),
              "rows": rows}
    tag = "__profile" if args.profile else ""
    path = save_record(record, args.out_dir, f"brax_speed__{args.env_id}{tag}")
    print("saved", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
