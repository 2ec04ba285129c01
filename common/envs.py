"""Environment creation and the facts about its spaces that every algorithm needs.

gymnax is imported inside `make_env`, not at the top: importing gymnax creates JAX arrays and
so starts the XLA backend, after which the number of CPU devices and `jax.distributed` can no
longer be set (`common/host/cli.py` sets them first). `check_env_id` knows every gymnax id
without importing gymnax, so a config can refuse an unknown id without starting JAX.
"""

import ast
import difflib
import functools
import importlib.util
import os
import sys
from typing import NamedTuple

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


def known_env_ids() -> list[str]:
    """Every gymnax environment id. Read from gymnax's registry if gymnax is imported, else
    from the id list in its `registration.py`, parsed without running it (no JAX starts)."""
    if "gymnax" in sys.modules:
        return list(sys.modules["gymnax"].registered_envs)
    return list(_builtin_env_ids())


@functools.cache
def _builtin_env_ids() -> tuple[str, ...]:
    """gymnax's built-in ids from its `registration.py`, read once."""
    spec = importlib.util.find_spec("gymnax")
    path = os.path.join(spec.submodule_search_locations[0], "registration.py")
    with open(path) as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", None) == "_BUILTIN_ENV_IDS" for t in node.targets):
                return tuple(ast.literal_eval(node.value))
    import gymnax  # another gymnax layout: ask it (this starts JAX)

    return tuple(gymnax.registered_envs)


def check_env_id(env_id: str):
    """Raise `ValueError` naming the closest known ids when `env_id` is not a gymnax id."""
    known = known_env_ids()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown environment id {env_id!r}.{hint} Known gymnax ids: "
                         f"{', '.join(known)}.")


def make_env(env_id: str):
    """`(env, env_params, spec)` for a gymnax environment id.

    Raises `ValueError` naming the closest known ids when `env_id` is unknown, before anything is
    compiled.
    """
    check_env_id(env_id)
    import gymnax
    from gymnax.environments import spaces

    env, env_params = gymnax.make(env_id)
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
