"""Ctrl-C (or SIGTERM) while a command-line run starts, from its first line to its first
update: one line, then exit at once (`STARTING`), except inside an IPython session
(`in_ipython`).

Light on purpose (the standard library only): an algorithm file run as a script calls
`STARTING.watch()` before its own imports, so that a signal while JAX, Flax or Brax load is
answered the same way as one while compiling. When training begins, `Interrupt`
(`common/host/stopping.py`) stops the watch and its own handlers take over.
"""

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals a command-line run answers: Ctrl-C and SIGTERM (what a scheduler sends)."""


def in_ipython() -> bool:
    """Inside an IPython session: `%run algos/ppo.py ...` in a terminal or a Jupyter kernel,
    which runs the file as `__main__`. The process is then the user's session, which neither a
    signal nor the end of a run may end: the file runs as if called from Python. (A script
    that imports IPython as a library has no session: `get_ipython()` is None.)"""
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


class Starting:
    """Ctrl-C (or SIGTERM) while a command-line run starts: one line, then exit at once.

    Before training, nothing is written that a signal could leave half done, but the main
    thread spends most of this time inside XLA's compiler, where Python cannot run a handler:
    a KeyboardInterrupt would come only once compiling ends, or be raised (and dropped) inside
    a callback of JAX's so that the run goes on, and a process torn down while XLA's compiler
    threads still run can crash. Python's C-level handler, though, runs at once on whichever
    thread the signal lands, and writes the signal's number to the wakeup file descriptor
    (`signal.set_wakeup_fd`): `watch` points that at a pipe that a thread of its own reads,
    which prints the line and leaves with `os._exit`. `stop` (training begins: `Interrupt`
    takes over) ends that thread and puts the previous handlers back."""

    LINE = "interrupted while starting; nothing was trained or written"

    def __init__(self):
        self.thread, self.pipe, self.previous, self.line = None, None, {}, self.LINE

    def watch(self, line: str = LINE):
        """Answer Ctrl-C (or SIGTERM) with `line` and exit 128 + the signal, until `stop`.
        Nothing inside IPython (`in_ipython`): Ctrl-C raises KeyboardInterrupt there, as
        Python does."""
        if threading.current_thread() is not threading.main_thread() or self.thread \
                or in_ipython():
            return
        self.line = line
        self.pipe = os.pipe()
        os.set_blocking(self.pipe[1], False)
        self.previous = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}
        self.previous_fd = signal.set_wakeup_fd(self.pipe[1], warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._wait, name="starting-signals", daemon=True)
        self.thread.start()

    def _wait(self):
        while True:
            signum = os.read(self.pipe[0], 1)[0]
            if signum == 0:  # `stop`
                return
            # one write, so that no other thread's output lands inside the line
            os.write(sys.stderr.fileno(), f"\n{self.line}\n".encode())
            os._exit(128 + signum)

    def stop(self):
        if self.thread is None:
            return
        signal.set_wakeup_fd(self.previous_fd)
        os.write(self.pipe[1], b"\0")
        self.thread.join()
        for s, handler in self.previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for fd in self.pipe:
            os.close(fd)
        self.thread, self.pipe, self.previous = None, None, {}


STARTING = Starting()
