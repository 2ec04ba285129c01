"""MuJoCo Playground's DeepMind Control Suite (MJX physics) behind the gymnax interface.

`make_env("playground/CheetahRun")` (`common/envs.py`) calls this adapter's `make`, which loads
Playground's own environment (`mujoco_playground.registry.load`), with none of its training
wrappers, and gives it what every environment here has, as `common/braxenv.py` does for Brax:

- `step(key, state, action, params) -> (obs, state, reward, terminated, truncated, info)`, and
  `step_env` / `is_truncated`, the same step without a reset (`common/rollout.py`'s pool);
- `terminated` is Playground's own `done` (in the Control Suite: the physics went NaN), a
  terminal state; `truncated` is the time limit, the task's `episode_length` (1000 steps)
  counted here as Brax's `EpisodeWrapper` counts it, a truncation: bootstrap from the state
  reached, which `info["final_observation"]` holds;
- a finished episode restarts from a fresh random start (a full `env.reset`), not from a cached
  first state (Playground's `BraxAutoResetWrapper` without `full_reset`);
- observations given as a dict (locomotion's `state` and `privileged_state`) are the policy's
  part, `state`;
- the action space is the actuators' control range (`actuator_ctrlrange`; [-1, 1] throughout
  the Control Suite), to which the rollout clips the policy's actions.

MJX runs on the JAX implementation (`impl="jax"`), which compiles for a CPU, a TPU and a GPU
alike (Playground's default, Warp, needs an NVIDIA GPU).

Playground is an optional extra (`pip install -e ".[playground]"`), imported only when a
`playground/...` environment is made. Its task names are read from its installed files without
importing it (which starts JAX and takes seconds), so a wrong id fails before anything starts.
"""

import ast
import contextlib
import functools
import importlib.util
import io
import os
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from common.envapi import TimeLimitAutoReset, gymnax_spaces


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


def ids() -> list[str]:
    """`playground/<Task>` for each task of the Control Suite (where Playground is installed):
    the ids listed; `check` and `make` take the other registries' tasks too."""
    return [f"playground/{t}" for t, s in playground_tasks().items() if s == "dm_control_suite"]


def check(env_id: str, brax_backend: str | None = None):
    """`check_task` of `playground/<Task>`: every refusal worded here, an unknown task's too
    (`brax_backend` is not used)."""
    check_task(env_id.removeprefix("playground/"))


def make(env_id: str, brax_backend: str | None = None):
    """`(env, env_params)`: the `PlaygroundEnv` of `playground/<Task>`."""
    env = PlaygroundEnv(env_id.removeprefix("playground/"))
    return env, env.default_params


def menagerie_path() -> str:
    """Where Playground looks for MuJoCo Menagerie's robot models."""
    spec = importlib.util.find_spec("mujoco_playground")
    return os.path.join(spec.submodule_search_locations[0], "external_deps", "mujoco_menagerie")


def check_task(task: str):
    """Raise `ValueError` (one line) for a task this machine cannot make: Playground missing,
    an unknown name (with the close ones), a robot task without Menagerie's models."""
    import difflib

    names = playground_tasks()
    if not names:
        raise ValueError(f"playground/{task} needs MuJoCo Playground, which is not installed: "
                         "pip install -e \".[playground]\"")
    if task not in names:
        control = [n for n, s in names.items() if s == "dm_control_suite"]
        close = difflib.get_close_matches(task, list(names), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(f'playground/{c}' for c in close)}?" if close else ""
        raise ValueError(f"unknown Playground task {task!r}.{hint} The Control Suite's: "
                         f"{', '.join(control)}.")
    if names[task] != "dm_control_suite" and not os.path.isdir(menagerie_path()):
        raise ValueError(
            f"playground/{task} is a {names[task]} task, whose robot models (MuJoCo Menagerie) "
            f"are not installed at {menagerie_path()}, and this toolkit never downloads: clone "
            "https://github.com/google-deepmind/mujoco_menagerie there first, or pick a "
            "Control Suite task.")


class PlaygroundParams(NamedTuple):
    max_steps_in_episode: int = 1000
    """The time limit: an episode is truncated after this many steps (the task's
    `episode_length`)."""


