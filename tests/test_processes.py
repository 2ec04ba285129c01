"""Several `jax.distributed` processes on 127.0.0.1: two processes training together, and what
happens when one dies. Helpers from `tests/test_scaling.py` (subprocesses under a hard
`timeout -k`, ports chosen free)."""

import glob
import json
import queue
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
TWO_RUNS = """
import json
import sys

import jax
import numpy as np

from algos.ppo import main
from common.host import output

folder, runs, same_everywhere = sys.argv[1], json.loads(sys.argv[2]), output.same_everywhere


def dumped(params, replicated):  # this process's copy, before the processes compare them
    if replicated:
        np.savez(f"{folder}/params-{jax.process_index()}.npz",
                 *[np.asarray(leaf.addressable_shards[0].data) for leaf in jax.tree.leaves(params)])
    return same_everywhere(params, replicated)


output.same_everywhere = dumped
for args in runs:
    main(args)
"""
"""Runs `algos/ppo.py`'s command line once for each list of flags in `runs`, one after the
other in this process (one start of JAX and of `jax.distributed`), and, for a data-parallel
run, saves at its end this process's own copy of the parameters (its first device's) to
`{folder}/params-{process}.npz`: `python -c` this, the folder, then `runs` as JSON."""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two `jax.distributed` processes of 2 CPU devices each that train `SHORT` together
    twice: 4 seeds, one per device (`--parallel seeds`), then one agent per seed on all 4
    devices (`--parallel data`, 2 seeds): `(folder, [process 0's, process 1's
    CompletedProcess])`, the runs' logs in `folder/seeds` and `folder/data`."""
    folder = tmp_path_factory.mktemp("two_processes")
    address = f"127.0.0.1:{free_port()}"
    runs = [SHORT + ["--parallel", parallel, "--num-seeds", seeds, "--log-dir",
                     str(folder / parallel), "--coordinator-address", address,
                     "--num-processes", "2", "--distributed-timeout", "30"]
            for parallel, seeds in (("seeds", "4"), ("data", "2"))]
    processes = [subprocess.Popen(hard_timeout(240) + [
        sys.executable, "-c", TWO_RUNS, str(folder),
        json.dumps([run + ["--process-id", str(i)] for run in runs])], cwd=ROOT,
        env=env(devices=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    results = []
    for p in processes:
        out, err = p.communicate()
        assert p.returncode not in (124, 137), f"process hung:\n{err[-3000:]}"
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return folder, results


@pytest.mark.parametrize("parallel", ["seeds", "data"])
def test_two_processes_on_localhost(parallel, two_runs, capsys):
    """Seeds: each process runs one program per device, its parts of global arrays that span
    both processes; data: every device's gradients averaged across both processes, and the
    two processes' copies of the parameters are compared here, bitwise, with each other and
    with the checkpoint (not only by the command line's own check)."""
    folder, (p0, p1) = two_runs
    for r in (p0, p1):
        assert r.returncode == 0, r.stderr[-3000:]
    assert f"on 4 device(s), parallel {parallel}, 2 processes" in p0.stdout, p0.stdout
    assert "done:" not in p1.stdout  # only process 0 logs and writes
    # Every process compared its devices' copies of the parameters with process 0's.
    assert p0.stdout.count("parameters identical on all 2 processes") == 2, p0.stdout
    record = final_state(folder / parallel)
    assert record["update"] == 8
    if parallel == "data":  # the same parameters, bit for bit, on both and in the checkpoint
        saved = jax.tree.leaves(record["train_state"]["params"])
        ours, theirs = (np.load(folder / f"params-{i}.npz") for i in (0, 1))
        assert len(ours.files) == len(theirs.files) == len(saved) > 0
        for name, checkpointed in zip(ours.files, saved):
            a, b = ours[name], theirs[name]
            assert a.dtype == b.dtype == checkpointed.dtype and \
                a.tobytes() == b.tobytes() == checkpointed.tobytes(), name
    if parallel == "seeds":  # each seed computed as one process computes it, to rounding
        reference = python_api_metrics(SHORT + ["--num-seeds", "4"])
        for name in ("episodic_return", "value_loss", "approx_kl"):
            np.testing.assert_allclose(record["metrics"][name], reference[name], rtol=1e-4,
                                       atol=1e-5, err_msg=name)
        # Resumed alone (here, in this one process): the saved process options are not
        # inherited; the run is already complete, so nothing is trained.
        (path,) = glob.glob(str(folder / parallel / "*" / "latest.msgpack"))
        main(["--resume", path])
        out = capsys.readouterr().out
        assert "nothing to do" in out and "is at update 8 of 8" in out, out


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


@pytest.mark.parametrize("parallel", ["data", "seeds"])
def test_a_dead_peer_stops_the_other_process_within_a_bounded_time(parallel, tmp_path):
    """Kill process 1 mid-training (SIGKILL: no goodbye); process 0 must stop by itself with
    a clear message, well within the heartbeat timeout plus a margin -- never hang. That it
    stopped by itself, for its peer: an error exit status (not 0, nor `hard_timeout`'s 124 or
    137) and a line that says a peer is gone; a hang shows as still running at the deadline."""
    timeout = 10
    address = f"127.0.0.1:{free_port()}"
    long_run = ["--env-id", "CartPole-v1", "--total-timesteps", "2560000", "--num-envs", "4",
                "--num-steps", "32", "--update-epochs", "1", "--checkpoint-every", "4",
                "--parallel", parallel, "--num-seeds", "2" if parallel == "seeds" else "1",
                "--coordinator-address", address, "--num-processes", "2",
                "--distributed-timeout", str(timeout), "--log-dir", str(tmp_path)]
    command = [sys.executable, "-u", "algos/ppo.py", *long_run, "--process-id"]
    survivor = subprocess.Popen(hard_timeout(150) + command + ["0"], cwd=ROOT,
                                env=env(devices=1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    victim = subprocess.Popen(command + ["1"], cwd=ROOT, env=env(devices=1),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in survivor.stdout] + [lines.put(None)],
                     daemon=True).start()
    try:
        deadline, seen = time.monotonic() + 100, []
        while True:  # wait until training is under way: a progress line past step 0
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "process 0 ended before training:\n" + "".join(seen)
            seen.append(line)
            if "SPS per run" in line and "step            0/" not in line:
                break
        victim.kill()
        try:
            survivor.wait(timeout=timeout * 4)
        except subprocess.TimeoutExpired:
            pytest.fail(f"process 0 still running {timeout * 4} s after its peer died: it hangs")
    finally:
        for p in (victim, survivor):
            if p.poll() is None:
                p.kill()
                p.wait()
    rest = []
    while (line := lines.get(timeout=10)) is not None:
        rest.append(line)
    out = "".join(rest)
    message = [line for line in out.splitlines() if "another process" in line or
               "another task died" in line]
    # Either a collective fails first (our one-line error, exit 1) or JAX's heartbeat check
    # does (its own "...another task died..." line, then abort).
    assert survivor.returncode not in (0, 124, 137) and message, \
        (survivor.returncode, out[-3000:])
    print(f"process 0 stopped after its peer died, exit {survivor.returncode}: "
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
