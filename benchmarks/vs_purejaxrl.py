"""Side-by-side speed of our PPO and PureJaxRL's `ppo.py` on the identical config.

    git clone https://github.com/luchris429/purejaxrl /tmp/purejaxrl   # not vendored here
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --repeats 5
    python benchmarks/vs_purejaxrl.py --reference /tmp/purejaxrl/purejaxrl --recurrent

`--recurrent` compares recurrent PPO with PureJaxRL's `ppo_rnn.py` instead, on its own config
(CartPole, 4 envs x 128 steps, a 128-unit GRU after a 128-unit ReLU embedding, 128-unit ReLU
heads): ours with `--network gru --hidden-size 128 --activation relu`. The one difference in
work is ours: a truncated episode bootstraps from V of its final observation (one more GRU
step per transition, in parallel), where `ppo_rnn.py` treats every `done` as terminal.

Both run in this one process, `jit(vmap(train))` over the same number of seeds, compiled
first, then timed in alternation (ours, theirs, ours, ...) so that machine noise hits both
alike. Prints compile time, median SPS of each and the ratio of the medians, plus the final
returns so that speed is not bought with learning. Saves the raw timings as JSON.

Ours runs as our command line does, with the Threefry lowering it selects on CPU
(`common/host/prng.py`). PureJaxRL runs as shipped (JAX's default lowerings), and once more
compiled with that lowering, so the output also shows how much of the ratio that one switch is.

`--threads N` sets XLA:CPU's thread pool to N threads (`NPROC`, read when JAX starts its CPU
backend) for both libraries; 0 keeps XLA's default, one per core. On a small program the pool
costs time: XLA:CPU runs the kernels on the calling thread and, whenever more than 8 are ready
at once, hands half of them to the pool, waking a thread (`docs/performance.md`;
`benchmarks/cpu_executor.py` shows where). `taskset -c 1 python ...` pins the whole
process to one core, which also leaves a one-thread pool.

PureJaxRL targets the gymnax 0.0.x step API (`done` in one flag); a small adapter below gives it
that view of gymnax 1.0 (`done = terminated or truncated`, PureJaxRL's own semantics), and
stub modules stand in for the optional `brax`/`navix` imports of its `wrappers.py`, which the
CartPole path never uses. `ppo_rnn.py` calls flax's `GRUCell` as flax 0.7 did (no `features`,
`initialize_carry(key, batch, size)`); the adapter supplies the 128 units and the zero carry
that call meant.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from algos.ppo import Config, make_train  # noqa: E402
from benchmarks.configs import source_commit  # noqa: E402
from common.host.logger import final_return  # noqa: E402
from common.host.prng import unroll_threefry_on_cpu  # noqa: E402


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
    for name in ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training", "navix"):
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", required=True, help="folder holding PureJaxRL's ppo.py")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="XLA:CPU thread-pool size (NPROC) for both; 0: XLA's default")
    parser.add_argument("--recurrent", action="store_true",
                        help="recurrent PPO against PureJaxRL's ppo_rnn.py")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/"
                        "vs_purejaxrl.json (vs_purejaxrl_rnn.json with --recurrent)")
    args = parser.parse_args()
    if args.out is None:
        args.out = "benchmarks/results/vs_purejaxrl" + ("_rnn" if args.recurrent else "") + ".json"
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        from jax._src import xla_bridge
        if xla_bridge.backends_are_initialized():
            parser.error("--threads: JAX's CPU backend has already started in this process")
        os.environ["NPROC"] = str(args.threads)  # read when the backend starts, below

    recurrent = dict(network="gru", hidden_size=128, activation="relu") if args.recurrent else {}
    config = Config(total_timesteps=args.total_timesteps, **recurrent)
    reference = load_reference(args.reference, "ppo_rnn.py" if args.recurrent else "ppo.py")
    ref_config = {
        "LR": config.learning_rate, "NUM_ENVS": config.num_envs, "NUM_STEPS": config.num_steps,
        "TOTAL_TIMESTEPS": config.total_timesteps, "UPDATE_EPOCHS": config.update_epochs,
        "NUM_MINIBATCHES": config.num_minibatches, "GAMMA": config.gamma,
        "GAE_LAMBDA": config.gae_lambda, "CLIP_EPS": config.clip_coef,
        "ENT_COEF": config.ent_coef, "VF_COEF": config.vf_coef,
        "MAX_GRAD_NORM": config.max_grad_norm, "ACTIVATION": config.activation,
        "ENV_NAME": config.env_id, "ANNEAL_LR": config.anneal_lr, "DEBUG": False,
    }
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    # Ours runs as our command line does, with Threefry lowered without its CPU loop
    # (common/host/prng.py, the same bits); PureJaxRL as shipped uses JAX's default.
    # "purejaxrl+unrolled" is PureJaxRL compiled with our lowering, to show what that part buys.
    runners = {
        "ours": (make_train(config), True),
        "purejaxrl": (reference.make_train(ref_config), False),
        "purejaxrl+unrolled": (reference.make_train(ref_config), True),
    }
    compiled, compile_s = {}, {}
    for name, (train, unrolled) in runners.items():
        unroll_threefry_on_cpu(unrolled)
        start = time.perf_counter()
        compiled[name] = jax.jit(jax.vmap(train)).lower(keys).compile()
        compile_s[name] = time.perf_counter() - start
    unroll_threefry_on_cpu(True)

    steps = config.num_updates * config.batch_size * args.seeds
    sps = {name: [] for name in runners}
    returns = {}
    for _ in range(args.repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            out = jax.block_until_ready(fn(keys))
            sps[name].append(steps / (time.perf_counter() - start))
            if name == "ours":
                returns[name] = final_return(out[1]["episodic_return"])
            else:
                info = out["metric" if args.recurrent else "metrics"]
                per_update = np.nansum(np.where(info["returned_episode"], info["returned_episode_returns"], 0), axis=(-2, -1)) \
                    / np.sum(info["returned_episode"], axis=(-2, -1))
                returns[name] = final_return(per_update)

    median = {name: statistics.median(v) for name, v in sps.items()}
    for name in runners:
        print(f"{name:10s} compile {compile_s[name]:5.2f}s | median SPS {median[name]:12,.0f} "
              f"over {args.repeats} runs | final return mean {np.mean(returns[name]):.1f}")
    print(f"speed ratio ours / purejaxrl (medians): {median['ours'] / median['purejaxrl']:.2f}x; "
          f"compile ratio: {compile_s['ours'] / compile_s['purejaxrl']:.2f}x")
    print(f"speed ratio ours / purejaxrl+unrolled (medians): "
          f"{median['ours'] / median['purejaxrl+unrolled']:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "commit": source_commit(), "jax": jax.__version__,
                   "threads": args.threads or "default", "cpus": cpus,
                   "recurrent": args.recurrent,
                   "seeds": args.seeds, "sps": sps, "compile_s": compile_s,
                   "final_return": {k: np.asarray(v).tolist() for k, v in returns.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
