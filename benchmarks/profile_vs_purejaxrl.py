"""Where the time goes on an accelerator: our PPO and PureJaxRL's on one config, each traced.

    python benchmarks/profile_vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --seeds 1024
    python benchmarks/profile_vs_purejaxrl.py --reference DIR --brax ant --seeds 4 --updates 10
    python benchmarks/profile_vs_purejaxrl.py --reference DIR --brax ant --lowering-profile

Both programs as `vs_purejaxrl.py` builds them (its `configs`), for `--updates` updates: keep
it small, since the trace records every op the device runs and the profiler drops events past
its limit (Brax Ant's trace over 20 updates was cut at 9). Each is compiled (the lowering,
tracing and conversion to StableHLO, timed apart from XLA's compile), called once untimed,
timed `--repeats` times in alternation, then called once more under `jax.profiler.trace`.

Prints, and saves to `--out` as JSON, each program's lowering and compile seconds, its SPS,
and its costliest device ops read from the trace's Chrome-format events: the op's name, total
microseconds, how often it ran and the start of XLA's instruction (shapes and, on a TPU, the
tiled layouts). A trace of an accelerator holds its device ops; on a CPU XLA's kernels run on
host threads and the list is empty. `--keep-trace DIR` keeps the whole trace (`.xplane.pb`,
for TensorBoard's or XProf's profile viewer). Each lowering starts from cleared JAX caches.
`--lowering-profile` also runs Python's `cProfile` over each program's lowering, prints its
costliest calls by cumulative and by own time, and keeps both in the JSON.

Run it on the accelerator, in a process of its own (one process holds a TPU).
"""

import cProfile
import collections
import glob
import gzip
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from algos.ppo import make_train  # noqa: E402
from benchmarks.configs import out_file, source_commit, time_in_alternation  # noqa: E402
from benchmarks.vs_purejaxrl import (  # noqa: E402
    comparison_parser, configs, load_reference, parse_comparison)
from common.host.options import whole_number  # noqa: E402


def device_ops(trace_json: str, top: int):
    """The costliest ops of a trace's non-host processes (the devices), as dicts."""
    with gzip.open(trace_json) as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    total, count, text = collections.Counter(), collections.Counter(), {}
    for e in events:
        if e.get("ph") != "X" or "/host:" in names.get(e["pid"], "/host:"):
            continue
        if threads.get((e["pid"], e.get("tid"))) != "XLA Ops":
            continue
        total[e["name"]] += e.get("dur", 0)
        count[e["name"]] += 1
        text.setdefault(e["name"], str((e.get("args") or {}).get("long_name", ""))[:200])
    return [{"op": name, "us": round(us, 1), "n": count[name], "hlo": text[name]}
            for name, us in total.most_common(top)]


def lowering_profile(profile: cProfile.Profile, name: str) -> dict:
    """Print a lowering's cProfile, its costliest calls by cumulative and by own time, and
    return both as text. (Time inside C++ that Python calls, such as JAX's caches, counts as
    the calling function's own time.)"""
    texts = {}
    for order, count in (("cumulative", 40), ("tottime", 25)):
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats(order).print_stats(count)
        texts[order] = text.getvalue()
        print(f"the lowering of {name}: {stats.total_calls:,} calls in {stats.total_tt:.1f} s, by "
              f"{order}:\n{texts[order]}")
    return texts


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--updates", type=whole_number, default=16,
                        help="updates each program runs (the trace holds all of them)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=40, help="device ops to keep per program")
    parser.add_argument("--lowering-profile", action="store_true",
                        help="cProfile each program's lowering and print its costliest calls")
    parser.add_argument("--keep-trace", default=None, metavar="DIR",
                        help="keep the traces (xplane.pb and trace.json.gz) under DIR")
    parser.add_argument("--out", default="benchmarks/results/profile_vs_purejaxrl.json")
    args = parse_comparison(parser)
    out_file(parser, args.out)
    if args.repeats < 1 or args.top < 1:
        parser.error("--repeats and --top must be at least 1")

    batch, _, _ = configs(10**9, args.recurrent, args.brax)  # only its batch size
    config, file, ref_config = configs(args.updates * batch.batch_size, args.recurrent,
                                       args.brax)
    reference = load_reference(args.reference, file)
    trains = {"ours": make_train(config), "purejaxrl": reference.make_train(ref_config)}
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    compiled, record = {}, {}
    for name, train in trains.items():
        jax.clear_caches()  # neither program's lowering reuses what the other's traced
        profile, profiled = cProfile.Profile() if args.lowering_profile else None, {}
        start = time.perf_counter()
        if profile:
            profile.enable()
        lowered = jax.jit(jax.vmap(train)).lower(keys)
        lower_s = time.perf_counter() - start
        if profile:
            profile.disable()
            profiled = {"lowering_profile": lowering_profile(profile, name)}
        start = time.perf_counter()
        compiled[name] = lowered.compile()
        record[name] = {"lower_s": lower_s, "compile_s": time.perf_counter() - start, **profiled}
        print(f"{name}: lowered in {record[name]['lower_s']:.1f} s, compiled in "
              f"{record[name]['compile_s']:.1f} s", flush=True)
    steps = config.num_updates * config.batch_size * args.seeds
    sps, _ = time_in_alternation(compiled, (keys,), dict.fromkeys(compiled, steps), args.repeats)
    for name, fn in compiled.items():
        folder = (os.path.join(args.keep_trace, name) if args.keep_trace
                  else tempfile.mkdtemp(prefix=f"trace_{name}_"))
        with jax.profiler.trace(folder):
            jax.block_until_ready(fn(keys))
        found = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.trace.json.gz"))
        record[name]["sps"] = sps[name]
        record[name]["device_ops"] = device_ops(found[0], args.top) if found else []
        print(f"\n{name}: median {statistics.median(sps[name]):,.0f} SPS; "
              f"costliest device ops (total ms, runs, op):")
        for op in record[name]["device_ops"][:15]:
            print(f"  {op['us'] / 1e3:9.2f} {op['n']:7d}  {op['op']}  {op['hlo'][:90]}")
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "commit": source_commit(),
                   "jax": jax.__version__, "device": jax.devices()[0].device_kind,
                   "seeds": args.seeds, "updates": args.updates, "recurrent": args.recurrent,
                   "brax": args.brax, "programs": record}, f, indent=1)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    main()
