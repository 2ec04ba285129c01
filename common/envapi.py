"""The environment interface: gymnax's, which every backend's adapter gives its environments.

An environment has `reset(key, params) -> (obs, state)`, `step(key, state, action, params) ->
(obs, state, reward, terminated, truncated, info)` (an automatic reset, and the observation
reached in `info["final_observation"]`), and `observation_space(params)` / `action_space(params)`
as gymnax `spaces`; a physics backend's also `step_env` and `is_truncated` (a step without the
reset, `TimeLimitAutoReset`) and the rollout's defaults `fresh_starts` and `keeps_keys`.

The layers: this module imports nothing of the project; one adapter per backend above it
(`gymnaxenv.py`, `maskedenv.py`, `braxenv.py`, `playgroundenv.py`); the factory `envs.py` on
top. The rollout and evaluation use this module only. `per_env` and `trace_ahead` live here,
not in `rollout.py`: `make_env` traces an environment ahead into the cache of jitted functions
that the rollout then reads, so both need that cache, and neither needs the other.
"""

import functools
import importlib.machinery
import importlib.util
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp


class EnvSpec(NamedTuple):
    """What a network and a loss need to know about an environment."""

    obs_shape: tuple
    """Shape of one observation (after casting to float32)."""
    discrete: bool
    """True for a `Discrete` action space, False for a `Box`."""
    action_dim: int
    """Number of actions (discrete) or size of the action vector (continuous)."""
    action_low: tuple | None
    """Lower bounds of a continuous action space (one per dimension), else None."""
    action_high: tuple | None
    """Upper bounds of a continuous action space, else None."""

    @property
    def image_obs(self) -> bool:
        """Observations are H x W x C images (MinAtar): use a convolutional torso."""
        return len(self.obs_shape) == 3


class UnknownEnvId(LookupError):
    """Raised by a backend's `check` for an id it does not have: the factory names the closest
    ids of every backend."""


def env_spec(env_id: str, env, env_params) -> EnvSpec:
    """The `EnvSpec` of `env`, read from its gymnax spaces; `ValueError` for an action space
    other than `Discrete` and a one-dimensional `Box`."""
    spaces = gymnax_spaces()
    obs_space = env.observation_space(env_params)
    action_space = env.action_space(env_params)
    if isinstance(action_space, spaces.Discrete):
        return EnvSpec(tuple(obs_space.shape), True, int(action_space.n), None, None)
    if isinstance(action_space, spaces.Box) and len(action_space.shape) <= 1:
        dim = int(action_space.shape[0]) if action_space.shape else 1
        low = tuple(float(x) for x in jnp.broadcast_to(action_space.low, (dim,)))
        high = tuple(float(x) for x in jnp.broadcast_to(action_space.high, (dim,)))
        return EnvSpec(tuple(obs_space.shape), False, dim, low, high)
    raise ValueError(f"environment {env_id!r} has action space {action_space!r}; only "
                     "Discrete and one-dimensional Box action spaces are supported.")


def to_env_action(action, spec: EnvSpec, action_shape: tuple):
    """Map a policy's action to what the environment accepts.

    Continuous actions are clipped to the space's bounds (the policy's log-probability is of the
    unclipped sample, as in CleanRL and Stable-Baselines3) and reshaped to the space's shape.
    """
    if spec.discrete:
        return action
    clipped = jnp.clip(action, jnp.asarray(spec.action_low), jnp.asarray(spec.action_high))
    return clipped.reshape(clipped.shape[:-1] + action_shape)


class TimeLimitAutoReset:
    """gymnax's `is_truncated` and auto-resetting `step` for a wrapper (Brax, Playground) that
    defines `reset(key, params)`, `step_env(key, state, action, params)` (one step, no reset)
    and a state with a step counter `time`, truncated at `params.max_steps_in_episode`."""

    def is_truncated(self, state, params=None):
        params = self.default_params if params is None else params
        return state.time >= params.max_steps_in_episode

    def step(self, key, state, action, params=None):
        """One step; where the episode ended (terminated, or truncated by the time limit), a
        fresh start drawn with `key`, and the observation reached in
        `info["final_observation"]`."""
        params = self.default_params if params is None else params
        reached_obs, state, reward, terminated, _ = self.step_env(key, state, action, params)
        truncated = jnp.logical_and(self.is_truncated(state, params), ~terminated)
        done = jnp.logical_or(terminated, truncated)
        reset_obs, reset_state = self.reset(key, params)
        state = jax.tree.map(lambda fresh, kept: jnp.where(done, fresh, kept), reset_state, state)
        obs = jnp.where(done, reset_obs, reached_obs)
        return obs, state, reward, terminated, truncated, {"final_observation": reached_obs}


