"""Environment creation and the facts about its spaces that every algorithm needs.

gymnax is imported inside `make_env`, not at the top: importing gymnax creates JAX arrays and
so starts the XLA backend, after which the number of CPU devices and `jax.distributed` can no
longer be set (`common/cli.py` sets them first).
"""

import difflib
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


def make_env(env_id: str):
    """`(env, env_params, spec)` for a gymnax environment id.

    Raises `ValueError` naming the closest known ids when `env_id` is unknown, before anything is
    compiled.
    """
    import gymnax
    from gymnax.environments import spaces

    if env_id not in gymnax.registered_envs:
        close = difflib.get_close_matches(env_id, gymnax.registered_envs, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"unknown environment id {env_id!r}.{hint} Known gymnax ids: "
            f"{', '.join(gymnax.registered_envs)}."
        )
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
