"""The velocity-hidden tasks of `MASKED`, made from gymnax's environments: the adapter
`common/envs.py` uses for the ids that begin `Masked` (`ids`, `check`, `make`)."""

import jax.numpy as jnp

from common import gymnaxenv
from common.envapi import UnknownEnvId

MASKED = {"MaskedCartPole-v1": ("CartPole-v1", (0, 2)),
          "MaskedPendulum-v1": ("Pendulum-v1", (0, 1))}
"""Partially observable tasks: id -> (gymnax id, the observation entries kept). CartPole
keeps the cart position and pole angle of [x, x_dot, theta, theta_dot]; Pendulum the cosine
and sine of the angle of [cos theta, sin theta, theta_dot]. The velocities are hidden: a
policy must infer them from what it saw before (a recurrent policy's task)."""


def ids() -> list[str]:
    """The ids of `MASKED`."""
    return list(MASKED)


def check(env_id: str, brax_backend: str | None = None):
    """`UnknownEnvId` for an id not in `MASKED` (`brax_backend` is not used)."""
    if env_id not in MASKED:
        raise UnknownEnvId(env_id)


def make(env_id: str, brax_backend: str | None = None):
    """`(env, env_params)`: the gymnax environment `MASKED[env_id]` names, showing only the
    entries it keeps (`brax_backend` is not used)."""
    base, keep = MASKED[env_id]
    env, env_params = gymnaxenv.make(base)
    return MaskedObservation(env, keep), env_params


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
