"""Several `jax.distributed` processes on 127.0.0.1: two processes training together, and what
happens when one dies. Helpers from `tests/test_scaling.py` (subprocesses under a hard
`timeout -k`, ports chosen free)."""

import glob
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from algos.ppo import main
from test_scaling import ROOT, SHORT, env, final_state, free_port, hard_timeout

pytestmark = pytest.mark.subprocess  # every test here starts Python processes


# ------------------------------------------------------------------ several processes
TIMEOUT = 10
"""`--distributed-timeout`: the heartbeat timeout of the pairs of processes below."""
BASE = ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "32", "--update-epochs",
        "1", "--checkpoint-every", "4", "--no-anneal-lr", "--distributed-timeout", str(TIMEOUT)]
"""The runs of a pair: chunks of 4 updates, at a learning rate that does not depend on the
run's length, so that a pair's short run (`SHORT_RUN`: 32 updates) and long run (`LONG_RUN`:
20,000) compile the same programs (the long one finds them in the session's cache)."""
SHORT_RUN, LONG_RUN = ["--total-timesteps", "4096"], ["--total-timesteps", "2560000"]
LAYOUTS = {"seeds": dict(devices=2, seeds=4), "data": dict(devices=1, seeds=2)}
"""Seeds: 2 devices per process, so each process runs one program per device, its parts of
global arrays that span both processes; data: one device per process, every device's
gradients averaged across both."""

PAIR = """
import sys

import jax
import numpy as np

from algos.ppo import main
from common.host import output

folder, same_everywhere = sys.argv.pop(1), output.same_everywhere


def dumped(params, replicated):  # this process's copy, before the processes compare them
    if replicated:
        np.savez(f"{folder}/params-{jax.process_index()}.npz",
                 *[np.asarray(leaf.addressable_shards[0].data) for leaf in jax.tree.leaves(params)])
    return same_everywhere(params, replicated)


output.same_everywhere = dumped
flags, lengths = sys.argv[1:-2], sys.argv[-2:]
main(flags + ["--total-timesteps", lengths[0], "--log-dir", f"{folder}/short"])
print("SHORT RUN DONE", flush=True)
main(flags + ["--total-timesteps", lengths[1], "--log-dir", f"{folder}/long"])
"""
"""`algos/ppo.py`'s command line run twice in one process (one start of JAX and of
`jax.distributed`): `python -c` this, a folder, the flags, then the short and the long run's
`--total-timesteps`. The short run's logs go to `{folder}/short`, and, data-parallel, this
process's own copy of its final parameters (its first device's) to
`{folder}/params-{process}.npz`; `SHORT RUN DONE` on stdout once it has ended."""


