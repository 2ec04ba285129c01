"""What the steps of one command-line run share (`Session`), and its checkpoints: `save`
queues one on the writer thread (`CheckpointWriter`), `last_checkpoint` names the last one on
disk.

The training loop (`common/host/cli.py`) runs on the main thread; the file work runs in order
on a background thread (`logger.BackgroundWriter`), which is handed values, never the session.
"""

import contextlib
import dataclasses
import queue
from typing import Any

import jax

from common.host import checkpoint
from common.host.devices import Layout, fetch
from common.host.options import RunOptions


class CheckpointWriter:
    """The writer thread's side of checkpointing: `write` runs there, queued by `save`, and
    alone touches `packed`; the main thread learns what it wrote only from `written`, and
    stops a write only through `abandon` (a second signal's handler)."""

    def __init__(self):
        self.packed = checkpoint.Rows()
        """The metric rows as checkpoints hold them, each chunk serialised once."""
        self.written = queue.SimpleQueue()
        """`(update, file)` of each checkpoint written, in order: the hand-over to the main
        thread (a `SimpleQueue`, safe to read from a signal handler)."""
        self.temp_files = checkpoint.TempFiles()
        """The temporary files of the write in progress, the writer's; the main thread
        reaches them only through `abandon`, under their lock."""

    def write(self, path: str, keep_previous: bool, metrics: list, **record):
        """Write the checkpoint `record` to `path` (`metrics`: the chunks' rows so far, those
        not yet in `packed` serialised now), the file it replaces kept as the previous one
        with `keep_previous`. Once abandoned, it writes nothing and reports nothing."""
        for rows in metrics[len(self.packed):]:
            self.packed.append(rows)
        try:
            checkpoint.save(path, keep_previous=keep_previous, metrics=self.packed,
                            temp_files=self.temp_files, **record)
        except Exception:
            if self.temp_files.abandoned:  # stopped at once: not an error of its own
                return
            raise
        self.written.put((record["update"], path))

    def abandon(self):
        """Stop the write in progress, and every later one, its temporary files removed
        (`checkpoint.TempFiles.abandon`); the checkpoints written stay as they are."""
        self.temp_files.abandon()


@dataclasses.dataclass
class Session:
    """What the steps of one command share, all of it the main thread's.

    The writer thread (`files`, a `logger.BackgroundWriter`) is never handed the session:
    each call queued there gets the values it needs as arguments (`save`, `log_chunk`), its
    own state is `checkpoints`' (touched there only), and what it wrote comes back to the main
    thread through the queue `checkpoints.written`."""

    algo: str
    config: Any
    run: RunOptions
    train: Any
    layout: Layout
    template: Any
    """`jax.eval_shape` of the vmapped `train.init`: the TrainState's structure."""
    keys: Any
    hparams: Any
    state: Any = None
    initial: Any = None
    """A fresh run's first-state program while XLA compiles it (a `Future` of the compiled
    `train.init` bound to its arguments; `first_state` calls it), None once run or when
    resumed."""
    first: int = 0
    """The update this process starts from (0, or the resumed checkpoint's)."""
    run_time: int = 0
    names: list = dataclasses.field(default_factory=list)
    """The runs' directory names under `run.log_dir`, one per seed (`claim_run_dirs`)."""
    path: str = ""
    """The checkpoint file."""
    rows: list = dataclasses.field(default_factory=list)
    """The metric rows so far, one dict of arrays [num_seeds, chunk] per chunk."""
    saved_update: int | None = None
    """The update of the last checkpoint queued for writing to `path`, or that `path` held
    when the run resumed from it (None: `path` holds no state of this run, and the next
    checkpoint replaces the file there rather than keeping it as the previous one)."""
    last_written: tuple[int, str] | None = None
    """`(update, file)` of the last checkpoint known to be on disk: the file resumed from,
    then those `checkpoints.written` reports (`last_checkpoint`)."""
    checkpoints: CheckpointWriter = dataclasses.field(default_factory=CheckpointWriter)
    """The writer thread's side of checkpointing: the main thread only queues its `write`
    and takes from its `written`."""
    recent: Any = None
    """Per run, the mean return of the latest chunk in which it finished an episode (NaN
    before its first), for the progress line."""
    files: Any = None
    """The `logger.BackgroundWriter` of the training loop (TensorBoard, checkpoints)."""
    pbt: Any = None
    """A PBT run's host side (`common/host/pbt.py`'s `Population`: the search, the lineage so
    far); None without `--pbt-population`."""

    @property
    def writer(self) -> bool:
        return jax.process_index() == 0


def save(s: Session, update: int):
    """Checkpoint the runs after `update` (every process gathers, process 0 writes).

    One process: the state is copied to the host on the background thread, with the rest of
    the work (the arrays never change once computed). Several: every process gathers it
    here, in the same order (a collective)."""
    state = s.state if jax.process_count() == 1 else fetch(s.state)
    if s.writer:  # fetched, serialised and written on the background thread, in order
        s.files.put(s.checkpoints.write, s.path, keep_previous=s.saved_update is not None,
                    metrics=list(s.rows), algo=s.algo, config=dataclasses.asdict(s.config),
                    run=dataclasses.asdict(s.run), run_names=list(s.names), update=update,
                    run_time=s.run_time, train_state=state,
                    extra=None if s.pbt is None else {"pbt": s.pbt.record()})
    s.saved_update = update


def last_checkpoint(s: Session) -> str:
    """`path (update N)` of the last checkpoint on disk, for messages (on the main thread,
    from a signal's handler too: it takes what the writer thread reported)."""
    with contextlib.suppress(queue.Empty):
        while True:
            s.last_written = s.checkpoints.written.get_nowait()
    if s.last_written is None:
        return "none was written"
    update, path = s.last_written
    return f"{path} (update {update})"
