"""What a command-line run checks before anything compiles, each failure one line and exit
status 2: the processes were started alike (`agree_across_processes`), the training state fits
in memory (`check_fits_in_memory`; XLA running out of memory later is one line too, and exit
status 1: `out_of_memory_is_one_line`), the run directories can be claimed (`claim_run_dirs`)
or, resumed, written again (`reopen_run_dirs`), and a checkpoint to resume is of this run
(`resume`, which `resume_into` gives to the run's `Session`).
"""

import contextlib
import dataclasses
import errno
import os
import sys

import jax
from jax.sharding import PartitionSpec as P

from common.host import checkpoint, logger
from common.host.devices import Layout, differing_processes, fail, from_process_0
from common.host.flags import flag_of
from common.host.options import RESUME_MUST_MATCH, RunOptions


def agree_across_processes(config, run: RunOptions):
    """With several processes: stop every one of them, with one line, unless all were given
    the same config and run options (all but `--process-id`)."""
    mine = {**dataclasses.asdict(config),
            **{k: v for k, v in dataclasses.asdict(run).items() if k != "process_id"}}
    differ = differing_processes(repr(sorted(mine.items())).encode())
    if differ:
        fail(f"process(es) {', '.join(map(str, differ))} of this {jax.process_count()}-process "
             "run were started with other flags than process 0; start every process with the "
             "same flags (only --process-id differs).")


def check_fits_in_memory(config, template, layout: Layout):
    """Refuse, with one line, a training state larger than the memory there is (the chunk
    program holds it twice: its input and its output)."""
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(template))
    per_device = 2 * state_bytes / max(1, layout.num_devices if layout.seeds != P() else 1)
    local = [d for d in layout.mesh.devices.flat if d.process_index == jax.process_index()]
    available = available_memory(local[0], len(local))
    if available is not None and per_device > available:
        runs = jax.tree.leaves(template)[0].shape[0]
        fail(f"does not fit in memory: the training state of {runs} run(s) is "
             f"{state_bytes / 2**30:.1f} GiB, and the program holds it twice (its input and "
             f"its output: {per_device / 2**30:.1f} GiB on each device), where "
             f"{available / 2**30:.1f} GiB is available; reduce {shrinkable(config)}.")


def available_memory(device, num_devices: int) -> float | None:
    """Bytes one device can still allocate: an accelerator's own limit, or on CPU this
    machine's available memory shared by the CPU devices (None when unknown)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024 / max(1, num_devices)
    except (OSError, KeyError, ValueError):
        return None


def shrinkable(config) -> str:
    """The flags that set the size of a run's state and batch, for `config`'s algorithm."""
    names = [n for n in ("num_envs", "num_steps", "hidden_size", "actor_lag")
             if hasattr(config, n)]
    return ", ".join(flag_of(n) for n in ("num_seeds", *names))


@contextlib.contextmanager
def out_of_memory_is_one_line(config):
    """Turn XLA's out-of-memory error (while allocating the state or running a chunk) into
    one line and exit status 1."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        text = str(error)
        if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
            raise
        first = text.strip().splitlines()[0][:200]
        fail(f"does not fit in memory ({first}); reduce {shrinkable(config)}.", code=1)


def claim_run_dirs(config, run: RunOptions, run_time: int, writer: bool) -> list[str]:
    """Create the runs' directories, `{log_dir}/{env_id}__{exp_name}__{seed}__{unix_time}`,
    and return their names. A run never shares a directory: when one exists (another run
    started in the same second, even from another process), the names get the next free
    suffix, `...__{unix_time}-2`, `-3`, ... Only process 0 creates them; every process
    returns the same names. A directory that cannot be made exits with one line."""
    def names(n):
        suffix = "" if n == 1 else f"-{n}"
        return [logger.run_name(config.env_id, run.exp_name, run.seed + i, run_time) + suffix
                for i in range(run.num_seeds)]

    n = 1
    if writer:
        where = os.path.join(run.log_dir, names(1)[0])
        if os.path.exists(run.log_dir) and not os.path.isdir(run.log_dir):
            fail(f"--log-dir {run.log_dir!r} is a file, not a directory; choose another.")
        try:
            os.makedirs(run.log_dir, exist_ok=True)
            for n in range(1, 10_000):
                paths = [os.path.join(run.log_dir, name) for name in names(n)]
                try:
                    os.mkdir(paths[0])  # atomic: the first run's directory is the claim
                except FileExistsError:
                    continue
                where = paths[0]
                made = [paths[0]]
                try:
                    for path in paths[1:]:
                        os.mkdir(path)
                        made.append(path)
                    break
                except FileExistsError:  # a run with overlapping seeds: give all back
                    for path in reversed(made):
                        os.rmdir(path)
            else:
                fail(f"no free run directory like {where!r} after 10,000 tries.")
        except OSError as error:
            hint = " (shorten --exp-name)" if error.errno == errno.ENAMETOOLONG else ""
            fail(f"cannot create the run directory {where!r}: {error.strerror or error}{hint}; "
                 "choose a writable --log-dir.")
    return names(int(from_process_0(n)))


