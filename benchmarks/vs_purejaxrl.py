"""Side-by-side speed of our PPO and PureJaxRL's `ppo.py` on the identical config.

    git clone https://github.com/luchris429/purejaxrl /tmp/purejaxrl   # not vendored here
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --repeats 5
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --recurrent
    taskset -c 1 python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl \
        --brax hopper --seeds 4 --total-timesteps 400000 --repeats 2
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --seeds 1024   # each traced
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --brax ant --seeds 4 --updates 10
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --brax ant --lowering-profile

`--recurrent` compares recurrent PPO with PureJaxRL's `ppo_rnn.py` instead, on its own config
(CartPole, 4 envs x 128 steps, a 128-unit GRU after a 128-unit ReLU embedding, 128-unit ReLU
heads): ours with `--network gru --hidden-size 128 --activation relu`. The one difference in
work is ours: a truncated episode bootstraps from V of its final observation (one more GRU
step per transition, in parallel), where `ppo_rnn.py` treats every `done` as terminal.

Both run in this one process, `jit(vmap(train))` over the same number of seeds, compiled
first and called once each untimed (the first call of a program pays for first touches of its
memory), then timed in alternation (ours, theirs, ours, ...) so that machine noise hits both
alike. Prints compile time (from cleared caches: `make_train`, which builds the environment,
the lowering, and XLA; the first two also apart), median SPS of each and the ratio of the
medians, plus the final returns so that speed is not bought with learning. Saves the raw
timings as JSON. Ours compiles first; `--purejaxrl-first` turns the order round: on a TPU v5e
a process's second Brax compile was 12.6 to 14.5 s faster than its first, whichever program
it was (docs/performance.md), so compare compile times of the same place in the order.

Ours runs as our command line does, with the Threefry lowering it selects on CPU
(`common/host/prng.py`). PureJaxRL runs as shipped (JAX's default lowerings), and once more
compiled with that lowering, so the output also shows how much of the ratio that one switch is
(on a CPU; elsewhere the lowering changes nothing and that run is left out). `--python-api`
runs ours as the README's Python example does instead, without that process-wide switch
(`jax.jit(make_train(config))`; `common/threefry.py` hashes its keys).

`--brax NAME` compares PPO on `brax/NAME` with PureJaxRL's `ppo_continuous_action.py` (Brax's
positional pipeline for both, PureJaxRL's default): its network (256x256 tanh MLPs, a state-
independent log-std), observations and rewards normalised, no learning-rate annealing, no
entropy bonus, and the batch of our Brax preset for that task (`common/presets.py`) in both;
where the preset is sized for an accelerator, PureJaxRL's own batch (2048 envs x 10 steps, 32
minibatches; Ant's preset has 4096 envs). The work differs in two places, both ours: a truncated
episode bootstraps from V of its final observation (PureJaxRL treats the 1000-step limit as a
death), and every finished episode starts from a fresh random state (Brax's `AutoResetWrapper`,
which PureJaxRL uses, restarts from the state of the first reset). It is timed without the
"+unrolled" run. With several seeds, run it on one core (`taskset`) or with `--threads 1`:
PureJaxRL initialises its network with flax's orthogonal initialiser under `vmap`, which can
deadlock jaxlib 0.10.x on a multi-threaded CPU pool (`docs/performance.md`, "Known hazard"); it
did here, with 4 seeds on both cores.

`--threads N` sets XLA:CPU's thread pool to N threads (`NPROC`, read when JAX starts its CPU
backend) for both libraries; 0 keeps XLA's default, one per core. On a small program the pool
costs time: XLA:CPU runs the kernels on the calling thread and, whenever more than 8 are ready
at once, hands half of them to the pool, waking a thread (`docs/performance.md`, "Hand-offs
to the thread pool"). `taskset -c 1 python ...` pins the whole process to one core, which also
leaves a one-thread pool.

PureJaxRL targets the gymnax 0.0.x step API (`done` in one flag); a small adapter below gives it
that view of gymnax 1.0 (`done = terminated or truncated`, PureJaxRL's own semantics), and
stub modules stand in for the optional `navix` import of its `wrappers.py` (and for `brax`,
outside `--brax`), which the paths timed here never use. `ppo_rnn.py` calls flax's `GRUCell`
as flax 0.7 did (no `features`, `initialize_carry(key, batch, size)`); the adapter supplies
the 128 units and the zero carry that call meant.

`--profile` shows where the time goes on an accelerator instead: both programs as above, for
`--updates` updates (keep it small: the trace records every op the device runs and the
profiler drops events past its limit; Brax Ant's trace over 20 updates was cut at 9), ours
compiled first and as the README's Python example runs it (JAX's default Threefry lowering).
Each is compiled (the lowering, tracing and conversion to StableHLO, timed apart from XLA's
compile; each from cleared JAX caches), called once untimed, timed `--repeats` times in
alternation, then called once more under `jax.profiler.trace`. Prints, and saves to `--out`
(default `benchmarks/results/profile_vs_purejaxrl.json`), each program's lowering and compile
seconds, its SPS, and its costliest device ops read from the trace's Chrome-format events
(`device_ops`): the op's name, total microseconds, how often it ran and the start of XLA's
instruction (shapes and, on a TPU, the tiled layouts). A trace of an accelerator holds its
device ops; on a CPU XLA's kernels run on host threads and the list is empty. `--keep-trace
DIR` keeps the whole trace (`.xplane.pb`, for TensorBoard's or XProf's profile viewer).
`--lowering-profile` also runs Python's `cProfile` over each program's lowering, prints its
costliest calls by cumulative and by own time, and keeps both in the JSON. Run it on the
accelerator, in a process of its own (one process holds a TPU).
"""