def gymnax_spaces():
    """gymnax's `spaces` module (imported without gymnax's package init)."""
    return import_without_package_inits("gymnax.environments.spaces")


def import_without_package_inits(name: str):
    """`importlib.import_module(name)` without running the `__init__` of the packages above
    it. gymnax's import every environment, and with them matplotlib, seaborn and scipy.stats
    (about 2 s); one environment's module needs none of it. The packages stand in as bare
    modules while `name` loads and are removed afterwards, so a later `import gymnax` runs
    them as usual, finds the modules loaded here, and (`_BindStoodIn`) binds them as the
    packages' attributes, as if it had loaded them itself."""
    if name in sys.modules:
        return sys.modules[name]
    added, path = [], None
    try:
        parts = name.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package not in sys.modules:
                spec = importlib.machinery.PathFinder.find_spec(package, path)
                sys.modules[package] = importlib.util.module_from_spec(spec)
                added.append(package)
            path = sys.modules[package].__path__
        return importlib.import_module(name)
    finally:
        for package in added:
            sys.modules.pop(package, None)
        _BindStoodIn.packages.update(added)
        if added and _BindStoodIn not in sys.meta_path:
            sys.meta_path.insert(0, _BindStoodIn)


class _BindStoodIn:
    """An import finder for the packages `import_without_package_inits` stood in for, nothing
    else. Python binds a module as its package's attribute only when it loads the module, so
    after a real `import gymnax` the modules loaded under the stand-ins would be missing as
    attributes (`gymnax.environments.spaces`); this binds them once the package has run."""

    packages = set()

    @classmethod
    def find_spec(cls, name, path, target=None):
        if name not in cls.packages:
            return None
        cls.packages.discard(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for child, loaded in list(sys.modules.items()):
                parent, _, attr = child.rpartition(".")
                if parent == name and not hasattr(module, attr):
                    setattr(module, attr, loaded)

        spec.loader.exec_module = exec_module  # this spec's own loader
        return spec


def per_env(fn, env_params):
    """`fn(*args, env_params)` over a batch of environments: `jax.vmap(fn, in_axes=(0, ...,
    None))` with `fn` traced for one environment under `jax.jit`.

    The same computation, faster to build: JAX traces the environment's Python once and
    batches the traced program, instead of running each of its (for Brax, thousands of)
    operations through vmap's tracer: PPO's Brax Ant program lowered in 4.1 s instead of 6.2 s
    on a CPU. The inlined jit may round a few results differently in the last bit. One jitted
    function serves every call with the same `fn` and (hashable) `env_params`, so that every
    reset and step of a process traces the environment once for each input shape.
    """
    return jax.vmap(jitted(fn, env_params))


@functools.lru_cache(maxsize=32)
def _cached_jit(fn, env_params):
    def one_env(*args):
        return fn(*args, env_params)
    one_env.__name__ = getattr(fn, "__name__", "env")  # the program's name for it: "reset", ...
    return jax.jit(one_env)


def jitted(fn, env_params):
    """`jax.jit(fn(*args, env_params))`, one per `(fn, env_params)` where both hash (a bound
    method hashes by its object: gymnax's, Brax's, Playground's environments do)."""
    try:
        return _cached_jit(fn, env_params)
    except TypeError:  # parameters that hold arrays: a function of its own
        return _cached_jit.__wrapped__(fn, env_params)


def trace_ahead(env, env_params):
    """On an accelerator, trace one environment's `env.reset` and `env.step_env` now, outside
    any program, for an environment with a pool by default (Brax, Playground; no-op
    elsewhere, and on a CPU).

    `per_env`'s jitted functions keep these traces, and the programs built later reuse them
    instead of tracing the physics inside a `vmap` over seeds of nested scans, where each of
    JAX's operations costs more: on a TPU v5e's host PPO's Brax Ant program lowered in 16.1 s
    with this call against 21.2 s without; on a CPU it gained nothing (docs/performance.md).
    The shapes are the rollout's there (raw uint32 keys, float32 actions).
    """
    if jax.default_backend() == "cpu" or getattr(env, "fresh_starts", 1.0) >= 1:
        return
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    _, state = jitted(env.reset, env_params).trace(key).out_info
    action = jax.ShapeDtypeStruct(env.action_space(env_params).shape, jnp.float32)
    jitted(env.step_env, env_params).trace(key, state, action)
