"""Evaluation of a deterministic policy, and the `evaluate` entry point that loads a checkpoint.

`evaluate` plays one episode in each of `num_episodes` fresh environments with a deterministic
policy (each algorithm's `train.act`: the mode of its action distribution) and returns the
undiscounted returns. It is a pure, jittable, vmappable function: the training CLI calls it
between chunks (`--eval-every`), the entry point below calls it on a saved run:

    python -m common.evaluate runs/CartPole-v1__ppo__1__1700000000/latest.msgpack --episodes 10
    python -m common.evaluate PATH --capture-video episode.gif

`--capture-video` draws one episode with gymnax's own renderers (`gymnax.visualize`, through
matplotlib; classic control also needs gymnasium's pygame renderer, MinAtar needs seaborn).
"""

import dataclasses
import importlib
import importlib.util
import sys
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from jax import lax

from common import checkpoint, logger
from common.envs import EnvSpec, make_env, to_env_action

# --------------------------------------------------------------------------------------------
# Evaluation (pure, jittable)
# --------------------------------------------------------------------------------------------


class _Carry(NamedTuple):
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    done: jax.Array
    key: jax.Array
    t: jax.Array


def evaluate(act: Callable, env, env_params, spec: EnvSpec, key, num_episodes: int,
             max_steps: int | None = None):
    """The return of one episode in each of `num_episodes` fresh environments.

    Args:
      act: `act(obs) -> action` for a batch of observations [num_episodes, *obs_shape]
        (float32), deterministic (e.g. the mode of the policy).
      env, env_params, spec: from `common.envs.make_env`.
      key: PRNG key of the environments' resets and transitions.
      num_episodes: K, environments played in parallel, one episode each (static).
      max_steps: stop after this many steps even if an episode has not ended (default: the
        environment's own time limit, `env_params.max_steps_in_episode`, which always ends it).

    Returns:
      `(episode_return, episode_length)`, each [K]: the undiscounted return and length of
      each environment's first episode.
    """
    if max_steps is None:
        max_steps = int(env_params.max_steps_in_episode)
    action_shape = env.action_space(env_params).shape
    step_env = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    key_reset, key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(key_reset, num_episodes), env_params)
    zeros = jnp.zeros((num_episodes,), jnp.float32)

    def running(c: _Carry):
        return jnp.logical_and(~jnp.all(c.done), c.t < max_steps)

    def step(c: _Carry):
        key, key_step = jax.random.split(c.key)
        action = to_env_action(act(c.obs), spec, action_shape)
        obs, env_state, reward, terminated, truncated, _ = step_env(
            jax.random.split(key_step, num_episodes), c.env_state, action, env_params)
        live = ~c.done  # environments whose first episode is still going
        return _Carry(env_state, obs.astype(jnp.float32),
                      c.episode_return + jnp.where(live, reward.astype(jnp.float32), 0.0),
                      c.episode_length + live.astype(jnp.int32),
                      c.done | terminated.astype(bool) | truncated.astype(bool), key, c.t + 1)

    final = lax.while_loop(running, step, _Carry(
        env_state, obs.astype(jnp.float32), zeros, jnp.zeros((num_episodes,), jnp.int32),
        jnp.zeros((num_episodes,), bool), key, jnp.int32(0)))
    return final.episode_return, final.episode_length


def record_episode(act: Callable, env, env_params, spec: EnvSpec, key,
                   max_steps: int | None = None):
    """One episode for a video: the gymnax state before every step, and the rewards.

    Runs `max_steps` steps (default: the environment's time limit) with a `lax.scan`; the
    episode is the steps up to the first `done`. Returns `(states, rewards, done)` with a
    leading time axis [max_steps]; `length = argmax(done) + 1` steps belong to the episode.
    """
    if max_steps is None:
        max_steps = int(env_params.max_steps_in_episode)
    action_shape = env.action_space(env_params).shape
    key_reset, key = jax.random.split(key)
    obs, env_state = env.reset(key_reset, env_params)

    def step(carry, key):
        env_state, obs = carry
        action = to_env_action(act(obs.astype(jnp.float32)[None])[0], spec, action_shape)
        obs, next_state, reward, terminated, truncated, _ = env.step(key, env_state, action,
                                                                    env_params)
        done = jnp.logical_or(terminated, truncated)
        return (next_state, obs), (env_state, reward.astype(jnp.float32), done)

    _, (states, rewards, done) = lax.scan(step, (env_state, obs),
                                          jax.random.split(key, max_steps))
    return states, rewards, done