import argparse
import collections
import cProfile
import glob
import gzip
import importlib.util
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import types

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from algos.ppo import Config, make_train  # noqa: E402
from benchmarks.configs import (out_file, refuse_other_mode, source_commit,  # noqa: E402
                                time_in_alternation)
from common.host.logger import final_return  # noqa: E402
from common.host.options import whole_number  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402
from common.presets import PPO_BRAX_ACCELERATOR, preset  # noqa: E402


class OldStepApi:
    """A gymnax 1.0 environment seen through the 0.0.x API: `step -> (obs, state, r, done, info)`."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jax.numpy.logical_or(terminated, truncated), info


def load_reference(path, file: str = "ppo.py"):
    stubs = ["navix"]
    if file != "ppo_continuous_action.py":  # the one file here that runs Brax itself
        stubs += ["brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training"]
    for name in stubs:
        stub = sys.modules.setdefault(name, types.ModuleType(name))
        stub.__dict__.setdefault("EpisodeWrapper", object)
        stub.__dict__.setdefault("AutoResetWrapper", object)
    sys.path.insert(0, path)
    import gymnax

    make = gymnax.make
    spec = importlib.util.spec_from_file_location(f"purejaxrl_{file[:-3]}",
                                                  os.path.join(path, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.gymnax = types.SimpleNamespace(
        make=lambda env_id, **kw: (lambda e, p: (OldStepApi(e), p))(*make(env_id, **kw)))
    if hasattr(module, "ScannedRNN"):  # ppo_rnn.py calls GRUCell with the flax 0.7 API
        import flax.linen as nn

        module.nn = types.SimpleNamespace(**{**vars(nn), "GRUCell": lambda: nn.GRUCell(128)})
        module.ScannedRNN.initialize_carry = staticmethod(
            lambda batch_size, hidden_size: jax.numpy.zeros((batch_size, hidden_size)))
    return module


def configs(total_timesteps: int, recurrent: bool = False, brax: str | None = None):
    """`(config, file, ref_config)`: our PPO's `Config`, the PureJaxRL file to compare with and
    its config dict, the same run in both (the module docstring says which)."""
    if recurrent:
        config = Config(total_timesteps=total_timesteps, network="gru", hidden_size=128,
                        activation="relu")
        file = "ppo_rnn.py"
    elif brax:
        env_id = f"brax/{brax}"
        sizes = preset("ppo", env_id)
        if sizes.get("num_envs", 0) >= PPO_BRAX_ACCELERATOR["num_envs"]:
            sizes = PPO_BRAX_ACCELERATOR  # sized for an accelerator: PureJaxRL's own batch
        sizes = {k: v for k, v in sizes.items()
                 if k in ("num_envs", "num_steps", "num_minibatches", "update_epochs")}
        config = Config(env_id=env_id, total_timesteps=total_timesteps, hidden_size=256,
                        learning_rate=3e-4, anneal_lr=False, ent_coef=0.0, normalize_obs=True,
                        normalize_reward=True, brax_backend="positional", **sizes)
        file = "ppo_continuous_action.py"
    else:
        config = Config(total_timesteps=total_timesteps)
        file = "ppo.py"
    ref_config = {
        "LR": config.learning_rate, "NUM_ENVS": config.num_envs, "NUM_STEPS": config.num_steps,
        "TOTAL_TIMESTEPS": config.total_timesteps, "UPDATE_EPOCHS": config.update_epochs,
        "NUM_MINIBATCHES": config.num_minibatches, "GAMMA": config.gamma,
        "GAE_LAMBDA": config.gae_lambda, "CLIP_EPS": config.clip_coef,
        "ENT_COEF": config.ent_coef, "VF_COEF": config.vf_coef,
        "MAX_GRAD_NORM": config.max_grad_norm, "ACTIVATION": config.activation,
        "ENV_NAME": brax or config.env_id, "ANNEAL_LR": config.anneal_lr, "DEBUG": False,
        **({"NORMALIZE_ENV": True} if brax else {}),
    }
    return config, file, ref_config


def compiled_programs(runners: dict, order: list, keys, profile: bool = False):
    """`(compiled, record)`: each program of `runners` (`{name: (build, unrolled)}`: what
    returns its `train` function, and whether it runs with our Threefry lowering) compiled in
    `order`, each from cleared JAX caches, none reusing another's traces. `record[name]`:
    `lower_s` (`build` and the lowering), `compile_s` (XLA's compile after it) and, with
    `profile`, the `cProfile` of `build` and the lowering (`lowering_profile`)."""
    compiled, record = {}, {}
    for name in order:
        build, unrolled = runners[name]
        unroll_threefry_on_cpu(unrolled)
        jax.clear_caches()
        profiler = cProfile.Profile() if profile else None
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        train = build()  # in the count: ours traces its environment here on an accelerator
        lowered = jax.jit(jax.vmap(train)).lower(keys)
        if profiler:
            profiler.disable()
        record[name] = {"lower_s": time.perf_counter() - start}
        start = time.perf_counter()
        compiled[name] = lowered.compile()
        record[name]["compile_s"] = time.perf_counter() - start
        if profiler:
            record[name]["lowering_profile"] = lowering_profile(profiler, name)
        print(f"compiled {name} in {record[name]['lower_s'] + record[name]['compile_s']:.1f}s "
              f"(make_train and lowering {record[name]['lower_s']:.1f}s, then XLA)", flush=True)
    unroll_threefry_on_cpu(True)
    return compiled, record


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


def side_by_side(args, reference, config, ref_config, keys) -> dict:
    """The comparison: both programs (and PureJaxRL with our lowering, on a CPU outside
    `--brax`) compiled, timed in alternation, their final returns; prints the ratios and
    returns the JSON record's figures."""
    # Ours runs as our command line does, with Threefry lowered without its CPU loop
    # (common/host/prng.py, the same bits); PureJaxRL as shipped uses JAX's default.
    # "purejaxrl+unrolled" is PureJaxRL compiled with our lowering, to show what that part buys.
    runners = {
        "ours": (lambda: make_train(config), not args.python_api),
        "purejaxrl": (lambda: reference.make_train(ref_config), False),
    }
    # A Brax step dwarfs the random draws this lowering speeds up, and off the CPU it is the
    # same program as PureJaxRL's (the lowering is registered for the CPU only).
    if not args.brax and jax.default_backend() == "cpu":
        runners["purejaxrl+unrolled"] = (lambda: reference.make_train(ref_config), True)
    order = sorted(runners, key=lambda name: name == "ours") if args.purejaxrl_first \
        else list(runners)
    compiled, times = compiled_programs(runners, order, keys)
    lower_s = {name: t["lower_s"] for name, t in times.items()}
    compile_s = {name: t["lower_s"] + t["compile_s"] for name, t in times.items()}

    steps = config.num_updates * config.batch_size * args.seeds
    sps, outputs = time_in_alternation(compiled, (keys,), dict.fromkeys(compiled, steps),
                                       args.repeats)
    returns = {}
    for name, out in outputs.items():
        if name == "ours":
            returns[name] = final_return(out[1]["episodic_return"])
        else:
            info = out["metric" if args.recurrent else "metrics"]
            ended = info["returned_episode"]
            per_update = np.nansum(np.where(ended, info["returned_episode_returns"], 0),
                                   axis=(-2, -1)) / np.sum(ended, axis=(-2, -1))
            returns[name] = final_return(per_update)

    median = {name: statistics.median(v) for name, v in sps.items()}
    for name in runners:
        print(f"{name:10s} compile {compile_s[name]:5.2f}s | median SPS {median[name]:12,.0f} "
              f"over {args.repeats} runs | final return mean {np.mean(returns[name]):.1f}")
    print(f"speed ratio ours / purejaxrl (medians): {median['ours'] / median['purejaxrl']:.2f}x; "
          f"compile ratio: {compile_s['ours'] / compile_s['purejaxrl']:.2f}x")
    if "purejaxrl+unrolled" in median:
        print(f"speed ratio ours / purejaxrl+unrolled (medians): "
              f"{median['ours'] / median['purejaxrl+unrolled']:.2f}x")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"threads": args.threads or "default", "cpus": cpus,
            "recurrent": args.recurrent, "brax": args.brax,
            "seeds": args.seeds, "python_api": args.python_api,
            "compile_order": order, "sps": sps,
            "compile_s": compile_s, "make_train_and_lower_s": lower_s,
            "final_return": {k: np.asarray(v).tolist() for k, v in returns.items()}}


