"""Brax physics environments behind the gymnax interface the rollout and evaluation use.

`make_env("brax/ant", brax_backend=...)` (`common/envs.py`) calls this adapter's `make`, which
wraps Brax's own environment, with none of Brax's wrappers, in `BraxEnv`, which gives it what
every gymnax environment here has:

- `step(key, state, action, params) -> (obs, state, reward, terminated, truncated, info)`;
- `terminated` is the environment's own `done` (Ant or Hopper no longer healthy): a terminal
  state, no bootstrap; `truncated` is the time limit, `params.max_steps_in_episode` steps
  (1000, Brax's default episode length): bootstrap from the state reached;
- `info["final_observation"]` is the observation the step reached, before any reset;
- a finished episode restarts from a fresh random start state, drawn with that step's key
  (`step`), or from the rollout's pool of fresh starts (`step_env` and `is_truncated`, which
  step without resetting; `common/rollout.py`). Brax's `AutoResetWrapper` restarts every
  episode of an environment from the state of its first reset; `EpisodeWrapper` folds the
  time limit into `done` and reports it in `info["truncation"]`. Neither is used.

Brax is an optional extra, imported only when a `brax/...` environment is made
(`pip install -e ".[brax]"`). Its physics pipeline is `--brax-backend`; the default,
positional, learned Hopper fastest per second of training on a CPU (docs/environments.md).
"""

import contextlib
import functools
import importlib.util
import io
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from common.envapi import TimeLimitAutoReset, UnknownEnvId, gymnax_spaces

BRAX_ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup",
             "inverted_pendulum", "inverted_double_pendulum", "pusher", "reacher", "swimmer",
             "walker2d")
"""Brax's environments, made as `brax/<name>`."""
BRAX_BACKENDS = ("spring", "positional", "generalized", "mjx")
"""Brax's physics pipelines (`--brax-backend`), fastest and crudest first."""
BRAX_ONLY_ON = {"swimmer": ("generalized",)}
"""The Brax environments that run on some pipelines only (Brax's `swimmer.py` refuses every
other)."""


def ids() -> list[str]:
    """`brax/<name>` for each of `BRAX_ENVS`, installed or not."""
    return [f"brax/{name}" for name in BRAX_ENVS]


def check(env_id: str, brax_backend: str | None = None):
    """`UnknownEnvId` for an id not in `ids()`; `ValueError` where Brax is not installed, and
    for a physics pipeline `brax_backend` that is not Brax's or that the environment does not
    run on (`BRAX_ONLY_ON`; None: not checked)."""
    if env_id not in ids():
        raise UnknownEnvId(env_id)
    if importlib.util.find_spec("brax") is None:
        raise ValueError(f"{env_id} needs Brax, which is not installed: "
                         "pip install -e \".[brax]\"")
    if brax_backend is not None:
        if brax_backend not in BRAX_BACKENDS:
            raise ValueError(f"--brax-backend must be one of {', '.join(BRAX_BACKENDS)}, got "
                             f"{brax_backend!r}.")
        only_on = BRAX_ONLY_ON.get(env_id.removeprefix("brax/"), BRAX_BACKENDS)
        if brax_backend not in only_on:
            raise ValueError(f"{env_id} runs on Brax's {' or '.join(only_on)} physics "
                             f"pipeline only, not {brax_backend}: pass --brax-backend "
                             f"{only_on[0]}.")


def make(env_id: str, brax_backend: str):
    """`(env, env_params)`: the `BraxEnv` of `brax/<name>` on pipeline `brax_backend`."""
    env = BraxEnv(env_id.removeprefix("brax/"), brax_backend)
    return env, env.default_params


class BraxParams(NamedTuple):
    max_steps_in_episode: int = 1000
    """The time limit: an episode is truncated after this many steps (Brax's default)."""


class BraxState(NamedTuple):
    brax: Any
    """Brax's `State` (pipeline state, observation, reward, done, metrics)."""
    time: jax.Array
    """Steps taken in the current episode, int32."""