# --------------------------------------------------------------------------------------------
# Video (host side, optional dependencies imported only here)
# --------------------------------------------------------------------------------------------
_CLASSIC = ("gymnasium", "pygame")
RENDERERS = {
    **dict.fromkeys(("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                     "MountainCarContinuous-v0"), _CLASSIC),
    **dict.fromkeys(("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar",
                     "Seaquest-MinAtar", "SpaceInvaders-MinAtar", "Pong-misc"), ("seaborn",)),
    **dict.fromkeys(("Catch-bsuite", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc"), ()),
}
"""gymnax 1.0's renderers (`gymnax.visualize.Visualizer`): env id -> what they import besides
matplotlib."""
_INSTALL = {"matplotlib": "pip install -e '.[bench]'", "gymnasium": "pip install "
            "'gymnasium[classic-control]'", "pygame": "pip install 'gymnasium[classic-control]'",
            "seaborn": "pip install seaborn"}


def check_renderer(env_id: str):
    """Raise `ValueError` (one line) unless a GIF of `env_id` can be drawn here."""
    if env_id not in RENDERERS:
        raise ValueError(f"--capture-video: gymnax has no renderer for {env_id!r}, so no GIF can "
                         f"be made of it (it has renderers for {', '.join(RENDERERS)}).")
    missing = [m for m in ("matplotlib", *RENDERERS[env_id]) if importlib.util.find_spec(m) is None]
    if missing:
        fixes = " and ".join(dict.fromkeys(_INSTALL[m] for m in missing))
        raise ValueError(f"--capture-video for {env_id} needs {', '.join(missing)} "
                         f"(not installed): {fixes}.")


def save_gif(env, env_params, states, rewards, path: str):
    """Draw gymnax states (a list, one per frame) into a GIF with `gymnax.visualize`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from gymnax.visualize import Visualizer

    Visualizer(env, env_params, states, np.cumsum(rewards)).animate(path)


# --------------------------------------------------------------------------------------------
# Entry point: evaluate a checkpoint
# --------------------------------------------------------------------------------------------
ALGOS = {"ppo": "algos.ppo", "a2c": "algos.a2c", "impala": "algos.impala"}
"""The algorithms a checkpoint may name (never an arbitrary module)."""


@dataclasses.dataclass(frozen=True)
class Args:
    """Evaluate a saved run: the deterministic policy (mode of pi) of every run it holds."""

    checkpoint: tyro.conf.Positional[str]
    """A checkpoint file, or a run directory holding `latest.msgpack`."""
    episodes: int = 10
    """Episodes per run, each in its own environment."""
    seed: int = 0
    """Seed of the evaluation environments."""
    capture_video: str | None = None
    """Also save a GIF of one episode of the first run to this path."""


def restore_run(record: dict, path: str):
    """`(config, train, state)` of a loaded checkpoint: the algorithm's Config, its
    `make_train(config)` and the restored vmapped TrainState."""
    if record["algo"] not in ALGOS:
        raise checkpoint.CheckpointError(f"{path!r} names an unknown algorithm "
                                         f"{record['algo']!r}.")
    module = importlib.import_module(ALGOS[record["algo"]])
    fields = {f.name for f in dataclasses.fields(module.Config)}
    config = module.Config(**{k: v for k, v in record["config"].items() if k in fields})
    train = module.make_train(config)
    keys = logger.seed_keys(config.seed, config.num_seeds)
    template = jax.eval_shape(jax.vmap(train.init), keys,
                              jax.vmap(lambda _: config.hparams())(keys))
    return config, train, checkpoint.restore(template, record["train_state"], path)


def main(argv=None):
    """`python -m common.evaluate PATH [--episodes K] [--seed S] [--capture-video OUT.gif]`."""
    args = tyro.cli(Args, args=argv)
    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes must be a positive integer, got {args.episodes}.")
        record = checkpoint.load(checkpoint.resolve(args.checkpoint))
        if args.capture_video:
            check_renderer(record["config"].get("env_id"))
        config, train, state = restore_run(record, args.checkpoint)
    except ValueError as error:  # CheckpointError included
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    env, env_params, spec = make_env(config.env_id)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), config.num_seeds)
    returns, lengths = jax.jit(jax.vmap(
        lambda s, k: evaluate(partial(train.act, s), env, env_params, spec, k, args.episodes)
    ))(state, keys)
    print(f"evaluate: {record['algo']} on {config.env_id}, {args.checkpoint} (update "
          f"{record['update']} of {config.num_updates}), {args.episodes} episodes per run, "
          f"deterministic policy")
    for i, (r, n) in enumerate(zip(np.asarray(returns), np.asarray(lengths))):
        print(f"  seed {config.seed + i}: mean return {r.mean():.2f} (min {r.min():.2f}, "
              f"max {r.max():.2f}), mean length {n.mean():.1f}")
    print(f"mean return over {config.num_seeds} run(s): {np.mean(returns):.2f}")

    if args.capture_video:
        first = jax.tree.map(lambda x: x[0], state)
        states, rewards, done = jax.jit(
            lambda s, k: record_episode(partial(train.act, s), env, env_params, spec, k)
        )(first, keys[0])
        done = np.asarray(done)
        length = int(np.argmax(done)) + 1 if done.any() else len(done)
        frames = [jax.tree.map(lambda x: np.asarray(x[t]), states) for t in range(length)]
        save_gif(env, env_params, frames, np.asarray(rewards)[:length], args.capture_video)
        print(f"video: {args.capture_video} ({length} frames, return "
              f"{float(np.sum(np.asarray(rewards)[:length])):.2f}, seed {config.seed})")
    return returns


if __name__ == "__main__":
    main()