def profile(args, reference, config, ref_config, keys) -> dict:
    """`--profile`: both programs compiled (ours first, with JAX's default lowering), timed
    in alternation, then each traced once; prints its costliest device ops and returns the
    JSON record's figures."""
    trains = {"ours": make_train(config), "purejaxrl": reference.make_train(ref_config)}
    # built before the timing: the profile's lowering is the lowering alone
    runners = {name: (lambda train=train: train, False) for name, train in trains.items()}
    compiled, record = compiled_programs(runners, list(runners), keys, args.lowering_profile)
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
    return {"seeds": args.seeds, "updates": args.updates, "recurrent": args.recurrent,
            "brax": args.brax, "programs": record}


COMPARE_ONLY = ("total_timesteps", "python_api", "purejaxrl_first")
PROFILE_ONLY = ("updates", "top", "lowering_profile", "keep_trace")
"""The flags of one mode that the other refuses (the profile runs ours with JAX's default
lowering, compiled first, for a number of updates)."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", required=True, help="folder holding PureJaxRL's ppo.py")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--recurrent", action="store_true",
                        help="recurrent PPO against PureJaxRL's ppo_rnn.py")
    parser.add_argument("--brax", default=None, metavar="NAME",
                        help="PPO on brax/NAME against PureJaxRL's ppo_continuous_action.py")
    parser.add_argument("--total-timesteps", type=whole_number, default=None,
                        help="steps per seed (default 500000)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs of each program (default 5; 3 with --profile)")
    parser.add_argument("--python-api", action="store_true",
                        help="ours without the command line's Threefry lowering, as the "
                        "README's Python example runs it")
    parser.add_argument("--purejaxrl-first", action="store_true",
                        help="compile PureJaxRL's program first (on a TPU the second compile of "
                        "a process is faster)")
    parser.add_argument("--threads", type=int, default=0,
                        help="XLA:CPU thread-pool size (NPROC) for both; 0: XLA's default")
    parser.add_argument("--profile", action="store_true",
                        help="where the time goes: each program traced (the docstring says how)")
    parser.add_argument("--updates", type=whole_number, default=None,
                        help="--profile: updates each program runs (default 16; the trace "
                        "holds all of them)")
    parser.add_argument("--top", type=int, default=None,
                        help="--profile: device ops to keep per program (default 40)")
    parser.add_argument("--lowering-profile", action="store_true",
                        help="--profile: cProfile each program's lowering and print its "
                        "costliest calls")
    parser.add_argument("--keep-trace", default=None, metavar="DIR",
                        help="--profile: keep the traces (xplane.pb and trace.json.gz) under DIR")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/"
                        "vs_purejaxrl.json (_rnn with --recurrent, _brax-NAME with --brax); "
                        "profile_vs_purejaxrl.json with --profile")
    return parser


def parse_args(parser: argparse.ArgumentParser):
    """`parser`'s arguments, checked, with each mode's defaults filled in."""
    args = parser.parse_args()
    if args.recurrent and args.brax:
        parser.error("--recurrent and --brax compare different PureJaxRL files; pick one")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    defaults = parser.parse_args(["--reference", args.reference])
    refuse_other_mode(parser, args, defaults, "profile", PROFILE_ONLY, COMPARE_ONLY)
    if args.profile:
        args.updates, args.top = args.updates or 16, args.top or 40
        args.repeats = 3 if args.repeats is None else args.repeats
        args.out = args.out or "benchmarks/results/profile_vs_purejaxrl.json"
    else:
        args.total_timesteps = args.total_timesteps or 500_000
        args.repeats = 5 if args.repeats is None else args.repeats
        suffix = "_rnn" if args.recurrent else f"_brax-{args.brax}" if args.brax else ""
        args.out = args.out or f"benchmarks/results/vs_purejaxrl{suffix}.json"
    out_file(parser, args.out)
    if args.repeats < 1 or (args.profile and args.top < 1):
        parser.error("--repeats and --top must be at least 1")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        from jax._src import xla_bridge
        if xla_bridge.backends_are_initialized():
            parser.error("--threads: JAX's CPU backend has already started in this process")
        os.environ["NPROC"] = str(args.threads)  # read when the backend starts, later
    return args


def main():
    args = parse_args(make_parser())
    if args.profile:
        batch, _, _ = configs(10**9, args.recurrent, args.brax)  # only its batch size
        total_timesteps = args.updates * batch.batch_size
    else:
        total_timesteps = args.total_timesteps
    config, file, ref_config = configs(total_timesteps, args.recurrent, args.brax)
    reference = load_reference(args.reference, file)
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    figures = (profile if args.profile else side_by_side)(args, reference, config, ref_config,
                                                          keys)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "commit": source_commit(),
                   "jax": jax.__version__, "device": jax.devices()[0].device_kind, **figures},
                  f, indent=1)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    main()
