"""Environment ids -> environments: the factory over the backends' adapters of `BACKENDS`.

Each adapter has `ids()`, the ids it lists; `check(env_id, brax_backend)`, which raises
`ValueError` for an id it cannot make here (`common.envapi.UnknownEnvId` for one it does not
have); and `make(env_id, brax_backend) -> (env, env_params)`. An adapter is imported only for
an id of its own (or to list every id), so a gymnax run loads neither Brax's nor Playground's.
"""

import difflib
import importlib.util

from common.envapi import UnknownEnvId, env_spec, trace_ahead

BACKENDS = {"": "common.gymnaxenv", "Masked": "common.maskedenv", "brax/": "common.braxenv",
            "playground/": "common.playgroundenv"}
"""Each backend's adapter module by the prefix of its ids (the longest that matches)."""


def backend(env_id: str):
    """The adapter module of `env_id` (`BACKENDS`), imported now."""
    prefix = max((p for p in BACKENDS if env_id.startswith(p)), key=len)
    return importlib.import_module(BACKENDS[prefix])


def known_env_ids() -> list[str]:
    """Every environment id: gymnax's, the velocity-hidden tasks, Brax's as `brax/<name>`, then
    MuJoCo Playground's Control Suite as `playground/<Task>` (where Playground is installed);
    none of a backend whose adapter is not here (a copy of a few modules)."""
    return [env_id for module in BACKENDS.values() if importlib.util.find_spec(module)
            for env_id in importlib.import_module(module).ids()]


def check_env_id(env_id: str, brax_backend: str | None = None):
    """Raise `ValueError` naming the closest known ids when no backend has `env_id`, or for
    what its backend's `check` refuses: an environment that would download data
    (MNISTBandit-bsuite without its files, a Playground robot without its models), a Brax
    environment that does not run on the physics pipeline `brax_backend` (None: not
    checked)."""
    try:
        backend(env_id).check(env_id, brax_backend)
    except UnknownEnvId:
        known = known_env_ids()
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown environment id {env_id!r}.{hint} Known ids: "
                         f"{', '.join(known)}.") from None


def make_env(env_id: str, brax_backend: str = "positional"):
    """`(env, env_params, spec)` for a gymnax environment id, a velocity-hidden task
    (`common/maskedenv.py`), `brax/<name>` (physics pipeline `brax_backend`) or
    `playground/<Task>`.

    Raises `ValueError` naming the closest known ids when `env_id` is unknown, or the problem
    and its fix for a Brax pipeline it does not run on, before anything is compiled. On an
    accelerator a Brax or Playground environment's reset and step are traced here, for the
    programs built later (`common.envapi.trace_ahead`).
    """
    check_env_id(env_id, brax_backend)
    env, env_params = backend(env_id).make(env_id, brax_backend)
    spec = env_spec(env_id, env, env_params)
    trace_ahead(env, env_params)  # an accelerator's speed-up, invisible in the numbers
    return env, env_params, spec
