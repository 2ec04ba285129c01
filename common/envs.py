"""Environment creation and the facts about its spaces that every algorithm needs.

gymnax is imported inside `make_env`, not at the top: importing gymnax creates JAX arrays and
so starts the XLA backend, after which the number of CPU devices and `jax.distributed` can no
longer be set (`common/host/cli.py` sets them first). `check_env_id` knows every gymnax id
without importing gymnax, so a config can refuse an unknown id without starting JAX, and
`make_env` imports only the module of the environment it makes (a built-in one, while gymnax
itself is not imported), not all of them.
"""

import ast
import difflib
import functools
import importlib.machinery
import importlib.util
import os
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


MASKED = {"MaskedCartPole-v1": ("CartPole-v1", (0, 2)),
          "MaskedPendulum-v1": ("Pendulum-v1", (0, 1))}
"""Partially observable tasks: id -> (gymnax id, the observation entries kept). CartPole
keeps the cart position and pole angle of [x, x_dot, theta, theta_dot]; Pendulum the cosine
and sine of the angle of [cos theta, sin theta, theta_dot]. The velocities are hidden: a
policy must infer them from what it saw before (a recurrent policy's task)."""


BRAX_ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup",
             "inverted_pendulum", "inverted_double_pendulum", "pusher", "reacher", "swimmer",
             "walker2d")
"""Brax's environments, made as `brax/<name>` (`common/braxenv.py`; Brax is optional)."""
BRAX_BACKENDS = ("spring", "positional", "generalized", "mjx")
"""Brax's physics pipelines (`--brax-backend`), fastest and crudest first."""
BRAX_ONLY_ON = {"swimmer": ("generalized",)}
"""The Brax environments that run on some pipelines only (Brax's `swimmer.py` refuses every
other)."""


def known_env_ids() -> list[str]:
    """Every environment id: gymnax's (read from its registry if gymnax is imported, else
    from the id list in its `registration.py`, parsed without running it: no JAX starts),
    the velocity-hidden tasks of `MASKED`, Brax's as `brax/<name>`, then MuJoCo Playground's
    Control Suite as `playground/<Task>` (where Playground is installed)."""
    gymnax = list(sys.modules["gymnax"].registered_envs) if "gymnax" in sys.modules else \
        list(_builtins()[0])
    control = [f"playground/{t}" for t, s in playground_tasks().items()
               if s == "dm_control_suite"]
    return gymnax + list(MASKED) + [f"brax/{name}" for name in BRAX_ENVS] + control


class MaskedObservation:
    """A gymnax environment that shows only the entries `keep` of its observation vector
    (also in `info["final_observation"]` and the observation space); everything else, the
    state included, is the wrapped environment's."""

    def __init__(self, env, keep: tuple):
        self.env, self.keep = env, jnp.asarray(keep)

    def __getattr__(self, name):  # default_params, name, render settings, ...
        return getattr(self.env, name)

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        return obs[..., self.keep], state

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action,
                                                                        params)
        info = {**info, "final_observation": info["final_observation"][..., self.keep]}
        return obs[..., self.keep], state, reward, terminated, truncated, info

    def step_env(self, key, state, action, params):  # without the automatic reset
        obs, state, reward, terminated, info = self.env.step_env(key, state, action, params)
        return obs[..., self.keep], state, reward, terminated, info

    def observation_space(self, params):
        space = self.env.observation_space(params)
        low = jnp.broadcast_to(space.low, space.shape)[self.keep]
        high = jnp.broadcast_to(space.high, space.shape)[self.keep]
        return type(space)(low, high, (len(self.keep),), space.dtype)

    def action_space(self, params):
        return self.env.action_space(params)


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


@functools.cache
def _builtins() -> tuple[tuple[str, ...], dict]:
    """gymnax's built-in ids and, for each, `(module, class)` of its environment, read once
    from gymnax's `registration.py` (`_BUILTIN_ENV_IDS` and the `_builtins` table)."""
    spec = importlib.util.find_spec("gymnax")
    path = os.path.join(spec.submodule_search_locations[0], "registration.py")
    with open(path) as f:
        body = ast.parse(f.read()).body
    ids, modules, factories = None, {}, {}
    for node in body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gymnax."):
            modules.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        names = [getattr(t, "id", None) for t in targets]
        if "_BUILTIN_ENV_IDS" in names:
            ids = tuple(ast.literal_eval(node.value))
        if "_builtins" in names and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(value, ast.Attribute) and getattr(value.value, "id", None) in modules:
                    factories[ast.literal_eval(key)] = (modules[value.value.id], value.attr)
    if ids is None:  # another gymnax layout: ask it (this starts JAX)
        import gymnax

        return tuple(gymnax.registered_envs), {}
    return ids, factories


@functools.cache
def playground_tasks() -> dict[str, str]:
    """MuJoCo Playground's task names -> their registry (`dm_control_suite`, `locomotion`,
    `manipulation`), read from the `_envs` tables of its installed files without importing it
    (which starts JAX); empty where Playground is not installed."""
    spec = importlib.util.find_spec("mujoco_playground")
    names = {}
    for suite in ("dm_control_suite", "locomotion", "manipulation") if spec else ():
        path = os.path.join(spec.submodule_search_locations[0], "_src", suite, "__init__.py")
        with open(path) as f:
            for node in ast.parse(f.read()).body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                        any(getattr(t, "id", None) == "_envs" for t in node.targets):
                    names.update({ast.literal_eval(k): suite for k in node.value.keys})
    return names


