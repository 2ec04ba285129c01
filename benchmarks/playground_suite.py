"""Every Control Suite task of MuJoCo Playground, end to end, with each algorithm asked for.

    python benchmarks/playground_suite.py --algos a2c impala

For each task in Playground's registry (`playground/<Task>`) and each algorithm: build its
preset's config with a small budget (`--num-envs` x `--num-steps` x `--updates`), compile
`jit(train)` and run it once; record the compile and training time, the steps per second,
whether every metric (but the episodic ones) and every parameter is finite, and the returns of
the episodes that ended. Writes `benchmarks/results/playground_suite.json` (`--name`; with the commit and
library versions) and prints one line per run. A task that fails to build, compile or run is
recorded with its error and the script goes on; it exits 1 if any did.
"""

import argparse
import dataclasses
import importlib
import os
import sys
import time
import traceback
from importlib import metadata

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import library_versions, save_record, source_commit  # noqa: E402
from common.envs import playground_tasks  # noqa: E402
from common.presets import preset  # noqa: E402

EPISODIC = ("episodic_return", "episodic_length", "repeated_starts")


def run_one(algo: str, env_id: str, num_envs: int, num_steps: int, updates: int) -> dict:
    module = importlib.import_module(f"algos.{algo}")
    fields = {f.name for f in dataclasses.fields(module.Config)}
    settings = {k: v for k, v in preset(algo, env_id).items() if k in fields}
    settings.update(num_envs=num_envs, num_steps=num_steps,
                    total_timesteps=num_envs * num_steps * updates)
    if "num_minibatches" in fields:
        settings["num_minibatches"] = 2
    config = module.Config(env_id=env_id, **settings)
    start = time.perf_counter()
    compiled = jax.jit(module.make_train(config)).lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(compiled(jax.random.PRNGKey(0)))
    train_s = time.perf_counter() - start
    finite = all(bool(np.isfinite(np.asarray(v)).all()) for k, v in metrics.items()
                 if k not in EPISODIC)
    finite = finite and all(bool(np.isfinite(np.asarray(x)).all())
                            for x in jax.tree.leaves(state.params))
    returns = np.asarray(metrics["episodic_return"])
    return {"compile_s": round(compile_s, 2), "train_s": round(train_s, 3),
            "sps": round(config.num_updates * config.batch_size / train_s),
            "finite": finite, "episodes_ended": bool(np.isfinite(returns).any()),
            "returns": [round(float(r), 2) for r in returns[np.isfinite(returns)]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c", "impala"],
                        choices=["ppo", "a2c", "impala"])
    parser.add_argument("--tasks", nargs="*", default=None,
                        help="Control Suite task names (default: every one)")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=250,
                        help="a 1000-step episode ends after 4 rollouts of 250 steps")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--name", default="playground_suite", help="the JSON file's name")
    args = parser.parse_args()
    suite = [t for t, s in playground_tasks().items() if s == "dm_control_suite"]
    if not suite:
        parser.error("MuJoCo Playground is not installed: pip install -e \".[playground]\"")
    tasks = args.tasks or suite
    unknown = sorted(set(tasks) - set(suite))
    if unknown:
        parser.error(f"not Control Suite tasks: {', '.join(unknown)}")
    runs, failed = [], 0
    for task in tasks:
        for algo in args.algos:
            env_id = f"playground/{task}"
            try:
                result = run_one(algo, env_id, args.num_envs, args.num_steps, args.updates)
                ok = result["finite"] and result["episodes_ended"]
            except Exception as error:  # recorded, and the suite goes on
                result = {"error": f"{type(error).__name__}: {error}"[:500],
                          "traceback": traceback.format_exc()[-2000:]}
                ok = False
            failed += not ok
            runs.append({"algo": algo, "env_id": env_id, "ok": ok, **result})
            summary = result.get("error") or (
                f"compile {result['compile_s']:.1f}s, train {result['train_s']:.2f}s, "
                f"{result['sps']:,} SPS, finite {result['finite']}, returns {result['returns']}")
            print(f"{'ok  ' if ok else 'FAIL'} {algo:6s} {env_id:36s} {summary}", flush=True)
    path = save_record({
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "commit": source_commit(),
        "versions": {**library_versions(), **{p: metadata.version(p) for p in (
            "playground", "mujoco", "mujoco-mjx", "brax")}},
        "device": jax.devices()[0].device_kind, "num_envs": args.num_envs,
        "num_steps": args.num_steps, "updates": args.updates, "runs": runs},
        args.out_dir, args.name)
    print(f"{len(runs) - failed} of {len(runs)} runs ok; saved {os.path.relpath(path, ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