@pytest.fixture(scope="module", params=list(LAYOUTS))
def pair(request, tmp_path_factory):
    """Two `jax.distributed` processes (`LAYOUTS[parallel]`) that train the short run
    together, then start the long one, in which process 1 is killed (SIGKILL: no goodbye)
    once process 0 has trained past step 0; process 0 must then stop by itself. Returns a
    dict: `parallel`, `folder`, `outputs` (stdout and stderr of each process up to the end
    of the short run, both complete for process 1), `returncode` (process 0's), `after_kill`
    (process 0's lines after its peer's death) and `hung` (process 0 still running
    `4 * TIMEOUT` s after)."""
    parallel = request.param
    layout, folder = LAYOUTS[parallel], tmp_path_factory.mktemp(f"pair_{parallel}")
    command = [sys.executable, "-u", "-c", PAIR, str(folder), *BASE, "--parallel", parallel,
               "--num-seeds", str(layout["seeds"]), "--coordinator-address",
               f"127.0.0.1:{free_port()}", "--num-processes", "2", "--process-id"]
    lengths = [SHORT_RUN[1], LONG_RUN[1]]
    # Process 1 is not under `timeout`: the kill must reach the Python process itself.
    # Process 0 and its `timeout` have a process group of their own, ended as one.
    survivor = subprocess.Popen(hard_timeout(300) + command + ["0", *lengths], cwd=ROOT,
                                env=env(layout["devices"]), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    victim = subprocess.Popen(command + ["1", *lengths], cwd=ROOT, env=env(layout["devices"]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in survivor.stdout] + [lines.put(None)],
                     daemon=True).start()
    seen, hung = [], False
    try:
        deadline, short_done = time.monotonic() + 240, False
        while True:  # the short run, then the long one's training: a progress line past 0
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "process 0 ended before training:\n" + "".join(seen)
            seen.append(line)
            short_done = short_done or line.startswith("SHORT RUN DONE")
            if short_done and "SPS per run" in line and "step            0/" not in line:
                break
        victim.kill()
        try:
            survivor.wait(timeout=TIMEOUT * 4)
        except subprocess.TimeoutExpired:
            hung = True
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        if survivor.poll() is None:
            os.killpg(survivor.pid, signal.SIGKILL)
            survivor.wait()
    rest = []
    while (line := lines.get(timeout=10)) is not None:
        rest.append(line)
    return dict(parallel=parallel, folder=folder, returncode=survivor.returncode, hung=hung,
                outputs=["".join(seen), victim.stdout.read()], after_kill="".join(rest))


def test_two_processes_on_localhost(pair, capsys):
    """The short run of each layout (`LAYOUTS`) ends in both processes, process 0 alone
    logging and writing; data: the two processes' copies of the parameters are compared
    here, bitwise, with each other and with the checkpoint (not only by the command line's
    own check); seeds: each seed is what one process computes alone, to float rounding."""
    parallel, folder, (p0, p1) = pair["parallel"], pair["folder"], pair["outputs"]
    devices = 2 * LAYOUTS[parallel]["devices"]
    for out in (p0, p1):
        assert "SHORT RUN DONE" in out, out[-3000:]
    assert f"on {devices} device(s), parallel {parallel}, 2 processes" in p0, p0
    assert "done:" not in p1  # only process 0 logs and writes
    # Every process compared its devices' copies of the parameters with process 0's.
    assert "parameters identical on all 2 processes" in p0, p0
    record = final_state(folder / "short")
    assert record["update"] == 32
    if parallel == "data":  # the same parameters, bit for bit, on both and in the checkpoint
        saved = jax.tree.leaves(record["train_state"]["params"])
        ours, theirs = (np.load(folder / f"params-{i}.npz") for i in (0, 1))
        assert len(ours.files) == len(theirs.files) == len(saved) > 0
        for name, checkpointed in zip(ours.files, saved):
            a, b = ours[name], theirs[name]
            assert a.dtype == b.dtype == checkpointed.dtype and \
                a.tobytes() == b.tobytes() == checkpointed.tobytes(), name
    if parallel == "seeds":  # each seed computed as one process computes it, to rounding
        reference = python_api_metrics(BASE + SHORT_RUN + ["--num-seeds", "4"])
        for name in ("episodic_return", "value_loss", "approx_kl"):
            np.testing.assert_allclose(record["metrics"][name], reference[name], rtol=1e-4,
                                       atol=1e-5, err_msg=name)
        # Resumed alone (here, in this one process): the saved process options are not
        # inherited; the run is already complete, so nothing is trained.
        (path,) = glob.glob(str(folder / "short" / "*" / "latest.msgpack"))
        main(["--resume", path])
        out = capsys.readouterr().out
        assert "nothing to do" in out and "is at update 32 of 32" in out, out


def python_api_metrics(args):
    """The metrics of PPO's command-line flags `args` run in this process through the Python
    API, `jit(vmap(train))` over the command line's seed keys."""
    import jax

    from algos.ppo import Config, make_train
    from common.host import flags, logger

    config, run, _ = flags.parse("ppo", Config, args)
    train = make_train(config)
    keys = logger.seed_keys(run.seed, run.num_seeds)
    return jax.jit(jax.vmap(train))(keys, jax.vmap(lambda _: config.hparams())(keys))[1]


def test_a_dead_peer_stops_the_other_process_within_a_bounded_time(pair):
    """Process 1 killed mid-training (the pair's long run); process 0 must stop by itself with
    a clear message, well within the heartbeat timeout plus a margin -- never hang. That it
    stopped by itself, for its peer: an error exit status (not 0, nor `hard_timeout`'s 124 or
    137) and a line that says a peer is gone; a hang shows as still running at the deadline."""
    assert not pair["hung"], \
        f"process 0 still running {TIMEOUT * 4} s after its peer died: it hangs"
    out = pair["after_kill"]
    message = [line for line in out.splitlines() if "another process" in line or
               "another task died" in line]
    # Either a collective fails first (our one-line error, exit 1) or JAX's heartbeat check
    # does (its own "...another task died..." line, then abort).
    assert pair["returncode"] not in (0, 124, 137) and message, \
        (pair["returncode"], out[-3000:])
    print(f"process 0 stopped after its peer died, exit {pair['returncode']}: "
          f"{message[0][:200]}")


# ------------------------------------------------------------------ mistakes
def test_processes_started_with_different_flags_all_stop_with_one_line(tmp_path):
    """Process 1 is given another learning rate: neither trains (a silent divergence before
    this check; with another run length, a deadlock)."""
    address = f"127.0.0.1:{free_port()}"
    base = [sys.executable, "algos/ppo.py", *SHORT, "--num-seeds", "2", "--log-dir",
            str(tmp_path), "--coordinator-address", address, "--num-processes", "2",
            "--distributed-timeout", "30", "--process-id"]
    runs = [subprocess.Popen(hard_timeout(120) + base + ["0"], cwd=ROOT, env=env(1),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            subprocess.Popen(hard_timeout(120) + base + ["1", "--learning-rate", "0.001"],
                             cwd=ROOT, env=env(1), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)]
    for r in runs:
        out, err = r.communicate()
        assert r.returncode == 2, err[-2000:]
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert errors == ["error: process(es) 1 of this 2-process run were started with other "
                          "flags than process 0; start every process with the same flags (only "
                          "--process-id differs)."], err[-2000:]
        assert "Traceback" not in err and "done:" not in out


def test_a_process_whose_peers_never_come_stops_with_one_line(tmp_path):
    """JAX's own failure here is a C++ abort some seconds after the timeout; ours comes
    first, as one line with what to do. Exit status 1 and that line alone show ours came
    first (JAX's abort is SIGABRT, with its own lines), after the 3 s asked for (the line
    says so; the default is 60 s); `hard_timeout` stops a hang (exit status 124)."""
    address = f"127.0.0.1:{free_port()}"
    result = subprocess.run(hard_timeout(60) + [
        sys.executable, "algos/ppo.py", *SHORT, "--log-dir", str(tmp_path),
        "--coordinator-address", address, "--num-processes", "2", "--process-id", "0",
        "--distributed-timeout", "3"], cwd=ROOT, env=env(1), capture_output=True, text=True)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: process 0 of 2: not every process connected to the coordinator "
                     f"{address} within 3 s (--distributed-timeout); start all 2 processes "
                     "with the same --num-processes and --coordinator-address, each with its "
                     "own --process-id from 0 to 1."], result.stderr[-2000:]
