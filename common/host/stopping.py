"""How a command-line run stops once training has begun: Ctrl-C (SIGINT) or SIGTERM is caught
(`Interrupt`) and acted on at once, not at the end of a chunk (`wait_for`); the run saves the
last checked state and leaves with 128 + the signal (`stop`); a second signal leaves at once,
abandoning the checkpoint being written (`stop_at_once`). Before training,
`common/host/starting.py` answers signals.
"""

import os
import signal
import sys
import threading

import jax

from common.host.session import Session, last_checkpoint, save
from common.host.starting import SIGNALS, STARTING


EXIT_AT_ONCE = False
"""Set by `main` for a command-line process: a stopped run leaves with `os._exit` once its
files are written, instead of letting Python wait for the chunks still queued on the devices
(an in-process caller gets `SystemExit` and waits)."""


class Leave(Exception):
    """The training loop stops early with exit status `code` (its files are written)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def leave_now(code: int):
    """Exit with `code`: at once from the command line (`EXIT_AT_ONCE`), else `SystemExit`."""
    if EXIT_AT_ONCE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


class Interrupt:
    """Catches Ctrl-C (SIGINT) and SIGTERM while training: `signal` is set and the loop saves
    and exits (`train_in_chunks`). A second signal calls `second(signum)`; leaving the block
    puts the previous handlers back."""

    SIGNALS = SIGNALS

    def __init__(self, second):
        self.signal, self.previous, self.second = None, {}, second

    def __enter__(self):
        STARTING.stop()  # from here, signals come to the handlers below
        if threading.current_thread() is threading.main_thread():  # signal() works only there
            for s in self.SIGNALS:
                previous = signal.signal(s, self._handle)
                self.previous[s] = signal.SIG_DFL if previous is None else previous
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            self.second(signum)
            return
        self.signal = signum
        print(f"\n{signal.Signals(signum).name}: saving the last complete update and stopping "
              "(send it again to stop at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}


def wait_for(tree, interrupt, interruptible: bool) -> bool:
    """Wait until every array of `tree` is computed; False, at once, when a signal arrived
    first and `interruptible`.

    A helper thread blocks on the arrays and sets an event; the main thread waits on the
    event, which (unlike a wait inside XLA) lets a signal's handler run at once, and wakes
    the moment the arrays are ready."""
    done = threading.Event()

    def block():
        try:
            jax.block_until_ready(tree)
        except Exception:  # noqa: BLE001  (the main thread's fetch raises it again)
            pass
        done.set()

    threading.Thread(target=block, name="wait-for-chunk", daemon=True).start()
    while not done.wait(timeout=0.05):  # a signal's handler runs inside the wait
        if interruptible and interrupt.signal:
            return False
    return True


def stop(s: Session, update: int, signum: int):
    """After a signal: the state after `update` is saved (unless it already was), every file
    written, and the loop left with exit status 128 + signal."""
    if s.saved_update != update:
        save(s, update)
    s.files.flush()
    if s.writer:
        where = "" if jax.process_count() == 1 else \
            " (on one process; on several, add each one's process flags)"
        print(f"interrupted at update {update} of {s.config.num_updates}; checkpoint: "
              f"{s.path}\ncontinue with: python algos/{s.algo}.py --resume {s.path}{where}",
              flush=True)
    raise Leave(128 + int(signum))


def stop_at_once(s: Session, signum: int):
    """A second signal: leave now. The checkpoint being written, if any, is abandoned (its
    temporary file removed); the last one written stays as it was."""
    s.checkpoints.abandon()
    print(f"{signal.Signals(signum).name} again: stopped at once. Last complete checkpoint: "
          f"{last_checkpoint(s)}.", file=sys.stderr, flush=True)
    leave_now(128 + int(signum))
