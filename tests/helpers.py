"""Helpers several test files share."""

import dataclasses
import importlib

import jax

from common.host import checkpoint, logger
from common.host.options import RunOptions

TINY = dict(total_timesteps=4096, num_envs=4, num_steps=32)
"""A tiny config, valid for all three algorithms."""


def initial_state(algo: str, num_seeds: int = 1, **overrides):
    """`(config, train, vmapped initial TrainState)` of a tiny config of `algos/<algo>.py`."""
    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(**{**TINY, **overrides})
    train = module.make_train(config)
    keys = logger.seed_keys(1, num_seeds)
    return config, train, jax.jit(jax.vmap(train.init))(
        keys, jax.vmap(lambda _: config.hparams())(keys))


def save_initial(path, algo: str, num_seeds: int = 1, **overrides) -> str:
    """A checkpoint of a freshly initialised run of `algos/<algo>.py` (nothing trained)."""
    config, _, state = initial_state(algo, num_seeds, **overrides)
    checkpoint.save(str(path), algo=algo, config=dataclasses.asdict(config),
                    run=dataclasses.asdict(RunOptions(num_seeds=num_seeds, exp_name=algo)),
                    update=0, run_time=0, train_state=state, metrics={})
    return str(path)
