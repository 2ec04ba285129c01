"""What the command-line driver needs from an algorithm file, named in one place.

An algorithm's `main()` hands `cli.main(algo, Config, make_train)` its `Config` class and its
`make_train`. `make_train(config)` returns `train(key, hparams=None) -> (TrainState, metrics)`,
the whole run in one call for Python callers; the driver never calls it, but trains in chunks
with the pieces `train` carries as attributes. `Config`, `Train` and `TrainState` below list
every member the driver uses, and nothing more (the algorithms' `train` also carries `learn`,
`policy`, `next_values` and `progress`, for tests and Python callers). The driver `check`s
for each before anything compiles and names the first one missing in one line: a copied
file that lost one is told which.

`make_train(config)` may raise `ValueError` for a config it cannot build (a network the
environment cannot take); the driver prints it as one line and exits with status 2.
"""

from typing import Any, Callable, Protocol

from common.host.devices import fail
from common.host.flags import field_docs


class Config(Protocol):
    """The algorithm's `Config`: a dataclass whose fields are the flags (tyro reads their
    docstrings for `--help`; the first sentence of its own docstring heads them), saved in
    every checkpoint as `dataclasses.asdict(config)`. Besides these members, `num_steps`,
    `hidden_size` and `actor_lag`, where the config has them, are named in the message of a
    run too big for memory."""

    env_id: str
    """The environment's id: in the run directories' names and the progress line."""
    total_timesteps: int
    """The run's length in environment steps, named when it makes too many updates."""
    num_envs: int
    """Environments per run: `--parallel data` splits them across the devices."""
    num_updates: int
    """Updates in the run: the chunks' numbering runs from 0 to it."""
    batch_size: int
    """Environment steps per update and run: global steps are update counts times it."""
    hparams: Callable[[], Any]
    """`hparams()`: the float hyperparameters as the NamedTuple of scalars `init` and
    `run_updates` take (one copy per run is vmapped)."""


class Train(Protocol):
    """`make_train(config)`'s return value, as the driver uses it: these attributes."""

    init: Callable[[Any, Any], Any]
    """`init(key, hparams) -> TrainState`: one run's fresh state (the driver vmaps it over the
    runs' keys and hparams)."""
    run_updates: Callable[[Any, Any, Any], tuple[Any, dict]]
    """`run_updates(state, hparams, updates) -> (state, metrics)`: the updates numbered
    `updates` (a 1-D int32 array), `metrics` a dict of arrays with one row per update that
    holds `episodic_return` (NaN where no episode finished); chunked, it must give what one
    call over all the updates gives."""
    act: Callable[[Any, Any, Any, Any], tuple[Any, Any]]
    """`act(state, obs, first, hidden) -> (action, hidden)`: the deterministic policy,
    evaluated with `--eval-every` (`common/evaluate.py`)."""
    initial_hidden: Callable[[int], Any]
    """`initial_hidden(num_envs)`: the recurrent state before the first step (None:
    feed-forward), for `act`'s episodes."""
    env: tuple
    """`(env, env_params, spec)` as `common.envs.make_env` returns them: the environment
    `train` trains on, which evaluations play too."""


class TrainState(Protocol):
    """What `init` returns and `run_updates` carries: a NamedTuple (`--parallel data` lays
    it out with `_replace`) holding at least these."""

    params: Any
    """The parameters, checked for NaN/inf after every chunk."""
    env: Any
    """The environments' states, leading axis `num_envs`: `--parallel data` splits it
    across the devices."""


def check(algo: str, obj, protocol, what: str):
    """Exit with one line, naming the member and what it is for, unless `obj` (`what`, in
    words) has every member of `protocol`."""
    name = next((n for n in protocol.__annotations__ if not hasattr(obj, n)), None)
    if name is not None:
        fail(f"algos/{algo}.py: {what} has no `{name}`, which the command line needs: "
             f"{field_docs(protocol)[name].rstrip('.')}; common/host/contract.py lists all it "
             "needs.", code=1)