def reopen_run_dirs(run: RunOptions, names: list[str]):
    """A resumed run's directories under `run.log_dir`, made again where missing; exits with
    one line, before anything compiles, where one cannot be made or written."""
    for name in names:
        where = os.path.join(run.log_dir, name)
        try:
            os.makedirs(where, exist_ok=True)
            if not os.access(where, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), where)
        except OSError as error:
            fail(f"cannot write the run directory {where!r}: {error.strerror or error}; "
                 f"choose a writable --log-dir.")


def resume(path: str, record: dict, algo: str, config, run: RunOptions, template):
    """The train state to continue `config`'s run of `algo` from the checkpoint `record`
    (read from `path`), taken out of the record (no host copy of it stays for the run);
    `CheckpointError` names what does not match."""
    checkpoint.check_algo(record, algo, path)
    now = {k: getattr(run, k) for k in RESUME_MUST_MATCH}
    defaults = {f.name: f.default for f in dataclasses.fields(RunOptions)}  # an older file's
    saved = {**{f.name: f.default for f in dataclasses.fields(config)  # fields added since it
                if f.default is not dataclasses.MISSING}, **record["config"]}  # was written
    differences = config_differences(saved, dataclasses.asdict(config)) \
        + config_differences({k: record["run"].get(k, defaults[k]) for k in now}, now)
    if differences:
        raise checkpoint.CheckpointError(f"cannot resume {path!r} with a different config "
                                         f"(saved -> now): {'; '.join(differences)}. Resume "
                                         f"with the saved values (leave those flags out), or "
                                         f"start a new run without --resume.")
    return checkpoint.restore(template, record.pop("train_state"), path)


def resume_into(s, resumed=None) -> dict:
    """Give the `Session` `s` (laid out, with its `template`) the state, update, run names and
    metric rows of the checkpoint `--resume` names, checked as `resume` checks it; `resumed`:
    its `(path, record)` as `flags.parse` read it (None: read here). Returns the record (its
    `train_state` taken out). A checkpoint that does not fit, or a checkpoint or run directory
    that cannot be written, exits with one line."""
    run = s.run
    given, record = resumed or (checkpoint.resolve(run.resume), None)
    try:
        if record is None:
            record = checkpoint.load(given)
        state = resume(given, record, s.algo, s.config, run, s.template)
        s.path = checkpoint.home(given)
        if s.writer:
            checkpoint.check_writable(s.path)
    except checkpoint.CheckpointError as error:
        fail(error)
    now = checkpoint.library_versions()
    changed = [f"{k} {v} -> {now.get(k)}" for k, v in record["versions"].items()
               if now.get(k) != v]
    if changed and s.writer:
        print(f"note: {s.path} was written with other versions ({', '.join(changed)});"
              " the run continues, but need not match an uninterrupted run bitwise.",
              file=sys.stderr, flush=True)
    s.state = s.layout.put(state, s.layout.state)
    s.first, s.run_time = record["update"], record["run_time"]
    s.names = list(record["run_names"])
    if s.writer:  # its TensorBoard runs go on there: one line now if they cannot
        reopen_run_dirs(run, s.names)
    s.rows = [record["metrics"]] if s.first > 0 else []
    # Resumed from the previous file, `path` does not hold this state: a stop before the
    # next checkpoint writes it there, and until then messages name the file resumed.
    s.saved_update = s.first if s.path == given else None
    s.last_written = s.first, given
    return record


def config_differences(saved: dict, current: dict, ignore=()) -> list[str]:
    """`"name: saved -> current"` for every field (outside `ignore`) whose value differs, in
    the order of `current`."""
    names = [n for n in dict.fromkeys([*current, *saved]) if n not in ignore]
    missing = "<absent>"
    value = lambda fields, n: checkpoint.plain(fields.get(n, missing))  # noqa: E731
    return [f"{n}: {saved.get(n, missing)!r} -> {current.get(n, missing)!r}" for n in names
            if value(saved, n) != value(current, n)]
