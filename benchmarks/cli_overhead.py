"""The command line against the program it compiles: training SPS side by side, and where the
start-to-exit time of the default command goes.

    python benchmarks/cli_overhead.py                       # PPO, A2C, IMPALA x 1, 8, 32 seeds
    python benchmarks/cli_overhead.py --algos ppo --seeds 1 8 --repeats 3
    python benchmarks/cli_overhead.py --start-only          # the default PPO command, cold/warm
    python benchmarks/cli_overhead.py --algos ppo --seeds 8 --chunk-loop --no-start  # + chunks alone
    python benchmarks/cli_overhead.py --seeds 1 8 --prime-updates --no-start  # a shorter last chunk
    python benchmarks/cli_overhead.py --checkpoint-cost --algos a2c --seeds 32 --total-timesteps 5e6

For each (algorithm, seed count), on CartPole with that algorithm's defaults and
`--total-timesteps` steps per seed (`--prime-updates`: the largest prime number of updates
within them, so that the last chunk is shorter than the others), each in a fresh process,
alternating (bare, cli, cli, bare, ...: a slow drift of the machine's speed weighs on both
alike), `--repeats` times:

- **bare**: `vmap(train)` compiled as the command line compiles its chunks for the same flags
  (`common.host.flags.parse`, `setup_devices`, `Layout.compile`: one program per device for
  seeds on several devices), then the whole run timed in one call;
- **cli**: `python algos/<algo>.py` with the same flags, a checkpoint after every chunk and
  TensorBoard on; its training SPS is the one its summary line reports (compilation excluded).

The ratio is of the medians; `paired_ratio` is the median of each pair's ratio. The
start-to-exit part runs `python algos/ppo.py --env-id CartPole-v1` with an empty compilation
cache (cold) and again with it filled (warm), and splits the time into compile and train (its
summary line) and everything else; the pieces of everything else (interpreter start and exit,
imports, environment set-up) are timed alone in a separate process. `--checkpoint-cost` times,
instead, the checkpoints alone of one long run (its real train state, random metric rows; about
20 chunks, a checkpoint after each): CPU seconds per save with the rows kept chunk by chunk as
the command line keeps them (`checkpoint.Rows`: each row serialised and hashed once) against
all rows so far serialised and hashed again at every save. Raw rows:
`benchmarks/results/cli_overhead.json` (with the commit; `--out` elsewhere).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import out_file, source_commit, summary_figures  # noqa: E402


def bare(algo: str, args: list[str], chunk_loop: bool = False) -> dict:
    """In this process: the fused program of the command line's flags `args`, timed; with
    `chunk_loop`, also the command line's compiled chunk called for every update in turn."""
    import importlib

    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from common.host import cli, flags
    from common.host.devices import Layout, setup_devices
    from common.host.logger import seed_keys
    from common.host.prng import unroll_threefry_on_cpu

    module = importlib.import_module(f"algos.{algo}")
    config, run, _ = flags.parse(algo, module.Config, args)
    setup_devices(run)
    unroll_threefry_on_cpu()  # as the command line does
    train = module.make_train(config)
    keys = seed_keys(run.seed, run.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    template = jax.eval_shape(jax.vmap(train.init), keys, hparams)
    layout = Layout(run, config.num_envs, template)
    keys, hparams = layout.put(keys, layout.seeds), layout.put(hparams, layout.seeds)
    start = time.perf_counter()
    program = layout.compile(jax.vmap(train), (layout.seeds, layout.seeds),
                             (layout.state, layout.seeds), keys, hparams)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(program(keys, hparams))
    train_s = time.perf_counter() - start
    steps = config.num_updates * config.batch_size * run.num_seeds
    row = {"compile_s": compile_s, "train_s": train_s, "sps": steps / train_s,
           "devices": layout.num_devices}
    if chunk_loop:  # the command line's chunks called back to back, with no host work at all
        session = cli.start_or_resume(algo, config, run, train)
        run_chunk, _, chunk = cli.compile_programs(session)
        cli.first_state(session)  # a fresh run's state, once its program is compiled
        state, start = session.state, time.perf_counter()
        for begin in range(0, config.num_updates, chunk):  # the last may be shorter
            updates = layout.put(np.arange(begin, min(begin + chunk, config.num_updates),
                                           dtype=np.int32), P())
            state = run_chunk(state, session.hparams, updates)[0]
        jax.block_until_ready(state)
        row["chunk_loop_sps"] = steps / (time.perf_counter() - start)
    return row


def run_bare(algo, args, chunk_loop=False) -> dict:
    flag = ["--chunk-loop"] if chunk_loop else []
    out = subprocess.run([sys.executable, __file__, "--bare", algo, *flag, "--", *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_cli(algo, args, cache: str) -> dict:
    """`python algos/<algo>.py args`: wall time, and compile, train, SPS, final return from
    its summary line."""
    with tempfile.TemporaryDirectory() as logs:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, f"algos/{algo}.py", *args, "--log-dir", logs],
                                cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "ONPOLICY_JAX_CACHE": cache})
        wall = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"{algo} {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    figures = summary_figures(result.stdout)
    return {"wall_s": wall, "compile_s": figures["compile"], "train_s": figures["train"],
            "sps": figures["sps"], "final_return": figures["mean"]}


