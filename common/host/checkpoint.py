"""Checkpoints: the whole training state in one checksummed msgpack file, written atomically,
with the previous one kept beside it.

A checkpoint file is a msgpack map (`flax.serialization`) of four fields:

    format_version  int, `FORMAT_VERSION`
    sha256          hex SHA-256 of the SHA-256 digests of `payload` and of each of `metrics`,
                    in order (a hash list)
    payload         the msgpack bytes of the record:
        algo            "ppo", "a2c" or "impala"
        config          the algorithm's Config as a dict (`dataclasses.asdict`)
        run             the run options (`common/host/options.py`'s RunOptions) as a dict
        run_names       the runs' directory names under the log directory, one per seed
        update          how many updates the runs have made
        run_time        unix time of the run's start
        versions        the versions of Python and the libraries that wrote it
        train_state     the vmapped TrainState as a state dict: parameters, optimiser state,
                        observation statistics, environment states, PRNG keys; leading axis
                        [num_seeds] on every array (a PBT run: its `PBTState`, the members'
                        TrainState [population], their hyperparameters and the PBT key)
        pbt             a PBT run only: its lineage so far (`common/host/pbt.py`)
    metrics         the metric rows so far, as a list of msgpack blobs, one per chunk of
                    updates, each a map of metric name -> array [num_seeds, updates in it]

`load` returns the record with `metrics` joined into one array [num_seeds, update] per name.
The rows are kept chunk by chunk so that a run checkpointing every chunk serialises and hashes
each row once (`Rows`), not again at every checkpoint: the file still holds every row, but a
checkpoint's cost grows with the new rows only. Format 3 files (one checksum over a payload
that holds the metrics) are still read.

A file whose contents do not match its checksum is refused, whatever byte changed: a flipped
bit in a weight, in the optimiser state or in the metrics is found before anything is loaded.
msgpack holds only maps, lists, numbers, strings and bytes, so loading a file can never run
code (unlike pickle). The train state is rebuilt with `flax.serialization.from_state_dict`
against a template of the expected structure (`jax.eval_shape` of the vmapped `init`), and
every array's shape and dtype is checked against it.

Writes are atomic: the bytes go to a temporary file in the same directory, are flushed and
fsync'ed, and the file is renamed over the old one (`os.replace`, atomic on POSIX), then the
directory is fsync'ed. A process killed at any moment, or a disk that fills up, leaves either
the old checkpoint or the new one, never a partial file. Two checkpoints are kept: once the
new one is written, and before it replaces `latest.msgpack`, the old one becomes
`latest.previous.msgpack` (a hard link, so there is no moment without a latest; a write that
fails leaves both files as they were), and a corrupted latest file names its intact
predecessor to resume instead.
"""

import functools
import hashlib
import os
import platform
import dataclasses
import tempfile
import threading
from importlib import metadata

import jax
import numpy as np
from flax import serialization

FORMAT_VERSION = 4
READS = (3, 4)
"""The formats `load` reads (format 3: the metrics inside the payload, one checksum)."""
LATEST = "latest.msgpack"
"""File name of the checkpoint a run keeps up to date in its directory."""
KEPT = 2
"""Checkpoints kept per run: the latest and the one before it (`previous_path`)."""
RECORD_FIELDS = ("algo", "config", "run", "run_names", "update", "run_time", "versions",
                 "train_state")
