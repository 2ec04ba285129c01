"""Side-by-side speed of our PPO and PureJaxRL's `ppo.py` on the identical config, or of our
PPO and Brax's own PPO trainer on a MuJoCo Playground task (`--playground`).

    git clone https://github.com/luchris429/purejaxrl /tmp/purejaxrl   # not vendored here
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --repeats 5
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --recurrent
    taskset -c 1 python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl \
        --brax hopper --seeds 4 --total-timesteps 400000 --repeats 2
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --seeds 1024   # each traced
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --brax ant --seeds 4 --updates 10
    python benchmarks/vs_purejaxrl.py --reference DIR --profile --brax ant --lowering-profile
    python benchmarks/vs_purejaxrl.py --playground CheetahRun --seeds 4 --repeats 3

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

`--playground TASK` compares our PPO with Brax's own PPO trainer (`brax.training.agents.ppo.train`),
as Playground trains its Control Suite: Playground's settings for TASK
(`dm_control_suite_params.brax_ppo_config`; `--set NAME=VALUE` changes one of them, e.g. the
sizes, for a CPU), its `wrap_for_brax_training`, MJX's JAX implementation. Ours gets the same
settings: Brax's `num_envs` environments, `unroll_length` x `batch_size` x `num_minibatches` /
`num_envs` steps each per update (the same transitions per update: Brax collects them as that
many unrolls of `unroll_length` steps), `num_minibatches`, `num_updates_per_batch` epochs, the
learning rate (constant), Adam's epsilon (1e-8), gamma, Brax's GAE lambda and clipping epsilon
(0.95, 0.3; no clipped value loss), the entropy cost, observations normalised, the task's
episode length. Rewards: Brax multiplies them by `reward_scaling` (10), ours divides them by
the running std of the discounted return (`--normalize-reward`, our Playground presets');
ours clips gradients to a global norm of 0.5, Brax's does not (its default). Both
have the same networks (`--networks`): `brax`, Brax's PPO default (policy 4 x 32, value 5 x 256,
swish; ours with `--hidden-size 32 --hidden-layers 4 --critic-hidden-size 256
--critic-hidden-layers 5 --activation swish`), or `ours`, our default (64 x 64 tanh, given to
Brax's `make_ppo_networks`). Their distributions differ (Brax's a tanh-squashed Gaussian with
a learned state-dependent scale, ours a Gaussian with a state-independent log-std, its actions
clipped), and so do their starts: Brax restarts a finished episode from the first state of its
environment and resets every environment after each update (Playground's cadence at its own
budget), ours draws fresh starts (`fresh_starts`) and lets episodes run to the time limit.
Both take the same number of steps: the budget rounded down to whole updates; Brax runs one
training step between resets, no evaluation (`run_evals=False`).

Brax's trainer takes one seed a call and compiles inside it. Its compile time is what JAX
reports compiling during the call (tracing, lowering and XLA, `jax.monitoring`'s events), its
training SPS the steps over the rest of the call (resets and its host loop included); Brax's
own figure, the median SPS of its training epochs after the first (no resets), is saved
beside it. Ours: `make_train`, the lowering and XLA's compile from cleared caches, then the
compiled program's calls. One seed: ours compiled, Brax's first call (its compile, from cleared
caches), then `--repeats` rounds of one call each, alternating. With `--seeds N` (N > 1): the
time to N seeds' results, Brax's N calls one after another against ours compiled and called
once, vmapped over the N seeds. Final returns: each final policy's deterministic return,
`common/evaluate.py` on the same 16 episodes for both (and ours' training return, the last 10%
of updates). brax 0.14 does not run on this project's pins as it is: the stand-ins it needs
are here (`brax_ppo_train`), never in the library.

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
import dataclasses
import functools
import glob
import gzip
import importlib.util
import inspect
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
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from algos.ppo import Config, make_train  # noqa: E402
from benchmarks.configs import (out_file, parse_overrides, refuse_other_mode,  # noqa: E402
                                source_commit, time_in_alternation)
from common.evaluate import evaluate  # noqa: E402
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


# --------------------------------------------------------------------------------------------
# --playground TASK: Brax's own PPO trainer against ours
# --------------------------------------------------------------------------------------------
BRAX_NETWORKS = dict(hidden_size=32, hidden_layers=4, critic_hidden_size=256,
                     critic_hidden_layers=5, activation="swish")
"""Our Config's network fields for Brax's PPO default networks (`make_ppo_networks`)."""
EVAL_EPISODES = 16
"""The episodes of each final policy's evaluation (`--eval-episodes`' default)."""
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
"""What JAX reports for each program it makes: tracing, lowering, XLA's compile."""