def side_by_side(algos, seeds, total_timesteps: int, repeats: int,
                 chunk_loop: bool = False, num_devices=None,
                 prime_updates: bool = False) -> list[dict]:
    import importlib

    from common.host.cli import chunk_size, divisors

    rows = []
    for algo in algos:
        module = importlib.import_module(f"algos.{algo}")
        config = module.Config(env_id="CartPole-v1", total_timesteps=total_timesteps)
        steps = total_timesteps
        if prime_updates:  # no divisor of the updates gives a chunk count near 20
            prime = next(k for k in range(config.num_updates, 1, -1) if len(divisors(k)) == 2)
            steps = config.batch_size * prime
            config = module.Config(env_id="CartPole-v1", total_timesteps=steps)
        for n in seeds:  # the default chunk, a checkpoint after each
            every = chunk_size(config.num_updates, steps_per_update=config.batch_size * n)
            args = ["--env-id", "CartPole-v1", "--total-timesteps", str(steps),
                    "--num-seeds", str(n), "--checkpoint-every", str(every)] + (
                        ["--num-devices", num_devices] if num_devices else [])
            bares, clis = [], []
            with tempfile.TemporaryDirectory() as cache:
                for i in range(repeats):  # bare, cli, cli, bare, ...: a drift cancels
                    pair = [lambda: bares.append(run_bare(algo, args, chunk_loop)),
                            lambda: clis.append(run_cli(algo, args, cache))]
                    for run in pair[::-1] if i % 2 else pair:
                        run()
            row = {"algo": algo, "seeds": n, "steps_per_seed": config.num_updates *
                   config.batch_size, "updates": config.num_updates, "checkpoint_every": every,
                   "chunks": -(-config.num_updates // every),
                   "devices": bares[0]["devices"],
                   "bare_sps": statistics.median(b["sps"] for b in bares),
                   "cli_sps": statistics.median(c["sps"] for c in clis),
                   "bare_runs": bares, "cli_runs": clis}
            row["ratio"] = row["cli_sps"] / row["bare_sps"]
            # each run against the bare run beside it: a drift between pairs cancels too
            row["paired_ratio"] = statistics.median(
                c["sps"] / b["sps"] for b, c in zip(bares, clis))
            loop = ""
            if chunk_loop:
                row["chunk_loop_sps"] = statistics.median(b["chunk_loop_sps"] for b in bares)
                loop = (f" | chunks alone {row['chunk_loop_sps']:>10,.0f} SPS "
                        f"({row['chunk_loop_sps'] / row['bare_sps']:.3f} of bare)")
            rows.append(row)
            print(f"{algo:6s} {n:3d} seeds on {row['devices']} device(s), "
                  f"{config.num_updates} updates in {row['chunks']} chunks: bare "
                  f"{row['bare_sps']:>10,.0f} SPS | cli {row['cli_sps']:>10,.0f} SPS | "
                  f"cli/bare {row['ratio']:.3f} (pairs {row['paired_ratio']:.3f}){loop}",
                  flush=True)
    return rows


IMPORTS = """
import time
start = time.perf_counter()
import algos.ppo, tyro, tensorboardX
from common.host import cli
imported = time.perf_counter()
from common.envs import make_env
make_env("CartPole-v1")
print(imported - start, time.perf_counter() - imported)
"""


def start_to_exit(repeats: int) -> dict:
    """The default command, cold then warm cache, `repeats` times each; medians."""
    args = ["--env-id", "CartPole-v1"]
    cold, warm, pieces = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(run_cli("ppo", args, cache))
            warm.append(run_cli("ppo", args, cache))
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
        pieces.append((float(out[0]), float(out[1]), time.perf_counter() - start))
    imports = statistics.median(p[0] for p in pieces)
    env_setup = statistics.median(p[1] for p in pieces)
    interpreter = statistics.median(p[2] - p[0] - p[1] for p in pieces)
    result = {}
    for name, runs in (("cold", cold), ("warm", warm)):
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["other_s"] = med["wall_s"] - med["compile_s"] - med["train_s"]
        med["runs"] = runs
        result[name] = med
        print(f"start to exit, {name} cache: {med['wall_s']:.1f} s = compile "
              f"{med['compile_s']:.1f} + train {med['train_s']:.1f} + other {med['other_s']:.1f} "
              f"(measured alone: interpreter start and exit {interpreter:.1f}, imports "
              f"{imports:.1f}, environment {env_setup:.1f}); final return "
              f"{med['final_return']:.1f}", flush=True)
    result.update(imports_s=imports, env_setup_s=env_setup, interpreter_s=interpreter)
    return result


def checkpoint_cost(algo: str, seeds: int, total_timesteps: int) -> dict:
    """CPU seconds of a run's checkpoints (see the module docstring), both ways in turn."""
    import importlib

    import jax
    import numpy as np

    from common.host import checkpoint
    from common.host.cli import chunk_size

    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="CartPole-v1", total_timesteps=total_timesteps)
    train = module.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    template = jax.eval_shape(jax.vmap(train.init), keys, hparams)
    state = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), template)
    chunk = chunk_size(config.num_updates, steps_per_update=config.batch_size * seeds)
    _, shapes = jax.eval_shape(jax.vmap(train.run_updates, in_axes=(0, 0, None)), template,
                               hparams, jax.ShapeDtypeStruct((chunk,), np.int32))
    shapes["global_step"] = jax.ShapeDtypeStruct((seeds, chunk), np.int64)  # as the host's
    rng = np.random.default_rng(0)  # the algorithm's metric rows, random values
    chunks = [{k: rng.standard_normal(x.shape).astype(x.dtype) for k, x in shapes.items()}
              for _ in range(config.num_updates // chunk)]
    fields = dict(algo=algo, config={}, run={}, run_names=[], run_time=0, train_state=state)
    result = {"algo": algo, "seeds": seeds, "updates": config.num_updates, "chunks": len(chunks)}
    with tempfile.TemporaryDirectory() as directory:
        checkpoint.save(os.path.join(directory, "warm-up"), update=0, metrics={}, **fields)
        for way in ("rows_once", "all_rows_every_save"):
            path, rows, cpu = os.path.join(directory, way, "latest.msgpack"), checkpoint.Rows(), []
            for i, new in enumerate(chunks):
                start = time.process_time()
                if way == "rows_once":
                    rows.append(new)
                    metrics = rows
                else:
                    metrics = checkpoint.concat_rows(chunks[:i + 1])
                checkpoint.save(path, update=(i + 1) * chunk, metrics=metrics, **fields)
                cpu.append(time.process_time() - start)
            result[way] = {"cpu_s": sum(cpu), "first_save_s": cpu[0], "last_save_s": cpu[-1],
                           "file_mb": os.path.getsize(path) / 1e6}
            print(f"{algo} {seeds} seeds x {config.num_updates:,} updates, {way}: "
                  f"{len(chunks)} saves {sum(cpu):.2f} s CPU (first {cpu[0] * 1e3:.0f} ms, last "
                  f"{cpu[-1] * 1e3:.0f} ms), file {result[way]['file_mb']:.0f} MB", flush=True)
    return result


def main():
    from common.host.options import whole_number

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c", "impala"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--total-timesteps", type=whole_number, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-only", action="store_true")
    parser.add_argument("--chunk-loop", action="store_true",
                        help="also time the compiled chunks back to back with no host work")
    parser.add_argument("--num-devices", help="passed on to the command line (0: all)")
    parser.add_argument("--no-start", action="store_true")
    parser.add_argument("--prime-updates", action="store_true",
                        help="each algorithm's largest prime number of updates within "
                             "--total-timesteps (chunks of one length do not divide it)")
    parser.add_argument("--checkpoint-cost", action="store_true",
                        help="time the checkpoints of one long run instead (see above)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "cli_overhead.json"))
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.bare:
        print(json.dumps(bare(args.bare, [a for a in rest if a != "--"], args.chunk_loop)))
        return
    out_file(parser, args.out)
    record = {"commit": source_commit(), "cpus": len(os.sched_getaffinity(0)),
              "total_timesteps": args.total_timesteps, "repeats": args.repeats}
    if args.checkpoint_cost:
        record["checkpoint_cost"] = [checkpoint_cost(algo, n, args.total_timesteps)
                                     for algo in args.algos for n in args.seeds]
    elif not args.start_only:
        record["side_by_side"] = side_by_side(args.algos, args.seeds, args.total_timesteps,
                                              args.repeats, args.chunk_loop, args.num_devices,
                                              args.prime_updates)
    if not args.no_start and not args.checkpoint_cost:
        record["start_to_exit"] = start_to_exit(args.repeats)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