def _import_without_package_inits(name: str):
    """`importlib.import_module(name)` without running the `__init__` of the packages above
    it. gymnax's import every environment, and with them matplotlib, seaborn and scipy.stats
    (about 2 s); one environment's module needs none of it. The packages stand in as bare
    modules while `name` loads and are removed afterwards, so a later `import gymnax` runs
    them as usual (and finds the modules loaded here)."""
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


def _make_gymnax(env_id: str):
    """`gymnax.make(env_id)`, importing only that environment's module where it can."""
    factory = _builtins()[1].get(env_id)
    if factory is None or "gymnax" in sys.modules:
        import gymnax

        return gymnax.make(env_id)
    module, name = factory
    env = getattr(_import_without_package_inits(module), name)()
    return env, env.default_params


MNIST_DIR = "/tmp/mnist"
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
"""gymnax's MNISTBandit-bsuite reads these from `MNIST_DIR`, downloading the missing ones."""


def check_env_id(env_id: str, brax_backend: str | None = None):
    """Raise `ValueError` naming the closest known ids when `env_id` is not a gymnax id, for
    an environment that would download data (MNISTBandit-bsuite without its files, a
    Playground robot without its models), and for a Brax environment that does not run on
    the physics pipeline `brax_backend` (`BRAX_ONLY_ON`; None: not checked)."""
    if env_id.startswith("playground/"):
        from common.playgroundenv import check_task

        return check_task(env_id.removeprefix("playground/"))
    known = known_env_ids()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown environment id {env_id!r}.{hint} Known ids: "
                         f"{', '.join(known)}.")
    if env_id.startswith("brax/") and importlib.util.find_spec("brax") is None:
        raise ValueError(f"{env_id} needs Brax, which is not installed: "
                         "pip install -e \".[brax]\"")
    if env_id.startswith("brax/") and brax_backend is not None:
        if brax_backend not in BRAX_BACKENDS:
            raise ValueError(f"--brax-backend must be one of {', '.join(BRAX_BACKENDS)}, got "
                             f"{brax_backend!r}.")
        only_on = BRAX_ONLY_ON.get(env_id.removeprefix("brax/"), BRAX_BACKENDS)
        if brax_backend not in only_on:
            raise ValueError(f"{env_id} runs on Brax's {' or '.join(only_on)} physics "
                             f"pipeline only, not {brax_backend}: pass --brax-backend "
                             f"{only_on[0]}.")
    missing = [f for f in MNIST_FILES if not os.path.isfile(os.path.join(MNIST_DIR, f))]
    if env_id == "MNISTBandit-bsuite" and missing:
        raise ValueError(f"{env_id} needs the MNIST files in {MNIST_DIR} (missing: "
                         f"{', '.join(missing)}), which gymnax would download from the "
                         "network; this toolkit never downloads: put them there first.")


def gymnax_spaces():
    """gymnax's `spaces` module (imported without gymnax's package init)."""
    return _import_without_package_inits("gymnax.environments.spaces")


def make_env(env_id: str, brax_backend: str = "positional"):
    """`(env, env_params, spec)` for a gymnax environment id, one of `MASKED`, `brax/<name>`
    (physics pipeline `brax_backend`) or `playground/<Task>`.

    Raises `ValueError` naming the closest known ids when `env_id` is unknown, or the problem
    and its fix for a Brax pipeline it does not run on, before anything is compiled. On an
    accelerator a Brax or Playground environment's reset and step are traced here, for the
    programs built later (`common.rollout.trace_ahead`).
    """
    check_env_id(env_id, brax_backend)
    if env_id.startswith("brax/"):
        from common.braxenv import BraxEnv

        env = BraxEnv(env_id.removeprefix("brax/"), brax_backend)
        env_params = env.default_params
    elif env_id.startswith("playground/"):
        from common.playgroundenv import PlaygroundEnv

        env = PlaygroundEnv(env_id.removeprefix("playground/"))
        env_params = env.default_params
    elif env_id in MASKED:
        base, keep = MASKED[env_id]
        env, env_params = _make_gymnax(base)
        env = MaskedObservation(env, keep)
    else:
        env, env_params = _make_gymnax(env_id)
    spaces = gymnax_spaces()
    obs_space = env.observation_space(env_params)
    action_space = env.action_space(env_params)
    if isinstance(action_space, spaces.Discrete):
        spec = EnvSpec(tuple(obs_space.shape), True, int(action_space.n), None, None)
    elif isinstance(action_space, spaces.Box) and len(action_space.shape) <= 1:
        dim = int(action_space.shape[0]) if action_space.shape else 1
        low = tuple(float(x) for x in jnp.broadcast_to(action_space.low, (dim,)))
        high = tuple(float(x) for x in jnp.broadcast_to(action_space.high, (dim,)))
        spec = EnvSpec(tuple(obs_space.shape), False, dim, low, high)
    else:
        raise ValueError(f"environment {env_id!r} has action space {action_space!r}; only "
                         "Discrete and one-dimensional Box action spaces are supported.")
    from common.rollout import trace_ahead  # (rollout imports this module)

    trace_ahead(env, env_params)  # an accelerator's speed-up, invisible in the numbers
    return env, env_params, spec


def to_env_action(action, spec: EnvSpec, action_shape: tuple):
    """Map a policy's action to what the environment accepts.

    Continuous actions are clipped to the space's bounds (the policy's log-probability is of the
    unclipped sample, as in CleanRL and Stable-Baselines3) and reshaped to the space's shape.
    """
    if spec.discrete:
        return action
    clipped = jnp.clip(action, jnp.asarray(spec.action_low), jnp.asarray(spec.action_high))
    return clipped.reshape(clipped.shape[:-1] + action_shape)