class CompileClock:
    """The seconds JAX has spent making programs in this process (`COMPILE_EVENTS`)."""

    def __init__(self):
        self.total = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if event in COMPILE_EVENTS:
            self.total += duration


def _no_checkpoints(*args, **kwargs):
    raise NotImplementedError("this comparison runs Brax's PPO without orbax: no checkpoints")


def brax_ppo_train():
    """Brax's `ppo.train` module, runnable on this project's pins. Its checkpoint module imports
    orbax, which is not installed here: a stub stands in (nothing here saves a checkpoint).
    jax 0.10 removed `jax.device_put_replicated`, which it calls once, for its training state:
    the stand-in set on the jax module puts `x` on each device along a new leading axis, a
    pmap named as Brax's own (`_PMAP_AXIS_NAME`), so that the state has the sharding Brax's
    training epoch gives back and that program compiles once, not twice (pmap's cache tells
    arrays apart by their sharding, mesh axis names included)."""
    stub = types.ModuleType("brax.training.agents.ppo.checkpoint")
    stub.save = stub.load = stub.network_config = _no_checkpoints
    sys.modules.setdefault("brax.training.agents.ppo.checkpoint", stub)
    from brax.training.agents.ppo import train as ppo_train

    if not hasattr(jax, "device_put_replicated"):
        replicate = jax.pmap(lambda x, _: x, in_axes=(None, 0),
                             axis_name=ppo_train._PMAP_AXIS_NAME)
        jax.device_put_replicated = lambda x, devices: replicate(x, np.arange(len(devices)))
    return ppo_train


