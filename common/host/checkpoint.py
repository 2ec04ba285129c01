"""Checkpoints: the whole training state in one msgpack file, written atomically.

A checkpoint is a msgpack map (`flax.serialization.msgpack_serialize`) of plain values:

    format_version  int, `FORMAT_VERSION`
    algo            "ppo", "a2c" or "impala"
    config          the algorithm's Config as a dict (`dataclasses.asdict`)
    run             the run options (`common/host/options.py`'s RunOptions) as a dict
    update          how many updates the runs have made
    run_time        unix time of the run's start (its TensorBoard run names keep it)
    train_state     the vmapped TrainState as a state dict: parameters, optimiser state,
                    observation statistics, environment states, PRNG keys; leading axis
                    [num_seeds] on every array
    metrics         metric name -> array [num_seeds, update], the rows so far

msgpack holds only maps, lists, numbers, strings and arrays, so loading a file can never run
code (unlike pickle). The train state is rebuilt with `flax.serialization.from_state_dict`
against a template of the expected structure (`jax.eval_shape` of the vmapped `init`), and
every array's shape and dtype is checked against it.

Writes are atomic: the bytes go to a temporary file in the same directory, are flushed and
fsync'ed, and the file is renamed over the old one (`os.replace`, atomic on POSIX), then the
directory is fsync'ed. A process killed at any moment leaves either the old checkpoint or the
new one, never a partial file.
"""

import os
import tempfile

import jax
import numpy as np
from flax import serialization

FORMAT_VERSION = 2
LATEST = "latest.msgpack"
"""File name of the checkpoint a run keeps up to date in its directory."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not fit the run asked of it."""


def resolve(path: str) -> str:
    """The checkpoint file `path` names: the file itself, or `latest.msgpack` in a directory."""
    return os.path.join(path, LATEST) if os.path.isdir(path) else path


def save(path: str, *, algo: str, config: dict, run: dict, update: int, run_time: int,
         train_state, metrics: dict):
    """Write a checkpoint to `path` atomically (see the module docstring)."""
    record = {
        "format_version": FORMAT_VERSION,
        "algo": algo,
        "config": config,
        "run": run,
        "update": int(update),
        "run_time": int(run_time),
        "train_state": serialization.to_state_dict(jax.device_get(train_state)),
        "metrics": {k: np.asarray(v) for k, v in metrics.items()},
    }
    data = serialization.msgpack_serialize(record)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".msgpack", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load(path: str) -> dict:
    """Read a checkpoint file into plain values (arrays are NumPy arrays).

    Raises `CheckpointError` with a one-line message when the file is missing, truncated,
    corrupt, or not a checkpoint of this format.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint file at {path!r}.")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise CheckpointError(f"{path!r} is empty, not a checkpoint.")
    try:
        record = serialization.msgpack_restore(data)
    except Exception as error:  # msgpack raises many types for bad bytes
        raise CheckpointError(f"{path!r} is not a readable checkpoint (corrupt or truncated "
                              f"file: {type(error).__name__}).") from None
    keys = {"format_version", "algo", "config", "run", "update", "run_time", "train_state",
            "metrics"}
    if not isinstance(record, dict) or not keys <= set(record):
        raise CheckpointError(f"{path!r} is not a checkpoint of this project (missing fields).")
    if record["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path!r} has checkpoint format {record['format_version']}; "
                              f"this code reads format {FORMAT_VERSION}.")
    return record


def restore(template, state_dict, path: str = "checkpoint"):
    """Rebuild a train state from its state dict, checked against `template`.

    `template` has the expected structure with arrays or `jax.ShapeDtypeStruct` leaves (e.g.
    `jax.eval_shape(jax.vmap(train.init), keys, hparams)`). Raises `CheckpointError` when the
    structure, a shape or a dtype differs.
    """
    try:
        state = serialization.from_state_dict(template, state_dict)
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path!r}: the saved training state does not fit this "
                              f"algorithm and config ({error}).") from None
    if jax.tree.structure(state) != jax.tree.structure(template):
        raise CheckpointError(f"{path!r}: the saved training state has a different structure "
                              "from this algorithm and config's.")
    for (where, want), got in zip(jax.tree_util.tree_flatten_with_path(template)[0],
                                  jax.tree.leaves(state)):
        got = np.asarray(got)
        if got.shape != tuple(want.shape) or got.dtype != want.dtype:
            raise CheckpointError(
                f"{path!r}: saved array {jax.tree_util.keystr(where)} has shape {got.shape} "
                f"{got.dtype}, expected {tuple(want.shape)} {want.dtype}.")
    return jax.tree.map(jax.numpy.asarray, state)


def config_differences(saved: dict, current: dict, ignore=()) -> list[str]:
    """`"name: saved -> current"` for every field (outside `ignore`) whose value differs, in
    the order of `current`."""
    names = [n for n in dict.fromkeys([*current, *saved]) if n not in ignore]
    missing = "<absent>"
    return [f"{n}: {saved.get(n, missing)!r} -> {current.get(n, missing)!r}" for n in names
            if _plain(saved.get(n, missing)) != _plain(current.get(n, missing))]


def _plain(value):
    """Tuples and lists compare equal after a msgpack round trip (which makes tuples lists)."""
    return list(value) if isinstance(value, tuple) else value