class PlaygroundState(NamedTuple):
    mjx: Any
    """Playground's `State` (MJX data, observation, reward, done, metrics, info)."""
    time: jax.Array
    """Steps taken in the current episode, int32."""


class PlaygroundEnv(TimeLimitAutoReset):
    """A Playground environment with gymnax's methods (see the module docstring)."""

    fresh_starts = 1 / 16
    """The rollout's default pool of fresh starts, per transition (`common/rollout.py`), for
    tasks whose episodes can end early (locomotion and manipulation: a robot falls). An MJX
    reset runs the physics' forward pass at least, as dear as a step, and CheetahRun's runs
    200 steps of physics besides, to let the cheetah settle: as dear as 200 control steps.
    The Control Suite's episodes end only at their time limit (or where the physics goes
    NaN), so there it is one start per environment per episode length (`__init__`): a
    rollout of up to 1,000 steps draws one batch of starts and never repeats one. At 1/16,
    CheetahRun's 480-step rollout drew 30, and its update ran 7.5 times slower on a CPU
    (32 envs) and over 10 times slower than Brax's PPO on a TPU v5e
    (`benchmarks/results/tpu/vs_brax_ppo__CheetahRun__tpu-v5e__unfinished.txt`)."""

    keeps_keys = True
    """Playground's state keeps its PRNG key (`info["rng"]`), so the rollout gives it JAX's own
    keys (`common.rollout.keeps_keys`) without tracing a reset to find out."""

    def __init__(self, task: str):
        check_task(task)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mujoco_playground import registry

            self.env = registry.load(task, config_overrides={"impl": "jax"})
        self.name = f"playground/{task}"
        self.default_params = PlaygroundParams(int(self.env._config.episode_length))
        if playground_tasks()[task] == "dm_control_suite":
            self.fresh_starts = 1 / self.default_params.max_steps_in_episode

    @staticmethod
    def policy_obs(obs):
        """The policy's observation: `obs`, or its `state` where Playground gives a dict."""
        return obs["state"] if isinstance(obs, dict) else obs

    def reset(self, key, params=None):
        state = self.env.reset(key)
        return self.policy_obs(state.obs), PlaygroundState(state, jnp.zeros((), jnp.int32))

    def step_env(self, key, state: PlaygroundState, action, params=None):
        """One control step, no reset: `(obs, state, reward, terminated, info)`."""
        reached = self.env.step(state.mjx, action)
        return (self.policy_obs(reached.obs), PlaygroundState(reached, state.time + 1),
                jnp.asarray(reached.reward, jnp.float32), jnp.asarray(reached.done) > 0, {})

    @functools.cached_property
    def observation_size(self) -> int:
        obs = jax.eval_shape(self.env.reset, jax.ShapeDtypeStruct((2,), jnp.uint32)).obs
        return self.policy_obs(obs).shape[-1]

    def observation_space(self, params=None):
        return gymnax_spaces().Box(-jnp.inf, jnp.inf, (self.observation_size,), jnp.float32)

    def action_space(self, params=None):
        low, high = self.env.mj_model.actuator_ctrlrange.T
        limited = self.env.mj_model.actuator_ctrllimited.astype(bool)
        low = jnp.where(limited, jnp.asarray(low, jnp.float32), -jnp.inf)
        high = jnp.where(limited, jnp.asarray(high, jnp.float32), jnp.inf)
        return gymnax_spaces().Box(low, high, (self.env.action_size,), jnp.float32)


def render_html(env: PlaygroundEnv, states: list) -> str:
    """An HTML page that plays the episode of `states` (`PlaygroundState`s, one per frame) in a
    browser, drawn by Brax's viewer (`brax.io.html`, installed with Playground) from the
    bodies' positions and orientations in MJX's data (the world body left out)."""
    import types

    from brax import base
    from brax.io import html, mjcf

    system = mjcf.load_model(env.env.mj_model).tree_replace({"opt.timestep": env.env.dt})
    frames = [types.SimpleNamespace(x=base.Transform(pos=s.mjx.data.xpos[1:],
                                                     rot=s.mjx.data.xquat[1:])) for s in states]
    return html.render(system, frames)
