"""gymnax's environments: the adapter `common/envs.py` uses for every id without a backend's
prefix (`ids`, `check`, `make`).

gymnax is imported inside `make`, not at the top: importing it starts the XLA backend, after
which the CPU device count and `jax.distributed` can no longer be set. `ids` knows every id
without importing gymnax (a config refuses an unknown id before JAX starts), and `make`
imports only the module of the environment it makes.
"""

import ast
import functools
import importlib.util
import os
import sys

from common.envapi import UnknownEnvId, import_without_package_inits

MNIST_DIR = "/tmp/mnist"
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
"""gymnax's MNISTBandit-bsuite reads these from `MNIST_DIR`, downloading the missing ones."""


def ids() -> list[str]:
    """gymnax's ids: read from its registry if gymnax is imported, else from the id list in
    its `registration.py`, parsed without running it (no JAX starts)."""
    return list(sys.modules["gymnax"].registered_envs) if "gymnax" in sys.modules else \
        list(_builtins()[0])


def check(env_id: str, brax_backend: str | None = None):
    """`UnknownEnvId` for an id not in `ids()`; `ValueError` for MNISTBandit-bsuite without
    its files (gymnax would download them). `brax_backend` is not used."""
    if env_id not in ids():
        raise UnknownEnvId(env_id)
    missing = [f for f in MNIST_FILES if not os.path.isfile(os.path.join(MNIST_DIR, f))]
    if env_id == "MNISTBandit-bsuite" and missing:
        raise ValueError(f"{env_id} needs the MNIST files in {MNIST_DIR} (missing: "
                         f"{', '.join(missing)}), which gymnax would download from the "
                         "network; this toolkit never downloads: put them there first.")


def make(env_id: str, brax_backend: str | None = None):
    """`(env, env_params)`: `gymnax.make(env_id)`, importing only that environment's module
    where it can (`brax_backend` is not used)."""
    factory = _builtins()[1].get(env_id)
    if factory is None or "gymnax" in sys.modules:
        import gymnax

        return gymnax.make(env_id)
    module, name = factory
    env = getattr(import_without_package_inits(module), name)()
    return env, env.default_params


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