def playground_configs(task: str, total_timesteps: int, overrides: dict, networks: str):
    """`(config, brax_kwargs, settings)`: our PPO's `Config` and the arguments of Brax's
    `ppo.train` for the same run of `playground/TASK` at Playground's settings (`overrides`
    applied), `total_timesteps` rounded down to whole updates (at least one); `settings`:
    Playground's settings as run."""
    from brax.training.agents.ppo import networks as ppo_networks
    from mujoco_playground.config import dm_control_suite_params

    ppo_train = brax_ppo_train()
    settings = dm_control_suite_params.brax_ppo_config(task).to_dict()
    unknown = sorted(set(overrides) - set(settings))
    if unknown:
        raise SystemExit(f"error: --set {unknown[0]} is not one of Playground's settings for "
                         f"{task}: {', '.join(settings)}.")
    settings.update(overrides)
    if settings["action_repeat"] != 1:
        raise SystemExit(f"error: {task} repeats each action {settings['action_repeat']} "
                         "times; our PPO has no action repeat.")
    unrolls, rest = divmod(settings["batch_size"] * settings["num_minibatches"],
                           settings["num_envs"])
    if rest:
        raise SystemExit("error: batch_size x num_minibatches must be a multiple of num_envs "
                         "(Brax's PPO asks it).")
    num_steps = unrolls * settings["unroll_length"]
    batch = settings["num_envs"] * num_steps
    updates = max(1, total_timesteps // batch)
    default = {k: v.default for k, v in inspect.signature(ppo_train.train).parameters.items()}
    layers = {"brax": dict(policy_hidden_layer_sizes=(32,) * 4,
                           value_hidden_layer_sizes=(256,) * 5, activation="swish"),
              "ours": dict(policy_hidden_layer_sizes=(64,) * 2,
                           value_hidden_layer_sizes=(64,) * 2, activation="tanh")}[networks]
    activation = getattr(jax.nn, layers["activation"])
    brax_kwargs = dict(
        num_timesteps=updates * batch, num_evals=updates + 1, num_resets_per_eval=1,
        run_evals=False,  # one training step, then every environment reset, per update
        network_factory=functools.partial(ppo_networks.make_ppo_networks,
                                          **{**layers, "activation": activation}),
        **{k: settings[k] for k in ("num_envs", "batch_size", "num_minibatches",
                                    "unroll_length", "num_updates_per_batch", "learning_rate",
                                    "entropy_cost", "discounting", "reward_scaling",
                                    "normalize_observations", "episode_length",
                                    "action_repeat")})
    config = Config(
        env_id=f"playground/{task}", total_timesteps=updates * batch,
        num_envs=settings["num_envs"], num_steps=num_steps,
        num_minibatches=settings["num_minibatches"],
        update_epochs=settings["num_updates_per_batch"],
        learning_rate=settings["learning_rate"], anneal_lr=False, opt_eps=1e-8,
        gamma=settings["discounting"], gae_lambda=default["gae_lambda"],
        clip_coef=default["clipping_epsilon"], clip_vloss=False,
        ent_coef=settings["entropy_cost"], vf_coef=default["vf_loss_coefficient"],
        normalize_obs=settings["normalize_observations"], normalize_reward=True,
        **(BRAX_NETWORKS if networks == "brax" else {}))
    return config, brax_kwargs, {**settings, "networks": {**layers}}


def brax_run(ppo_train, env, brax_kwargs: dict, seed: int, clock: CompileClock) -> dict:
    """One call of Brax's `ppo.train`: its seconds, the part of them JAX spent compiling, its
    training epochs' own SPS, and what it returned (`make_policy`, `params`)."""
    from mujoco_playground import wrapper

    epochs = []
    compiled_before, start = clock.total, time.perf_counter()
    make_policy, params, _ = ppo_train.train(
        environment=env, wrap_env_fn=wrapper.wrap_for_brax_training, seed=seed,
        progress_fn=lambda step, metrics: epochs.append(float(metrics["training/sps"])),
        **brax_kwargs)
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    compile_s = clock.total - compiled_before
    return {"seconds": seconds, "compile_s": compile_s, "train_s": seconds - compile_s,
            "epoch_sps": statistics.median(epochs[1:] or epochs),
            "make_policy": make_policy, "params": params}


def eval_returns(act, env_triple, states, vmapped: bool, episodes: int) -> list:
    """Each final policy's deterministic return (`common/evaluate.py`), the mean over
    `episodes` episodes (none: `[]`, nothing compiled); `act(state, obs, first, hidden)`,
    `states` one or (`vmapped`) stacked along a leading axis."""
    if not episodes:
        return []
    env, env_params, spec = env_triple

    def returns(state):
        return evaluate(functools.partial(act, state), env, env_params, spec,
                        jax.random.PRNGKey(1), episodes)[0].mean()

    fn = jax.jit(jax.vmap(returns) if vmapped else returns)
    return np.atleast_1d(np.asarray(fn(states), np.float64)).round(2).tolist()


def playground_side_by_side(args) -> dict:
    """`--playground`: Brax's own PPO and ours (the module docstring says how); prints the
    figures and returns the JSON record's."""
    clock = CompileClock()
    ppo_train = brax_ppo_train()
    config, brax_kwargs, settings = playground_configs(
        args.playground, args.total_timesteps, parse_overrides(args.set), args.networks)
    steps = config.num_updates * config.batch_size
    print(f"{args.playground}: {config.num_updates} updates of {config.batch_size:,} steps "
          f"({steps:,} a seed), {args.networks} networks", flush=True)
    from mujoco_playground import registry

    env = registry.load(args.playground, config_overrides={"impl": "jax"})

    def ours_compiled(keys):
        """Ours from cleared caches: `(train, compiled, seconds, compile events' seconds)`."""
        unroll_threefry_on_cpu(not args.python_api)
        jax.clear_caches()
        before, start = clock.total, time.perf_counter()
        train = make_train(config)
        compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
        unroll_threefry_on_cpu(False)  # Brax's programs, compiled in its calls: JAX's default
        return train, compiled, time.perf_counter() - start, clock.total - before

    # ONE SEED: both compiled (Brax's first call), then calls in alternation
    key = jax.random.split(jax.random.PRNGKey(0), 1)
    train, ours, ours_compile, ours_events = ours_compiled(key)
    print(f"compiled ours in {ours_compile:.1f}s", flush=True)
    jax.clear_caches()
    first = brax_run(ppo_train, env, brax_kwargs, 0, clock)
    print(f"Brax's first call: {first['seconds']:.1f}s, compiling {first['compile_s']:.1f}s",
          flush=True)
    jax.block_until_ready(ours(key))  # its first call, untimed (first touches of memory)
    sps = {"ours": [], "brax": []}
    brax_epoch_sps, brax_calls = [], []
    for i in range(args.repeats):
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(ours(key))
        sps["ours"].append(steps / (time.perf_counter() - start))
        run = brax_run(ppo_train, env, brax_kwargs, 0, clock)
        sps["brax"].append(steps / run["train_s"])
        brax_epoch_sps.append(run["epoch_sps"])
        brax_calls.append({k: round(run[k], 2) for k in ("seconds", "compile_s", "train_s")})
        print(f"run {i + 1}/{args.repeats}: ours {sps['ours'][-1]:,.0f} SPS, Brax "
              f"{sps['brax'][-1]:,.0f} SPS ({run['seconds']:.1f}s, compiling "
              f"{run['compile_s']:.1f}s; its epochs {run['epoch_sps']:,.0f} SPS)", flush=True)

    env_triple = train.env
    make_policy = run["make_policy"]  # every call's: the same networks
    brax_act = lambda params, obs, first, hidden: (  # noqa: E731
        make_policy(params, deterministic=True)(obs, jax.random.PRNGKey(0))[0], hidden)
    episodes = args.eval_episodes
    returns = {"ours": eval_returns(train.act, env_triple, state, True, episodes),
               "brax": eval_returns(brax_act, env_triple, run["params"], False, episodes)}
    median = {name: statistics.median(v) for name, v in sps.items()}
    compile_s = {"ours": ours_compile, "brax": first["compile_s"]}
    for name in ("ours", "brax"):
        print(f"{name:5s} compile {compile_s[name]:6.1f}s | median SPS {median[name]:10,.0f} "
              f"over {args.repeats} runs | final return (deterministic, {episodes} "
              f"episodes) {returns[name][0] if episodes else 'not evaluated'}")
    print(f"speed ratio ours / Brax (medians): {median['ours'] / median['brax']:.2f}x; compile "
          f"ratio: {compile_s['ours'] / compile_s['brax']:.2f}x")
    record = {
        "playground": args.playground, "networks": args.networks, "seeds": args.seeds,
        "steps_per_seed": steps, "settings": settings,
        "brax_train": {k: v for k, v in brax_kwargs.items() if k != "network_factory"},
        "ours": dataclasses.asdict(config),
        "compile_s": compile_s, "ours_compile_events_s": ours_events,
        "brax_first_call": {k: round(first[k], 2) for k in ("seconds", "compile_s", "train_s")},
        "sps": sps, "brax_epoch_sps": brax_epoch_sps, "brax_calls": brax_calls,
        "eval_return": returns,
        "train_return": {"ours": np.asarray(final_return(metrics["episodic_return"])).tolist()},
    }
    if args.seeds > 1:  # N SEEDS: ours vmapped in one call, Brax's calls one after another
        keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
        start = time.perf_counter()
        train, ours, compiled_s, _ = ours_compiled(keys)
        states, metrics = jax.block_until_ready(ours(keys))
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        runs = [brax_run(ppo_train, env, brax_kwargs, seed, clock) for seed in range(args.seeds)]
        brax_s = time.perf_counter() - start
        print(f"{args.seeds} seeds' results: ours {ours_s:.1f}s (compiling {compiled_s:.1f}s), "
              f"Brax {brax_s:.1f}s ({args.seeds} calls): {brax_s / ours_s:.2f}x", flush=True)
        record["seeds_race"] = {
            "seconds": {"ours": ours_s, "brax": brax_s}, "ours_compile_s": compiled_s,
            "brax_calls": [{k: round(r[k], 2) for k in ("seconds", "compile_s", "train_s")}
                           for r in runs],
            "eval_return": {
                "ours": eval_returns(train.act, env_triple, states, True, episodes),
                "brax": eval_returns(brax_act, env_triple, jax.tree.map(
                    lambda *x: jnp.stack(x), *[r["params"] for r in runs]), True, episodes)},
            "train_return": {"ours": np.asarray(
                final_return(metrics["episodic_return"])).tolist()},
        }
        print(f"final returns (deterministic): ours {record['seeds_race']['eval_return']['ours']}"
              f", Brax {record['seeds_race']['eval_return']['brax']}")
    return record


COMPARE_ONLY = ("total_timesteps", "python_api", "purejaxrl_first")
PROFILE_ONLY = ("updates", "top", "lowering_profile", "keep_trace")
"""The flags of one mode that the other refuses (the profile runs ours with JAX's default
lowering, compiled first, for a number of updates)."""
PLAYGROUND_ONLY = ("networks", "set", "eval_episodes")
PUREJAXRL_ONLY = ("reference", "recurrent", "brax", "purejaxrl_first", "profile")
"""The flags of the comparison with Brax's PPO (`--playground`), and those it refuses."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", default=None,
                        help="folder holding PureJaxRL's ppo.py (all but --playground)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="vmapped seeds; --playground: also the time to this many seeds' "
                        "results (Brax's one after another)")
    parser.add_argument("--recurrent", action="store_true",
                        help="recurrent PPO against PureJaxRL's ppo_rnn.py")
    parser.add_argument("--brax", default=None, metavar="NAME",
                        help="PPO on brax/NAME against PureJaxRL's ppo_continuous_action.py")
    parser.add_argument("--playground", default=None, metavar="TASK",
                        help="PPO on playground/TASK against Brax's own PPO trainer, at "
                        "Playground's settings")
    parser.add_argument("--networks", choices=("brax", "ours"), default="brax",
                        help="--playground: both with Brax's PPO networks (policy 4x32, value "
                        "5x256, swish) or with ours (64x64 tanh)")
    parser.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES, metavar="N",
                        help="--playground: episodes of each final policy's deterministic "
                        f"evaluation (default {EVAL_EPISODES}; 0: none, nothing more compiled)")
    parser.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                        help="--playground: change Playground's settings (brax_ppo_config), "
                        "e.g. num_envs=16 batch_size=32 num_minibatches=8")
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
    defaults = parser.parse_args([])
    refuse_other_mode(parser, args, defaults, "playground", PLAYGROUND_ONLY, PUREJAXRL_ONLY)
    if not args.playground and not args.reference:
        parser.error("--reference DIR (the folder holding PureJaxRL's ppo.py) is required, "
                     "except with --playground")
    refuse_other_mode(parser, args, defaults, "profile", PROFILE_ONLY, COMPARE_ONLY)
    if args.profile:
        args.updates, args.top = args.updates or 16, args.top or 40
        args.repeats = 3 if args.repeats is None else args.repeats
        args.out = args.out or "benchmarks/results/profile_vs_purejaxrl.json"
    else:
        args.total_timesteps = args.total_timesteps or 500_000
        args.repeats = 5 if args.repeats is None else args.repeats
        suffix = "_rnn" if args.recurrent else f"_brax-{args.brax}" if args.brax else ""
        args.out = args.out or (
            f"benchmarks/results/vs_brax_ppo__{args.playground}__{args.networks}-networks.json"
            if args.playground else f"benchmarks/results/vs_purejaxrl{suffix}.json")
    out_file(parser, args.out)
    if args.eval_episodes < 0:
        parser.error(f"--eval-episodes must be 0 (none) or more, got {args.eval_episodes}")
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
    if args.playground:
        figures = playground_side_by_side(args)
        save(args, figures)
        return
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
    save(args, figures)


def save(args, figures: dict):
    """The raw results file: the command, the commit, the device and `figures`."""
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "commit": source_commit(),
                   "jax": jax.__version__, "device": jax.devices()[0].device_kind, **figures},
                  f, indent=1)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    main()