class BraxEnv(TimeLimitAutoReset):
    """A Brax environment with gymnax's methods (see the module docstring)."""

    fresh_starts = 1 / 4
    """The rollout's default pool of fresh starts, per transition (`common/rollout.py`): a
    reset runs the physics' initialisation, dearer than gymnax's few random numbers. A start
    for each environment every 4 steps or so (every 2 with 10-step rollouts): early in PPO's
    training many of Ant's episodes end within 3 steps, and 1/16 (a start every 10 steps)
    left 20% of its restarts repeated (256 envs x 10 steps, 30 updates); 1/4 none."""

    keeps_keys = False
    """Brax's state holds no PRNG key, whatever the environment (`common.rollout.keeps_keys`
    need not trace a reset to find out: 0.46 s of PPO's Hopper program's 7.3 s trace on a
    CPU)."""

    def __init__(self, name: str, backend: str):
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes on optional imports and on maintenance
            try:
                from brax import envs

                self.env = envs.get_environment(name, backend=backend)
                _give_fluid_forces_an_old_clip()
            except ImportError as error:  # a part of Brax's physics missing (mujoco.mjx, ...)
                raise ValueError(
                    f"brax/{name} with --brax-backend {backend} needs {error.name or error}, "
                    "which is not installed: pip install -e \".[brax]\"") from None
        self.name = f"brax/{name}"
        self.default_params = BraxParams()

    def reset(self, key, params=None):
        state = self.env.reset(key)
        return state.obs, BraxState(state, jnp.zeros((), jnp.int32))

    def step_env(self, key, state: BraxState, action, params=None):
        """One physics step, no reset: `(obs, state, reward, terminated, info)`."""
        reached = self.env.step(state.brax, action)
        terminated = jnp.asarray(reached.done) > 0  # some environments give Python floats
        return (reached.obs, BraxState(reached, state.time + 1),
                jnp.asarray(reached.reward, jnp.float32), terminated, {})

    @functools.cached_property
    def observation_size(self) -> int:
        """From the shapes of a traced reset: Brax's own `observation_size` runs a reset op by
        op, compiling each op (about 2 s on a CPU)."""
        return jax.eval_shape(self.env.reset, jax.ShapeDtypeStruct((2,), jnp.uint32)).obs.shape[-1]

    def observation_space(self, params=None):
        return gymnax_spaces().Box(-jnp.inf, jnp.inf, (self.observation_size,), jnp.float32)

    def action_space(self, params=None):
        return gymnax_spaces().Box(-1.0, 1.0, (self.env.action_size,), jnp.float32)


class _ClipTakingAMin:
    """`jax.numpy` whose `clip` also takes NumPy's old names `a_min` and `a_max`."""

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def clip(x, a_min=None, a_max=None, **bounds):
        return jnp.clip(x, bounds.get("min", a_min), bounds.get("max", a_max))


def _give_fluid_forces_an_old_clip():
    """Brax 0.14.2's fluid forces (the swimmer's water, `brax/fluid.py`) call
    `jnp.clip(x, a_min=...)`, names jax 0.10 removed (`min=`): the name `jp` in that module
    alone becomes a `jax.numpy` whose `clip` takes them. Nothing else in Brax or JAX changes;
    nothing at all where `jnp.clip` still takes `a_min`."""
    import inspect

    from brax import fluid

    if "a_min" not in inspect.signature(jnp.clip).parameters:
        fluid.jp = _ClipTakingAMin()


def render_html(env: BraxEnv, states: list) -> str:
    """An HTML page that plays the episode of `states` (`BraxState`s, one per frame) in a
    browser, drawn by Brax's own viewer (`brax.io.html`)."""
    from brax.io import html

    return html.render(env.env.sys.tree_replace({"opt.timestep": env.env.dt}),
                       [s.brax.pipeline_state for s in states])