_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "distrax", "gymnax", "numpy")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, corrupt, or does not fit the run asked of it."""


class Abandoned(Exception):
    """A checkpoint write refused a step because its `TempFiles` was abandoned."""


class TempFiles:
    """The temporary files of a writer's checkpoint writes in progress, which a process that
    must stop at once removes (`abandon`).

    The command line's writer thread owns one (`session.CheckpointWriter`); a second signal's
    handler abandons it from the main thread, between any two of the writer's steps. Each step
    that gives a temporary file its name (`create`, `link`) checks the flag under one lock,
    under which `abandon` sets it and removes the files: once `abandon` returns no temporary
    file is left or made again (`_write` opens its file without creating it), none becomes a
    checkpoint (its rename finds no file), and the writer's next step raises. Re-entrant: a
    third signal's handler can run inside the second's `abandon`, on the same thread."""

    def __init__(self):
        self.lock = threading.RLock()
        self.files: set = set()
        self.abandoned = False

    def _check(self):
        if self.abandoned:
            raise Abandoned("the checkpoint write was abandoned")

    def create(self, directory: str) -> str:
        """A new empty temporary file in `directory`, registered."""
        with self.lock:
            self._check()
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".msgpack", dir=directory)
            os.close(fd)
            self.files.add(tmp)
            return tmp

    def link(self, source: str, tmp: str) -> bool:
        """Make the registered `tmp` a hard link to `source` (True), or, on a file system
        without hard links, leave it empty for a copy (False)."""
        with self.lock:
            self._check()
            os.remove(tmp)
            try:
                os.link(source, tmp)
                return True
            except OSError:
                open(tmp, "xb").close()
                return False

    def discard(self, tmp: str):
        """Forget `tmp`, removed first if still there (a write that failed, not one renamed)."""
        with self.lock:
            self.files.discard(tmp)
            if os.path.exists(tmp):
                os.remove(tmp)

    def abandon(self):
        """Refuse every later step of the writes and remove their temporary files (from a
        signal's handler; see the class docstring)."""
        with self.lock:
            self.abandoned = True
            for tmp in list(self.files):  # a copy: a nested call may run inside this loop
                try:
                    os.remove(tmp)
                except OSError:
                    pass


def resolve(path: str) -> str:
    """The checkpoint file `path` names: the file itself, or `latest.msgpack` in a directory."""
    return os.path.join(path, LATEST) if os.path.isdir(path) else path


def _where_instead(path: str) -> str:
    """For a missing `{folder}/latest.msgpack`, where the checkpoint is, when the folder is
    near one: another run of the same command (`{env_id}__{exp_name}__{seed}__{unix_time}`;
    a command of several seeds keeps one checkpoint, in its first run's directory), or run
    directories inside the folder (a `--log-dir`). Else ""."""
    def holds(d):
        return os.path.isfile(os.path.join(d, LATEST))

    folder, name = os.path.split(path)
    if name != LATEST or not os.path.isdir(folder):
        return ""
    parent, run = os.path.split(os.path.abspath(folder))
    command = run.rsplit("__", 2)
    if len(command) == 3:
        siblings = sorted(d for d in os.listdir(parent) if holds(os.path.join(parent, d))
                          and d.rsplit("__", 2)[::2] == command[::2])
        if siblings:
            return (" The runs of one command keep one checkpoint, in the first run's "
                    f"directory: {os.path.join(os.path.dirname(folder), siblings[0])!r}.")
    inside = sorted(d for d in os.listdir(folder) if holds(os.path.join(folder, d)))
    if inside:
        shown = ", ".join(repr(os.path.join(folder, d)) for d in inside[:3])
        return f" Run directories in it hold checkpoints: {shown}{', ...' * (len(inside) > 3)}."
    return ""


def previous_path(path: str) -> str:
    """Where the checkpoint before `path`'s is kept: `latest.msgpack` ->
    `latest.previous.msgpack`."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.previous{ext or '.msgpack'}"


def home(path: str) -> str:
    """The checkpoint a run resumed from `path` writes to: `path` itself, or, for a kept
    previous checkpoint (`latest.previous.msgpack`), the latest one it stands in for."""
    stem, ext = os.path.splitext(path)
    return stem[: -len(".previous")] + ext if stem.endswith(".previous") else path


@functools.cache
def library_versions() -> dict:
    """Python's and the libraries' versions, as recorded in every checkpoint (read once per
    process)."""
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def check_writable(path: str):
    """Raise `CheckpointError` unless a checkpoint can be written at `path`: not a directory,
    its directory creatable, and a file can be created in it (tested with a temporary file)."""
    if os.path.isdir(path):
        raise CheckpointError(f"cannot write the checkpoint to {path!r}: it is a directory.")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".probe", dir=directory)
        os.close(fd)
        os.remove(tmp)
    except OSError as error:
        raise CheckpointError(f"cannot write the checkpoint to {path!r}: "
                              f"{error.strerror or error}.") from None


class Rows:
    """A run's metric rows as checkpoints hold them: one msgpack blob per chunk of updates and
    its SHA-256 digest, each computed once, when the chunk is appended."""

    def __init__(self, chunks=()):
        self.blobs, self.digests = [], []
        for rows in chunks:
            self.append(rows)

    def append(self, rows: dict):
        """Add a chunk: metric name -> array [num_seeds, updates in the chunk]."""
        blob = serialization.msgpack_serialize({k: np.asarray(v) for k, v in rows.items()})
        self.blobs.append(blob)
        self.digests.append(hashlib.sha256(blob).digest())

    def __len__(self) -> int:
        return len(self.blobs)


def save(path: str, *, algo: str, config: dict, run: dict, run_names: list, update: int,
         run_time: int, train_state, metrics, keep_previous: bool = True,
         temp_files: TempFiles | None = None, extra: dict | None = None):
    """Write a checkpoint to `path` atomically (see the module docstring); with
    `keep_previous`, the file already at `path` becomes `previous_path(path)` once the new
    file is written, just before the new file replaces it.

    `metrics`: the rows so far, a `Rows` (kept by a caller that checkpoints as it goes) or one
    dict of metric name -> array [num_seeds, update]. `temp_files`: the writer's `TempFiles`,
    through which another thread can abandon the write (None: one of this call's own).
    `extra`: more fields of the record (plain values and arrays; PBT's `pbt`)."""
    temp_files = TempFiles() if temp_files is None else temp_files
    rows = metrics if isinstance(metrics, Rows) else Rows([metrics] if metrics else [])
    record = {
        "algo": algo,
        "config": {k: plain(v) for k, v in config.items()},  # msgpack: lists, not tuples
        "run": {k: plain(v) for k, v in run.items()},
        "run_names": list(run_names),
        "update": int(update),
        "run_time": int(run_time),
        "versions": library_versions(),
        "train_state": serialization.to_state_dict(serialisable(jax.device_get(train_state))),
        **{k: v for k, v in (extra or {}).items() if k not in RECORD_FIELDS},
    }
    payload = serialization.msgpack_serialize(record)
    blobs, digests = list(rows.blobs), list(rows.digests)
    data = serialization.msgpack_serialize({"format_version": FORMAT_VERSION,
                                            "sha256": _checksum(payload, digests),
                                            "payload": payload, "metrics": blobs})
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    def keep():  # only once the new file is whole: a failed write leaves both as they were
        if keep_previous and os.path.isfile(path):
            _replace_atomically(previous_path(path), temp_files,
                                lambda tmp: _link_or_copy(path, tmp, temp_files))

    _replace_atomically(path, temp_files, lambda tmp: _write(tmp, data), before_rename=keep)
    _sync_directory(directory)


def write_atomically(path: str, data: bytes, temp_files: TempFiles | None = None):
    """Replace the file `path` by `data` as a checkpoint is written: a temporary file beside
    it, flushed and fsync'ed, renamed over it, the directory fsync'ed (PBT's lineage JSON)."""
    temp_files = TempFiles() if temp_files is None else temp_files
    _replace_atomically(path, temp_files, lambda tmp: _write(tmp, data))
    _sync_directory(os.path.dirname(os.path.abspath(path)))


def _sync_directory(directory: str):
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the renames themselves durable
    finally:
        os.close(dir_fd)


def check_algo(record: dict, algo: str, path: str):
    """Raise `CheckpointError` unless the checkpoint `record` (read from `path`) is a run of
    `algo`: its config is another algorithm's, so this is checked before anything reads it."""
    if record["algo"] != algo:
        raise CheckpointError(f"{path!r} holds a {record['algo']} run; resume it with "
                              f"algos/{record['algo']}.py, not algos/{algo}.py.")


def _checksum(payload: bytes, digests: list) -> str:
    """The hash list: SHA-256 of the payload's digest followed by each metrics chunk's."""
    return hashlib.sha256(hashlib.sha256(payload).digest() + b"".join(digests)).hexdigest()


def _replace_atomically(path: str, temp_files: TempFiles, make, before_rename=None):
    """`make(tmp)` a temporary file beside `path` (made and registered by `temp_files`), call
    `before_rename()`, then rename the file over `path`. An `OSError` without a file name (a
    full disk) is given the temporary file's."""
    tmp = temp_files.create(os.path.dirname(os.path.abspath(path)))
    try:
        try:
            make(tmp)
        except OSError as error:
            error.filename = error.filename or tmp
            raise
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    finally:
        temp_files.discard(tmp)


def _write(tmp: str, data: bytes):
    """Write `data` to the empty file `tmp` made for it, opened without creating it: a file
    removed by `TempFiles.abandon` is not made again."""
    with open(os.open(tmp, os.O_WRONLY), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _link_or_copy(source: str, tmp: str, temp_files: TempFiles):
    if not temp_files.link(source, tmp):  # a file system without hard links
        with open(source, "rb") as f:
            _write(tmp, f.read())


def load(path: str) -> dict:
    """Read a checkpoint file into plain values (arrays are NumPy arrays).

    Raises `CheckpointError` with a one-line message when the file is missing, truncated,
    corrupt (its checksum fails), or not a checkpoint of this format; for a corrupt file the
    message names the previous checkpoint when that one is intact.
    """
    try:
        return _load(path)
    except CheckpointError as error:
        previous = previous_path(path)
        if os.path.isfile(path) and os.path.isfile(previous):
            try:
                update = _load(previous)["update"]
            except CheckpointError:
                raise error from None
            raise CheckpointError(f"{error} The previous checkpoint {previous!r} (update "
                                  f"{update}) is intact: --resume it.") from None
        raise


def _load(path: str) -> dict:
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint file at {path!r}.{_where_instead(path)}")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise CheckpointError(f"{path!r} is empty, not a checkpoint.")
    outer = _unpack(data, path)
    foreign = CheckpointError(f"{path!r} is not a checkpoint of this project (missing fields).")
    if not isinstance(outer, dict) or "format_version" not in outer:
        raise foreign
    version = outer["format_version"]
    if version not in READS:
        raise CheckpointError(f"{path!r} has checkpoint format {version!r}; this code reads "
                              f"formats {', '.join(map(str, READS))}.")
    payload, blobs = outer.get("payload"), outer.get("metrics") if version == 4 else []
    if not isinstance(payload, bytes) or not isinstance(outer.get("sha256"), str) or \
            not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
        raise foreign
    digests = [hashlib.sha256(b).digest() for b in blobs]
    expected = _checksum(payload, digests) if version == 4 else \
        hashlib.sha256(payload).hexdigest()
    if expected != outer["sha256"]:
        raise CheckpointError(f"{path!r} is corrupt: its contents do not match their "
                              "checksum.")
    record = _unpack(payload, path)
    if not isinstance(record, dict) or not set(RECORD_FIELDS) <= set(record):
        raise foreign
    if version == 4:
        chunks = [_unpack(b, path) for b in blobs]
        try:
            record["metrics"] = concat_rows(chunks)
        except (ValueError, TypeError, AttributeError):
            raise foreign from None
    elif not isinstance(record.get("metrics"), dict):
        raise foreign
    return record


def concat_rows(chunks: list) -> dict:
    """Join per-chunk metric dicts (name -> array [num_seeds, updates in the chunk]) along the
    update axis; a metric missing from a chunk (an evaluation that did not run then) is NaN
    there."""
    if not chunks:
        return {}
    names = dict.fromkeys(k for r in chunks for k in r)

    def column(r, k):
        if k in r:
            return np.asarray(r[k])
        return np.full(np.shape(next(iter(r.values()))), np.nan, np.float32)

    return {k: np.concatenate([column(r, k) for r in chunks], axis=1) for k in names}


def serialisable(tree):
    """`tree`, after teaching flax's serialization every dataclass node in it that flax does
    not know (MJX's `Data` in a Playground environment's state): its state dict is that of its
    fields, by name."""
    def to_dict(node):
        return {f.name: serialization.to_state_dict(getattr(node, f.name))
                for f in dataclasses.fields(node)}

    def from_dict(node, state):
        return dataclasses.replace(node, **{
            f.name: serialization.from_state_dict(getattr(node, f.name), state[f.name], f.name)
            for f in dataclasses.fields(node)})

    def walk(node):
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            try:
                serialization.register_serialization_state(type(node), to_dict, from_dict)
            except ValueError:  # known already (flax's own struct dataclasses)
                pass
            children = [getattr(node, f.name) for f in dataclasses.fields(node)]
        elif isinstance(node, (tuple, list)):
            children = node
        elif isinstance(node, dict):
            children = node.values()
        else:
            return
        for child in children:
            walk(child)

    walk(tree)
    return tree


def _unpack(data: bytes, path: str):
    try:
        return serialization.msgpack_restore(data)
    except Exception as error:  # msgpack raises many types for bad bytes
        raise CheckpointError(f"{path!r} is not a readable checkpoint (corrupt or truncated "
                              f"file: {type(error).__name__}).") from None


def restore(template, state_dict, path: str = "checkpoint"):
    """Rebuild a train state from its state dict, checked against `template`.

    `template` has the expected structure with arrays or `jax.ShapeDtypeStruct` leaves (e.g.
    `jax.eval_shape(jax.vmap(train.init), keys, hparams)`). Raises `CheckpointError` when the
    structure, a shape or a dtype differs, and says why where it knows: an optimiser state
    kept on the parameter tree, where this code keeps it as one flat vector
    (`common/minibatch.flat_optimizer`; IMPALA's before it did, for one).
    """
    if _on_the_parameter_tree(state_dict) and \
            not _on_the_parameter_tree(serialization.to_state_dict(serialisable(template))):
        raise CheckpointError(
            f"{path!r}: its optimiser state is kept on the parameter tree (one array per "
            "parameter), as it was before this code kept it as one flat vector "
            "(common/minibatch.flat_optimizer); this version cannot continue it. Use the "
            "version of the code that wrote it, or start a new run.")
    try:
        state = serialization.from_state_dict(serialisable(template), state_dict)
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


def _on_the_parameter_tree(state_dict) -> bool:
    """Whether a train state's state dict keeps an optimiser state on the parameter tree: a
    map somewhere in its `opt_state` with the keys and the array shapes of its `params`."""
    if not isinstance(state_dict, dict) or not {"params", "opt_state"} <= set(state_dict):
        return False
    params = state_dict["params"]
    shapes = [np.shape(x) for x in jax.tree.leaves(params)]

    def holds(node):
        return isinstance(node, dict) and (
            jax.tree.structure(node) == jax.tree.structure(params)
            and [np.shape(x) for x in jax.tree.leaves(node)] == shapes
            or any(holds(v) for v in node.values()))

    return holds(state_dict["opt_state"])


def plain(value):
    """Tuples and lists compare equal after a msgpack round trip (which makes tuples lists)."""
    return list(value) if isinstance(value, tuple) else value
