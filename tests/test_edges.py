"""The edges around training, through PPO's command line: run directories that are never
shared, checkpoints that refuse corruption and keep their predecessor, a full disk, signals
acted on at once, start-up interrupted, memory errors as one line, and host-side loops that
stay short whatever the sizes. (Bad command lines: `tests/test_bad_input.py`; several
processes: `tests/test_processes.py`.)"""

import errno
import functools
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from algos.ppo import Config, main, make_train
from common.host import checkpoint, cli, flags, output, preflight, session
from common.host.logger import Progress
from helpers import interrupted_while_importing, record_progress, save_initial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "32",
        "--num-minibatches", "2", "--update-epochs", "1", "--num-devices", "1"]  # 16 updates


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------ run directories
FIRST, SECOND = "CartPole-v1__ppo__1__1700000000", "CartPole-v1__ppo__1__1700000000-2"


@pytest.fixture(scope="module")
def same_second(tmp_path_factory):
    """Two command-line runs of `TINY` started in the same second into one `--log-dir`, at
    learning rates 0.001 and 0.002: `(log_dir, [their metrics])`. The tests that use them
    leave their files as they are."""
    log_dir = tmp_path_factory.mktemp("same_second")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: 1_700_000_000.5)  # every run in one second
        metrics = [main(TINY + ["--log-dir", str(log_dir), "--learning-rate", lr])
                   for lr in ("0.001", "0.002")]
    return log_dir, metrics


def test_runs_started_in_the_same_second_never_share_a_directory(same_second, tmp_path):
    """Two runs in one second: the second takes the next free name, and each keeps its own
    checkpoint. More runs in that second (their claims as the command line makes them,
    `preflight.claim_run_dirs`, nothing trained) take the next suffixes, seed by seed."""
    log_dir, _ = same_second
    assert sorted(os.listdir(log_dir)) == [FIRST, SECOND]
    for name, lr in ((FIRST, 0.001), (SECOND, 0.002)):
        record = checkpoint.load(os.path.join(log_dir, name, checkpoint.LATEST))
        assert record["run_names"] == [name]
        assert record["config"]["learning_rate"] == lr  # each run kept its own checkpoint
    logs = tmp_path / "logs"
    shutil.copytree(log_dir, logs)

    def claim(*more):  # the directories a run of TINY + `more` claims in that second
        config, run, _ = flags.parse("ppo", Config, TINY + ["--log-dir", str(logs), *more])
        return preflight.claim_run_dirs(config, run, 1_700_000_000, writer=True)

    assert claim() == ["CartPole-v1__ppo__1__1700000000-3"]
    assert claim("--seed", "2", "--num-seeds", "2") == ["CartPole-v1__ppo__2__1700000000",
                                                       "CartPole-v1__ppo__3__1700000000"]
    names = sorted(os.listdir(logs))
    assert names == [FIRST, SECOND, "CartPole-v1__ppo__1__1700000000-3",
                     "CartPole-v1__ppo__2__1700000000", "CartPole-v1__ppo__3__1700000000"], names
    # The next run of seed 2 collides with the directory of seed 2 above: it moves on too.
    assert claim("--seed", "2") == ["CartPole-v1__ppo__2__1700000000-2"]
    assert "CartPole-v1__ppo__2__1700000000-2" in os.listdir(logs)


CLAIM = """
import os
import sys
import time

from common.host import preflight
from common.host.options import RunOptions

config = type("Config", (), {"env_id": "CartPole-v1"})()
run = RunOptions(log_dir=sys.argv[1], exp_name="ppo")
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):  # every process claims at once, in the same second
    time.sleep(0.001)
print(preflight.claim_run_dirs(config, run, 1_700_000_000, writer=True)[0], flush=True)
"""
"""A process that claims a run directory as the command line does (`claim_run_dirs`, at
the run time 1700000000) once the file `sys.argv[2]` exists: `python -c` this, the log
directory, that file. Prints `ready` when it waits, then the name it claimed."""


@pytest.mark.subprocess
def test_two_processes_started_together_get_two_directories(tmp_path):
    """Two processes claim their run directory at the same moment, in the same second: each
    gets its own (the claim is one atomic `mkdir`, never a check and then a make). That each
    run then keeps its own checkpoint there: `test_runs_started_in_the_same_second_...`."""
    go = tmp_path / "go"
    runs = [subprocess.Popen(["timeout", "-k", "5", "60", sys.executable, "-c", CLAIM,
                              str(tmp_path / "logs"), str(go)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # under a hard timeout: a hang ends, and fails the test
    try:
        for r in runs:
            assert r.stdout.readline() == "ready\n", r.stderr.read()[-2000:]
        go.touch()
        names = []
        for r in runs:
            out, err = r.communicate(timeout=60)
            assert r.returncode == 0, err[-2000:]
            names.append(out.strip())
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait()
    assert sorted(names) == [FIRST, SECOND], names
    assert sorted(os.listdir(tmp_path / "logs")) == [FIRST, SECOND]


# ------------------------------------------------------------------ checkpoints
def test_every_corrupted_byte_is_refused_and_names_the_previous_checkpoint(tmp_path):
    path = str(tmp_path / checkpoint.LATEST)
    save_initial(path, "ppo")
    record = checkpoint.load(path)  # the same, with two chunks of metric rows: every byte
    rows = checkpoint.Rows([{"loss": np.ones((1, 3), np.float32)},
                            {"loss": np.zeros((1, 2), np.float32)}])
    checkpoint.save(path, **{k: record[k] for k in ("algo", "config", "run", "run_names",
                                                    "update", "run_time", "train_state")},
                    metrics=rows)
    good = open(path, "rb").read()
    np.testing.assert_array_equal(checkpoint.load(path)["metrics"]["loss"], [[1, 1, 1, 0, 0]])
    previous = checkpoint.previous_path(path)
    refused = 0
    positions = sorted({*range(0, len(good), 37), *range(len(good) - 64, len(good))})
    fd = os.open(path, os.O_WRONLY)  # each bit flipped in the file, then flipped back
    try:
        for i in positions:
            for bit in (0x01, 0x80):
                os.pwrite(fd, bytes([good[i] ^ bit]), i)
                with pytest.raises(checkpoint.CheckpointError) as error:
                    checkpoint.load(path)
                assert repr(path) in str(error.value)
                os.pwrite(fd, good[i:i + 1], i)
                refused += 1
    finally:
        os.close(fd)
    assert refused == 2 * len(positions) > 3000
    # With the previous checkpoint beside it, a corrupt latest names it as the way on.
    with open(previous, "wb") as f:
        f.write(good)
    with open(path, "wb") as f:
        f.write(good[:-1] + bytes([good[-1] ^ 0x80]))
    with pytest.raises(checkpoint.CheckpointError,
                       match=f"The previous checkpoint '{previous}' \\(update 0\\) is intact: "
                             "--resume it."):
        checkpoint.load(path)


def test_two_checkpoints_are_kept_and_the_previous_one_resumes_into_the_latest(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    args = TINY + ["--log-dir", str(tmp_path), "--checkpoint-every", "4"]
    reference = main(args)
    (path,) = glob.glob(str(tmp_path / "*" / checkpoint.LATEST))
    previous = checkpoint.previous_path(path)
    assert sorted(os.listdir(os.path.dirname(path)))[-2:] == [checkpoint.LATEST,
                                                             "latest.previous.msgpack"]
    assert checkpoint.load(path)["update"] == 16 and checkpoint.load(previous)["update"] == 12
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x04
    open(path, "wb").write(bytes(data))
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", path])
    assert exit_info.value.code == 2
    # Resuming the previous checkpoint and stopped during its first chunk, the run saves the
    # state it resumed to the latest file, the one its message says to resume.
    def interrupted(*args, **kwargs):  # as `wait_for` is when a signal comes mid-chunk
        signal.raise_signal(signal.SIGINT)
        return False

    monkeypatch.setattr(cli, "wait_for", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", previous])
    assert exit_info.value.code == 130
    assert f"interrupted at update 12 of 16; checkpoint: {path}\n" in capsys.readouterr().out
    assert checkpoint.load(path)["update"] == 12 and checkpoint.load(previous)["update"] == 12
    monkeypatch.undo()
    # Resumed, it trains the last chunks again and rewrites the latest, keeping the good
    # previous file (not the corrupt one) as the one before it.
    steps = record_progress(monkeypatch)
    metrics = main(["--resume", path])
    assert steps[0] == 12 * 128 and steps[-1] == 16 * 128, steps  # from update 12 on
    for k in reference:
        np.testing.assert_array_equal(metrics[k], reference[k], err_msg=k)
    assert checkpoint.load(path)["update"] == 16 and checkpoint.load(previous)["update"] == 12


def test_a_resumed_run_reads_its_checkpoint_once(same_second, monkeypatch, capsys):
    """`--resume`: the file is read and verified once, by the flags, which hand its record on
    to the training (here a finished run: nothing to do); the devices are set up once. So
    too from Python, `flags.parse` then `cli.train_and_log`."""
    path = os.path.join(same_second[0], FIRST, checkpoint.LATEST)
    load, reads = checkpoint.load, []
    monkeypatch.setattr(checkpoint, "load", lambda p: reads.append(p) or load(p))
    setup_devices, setups = cli.setup_devices, []
    monkeypatch.setattr(cli, "setup_devices", lambda run: setups.append(run) or
                        setup_devices(run))
    main(["--resume", path])
    assert f"nothing to do: {path} is at update 16 of 16" in capsys.readouterr().out
    assert reads == [path] and len(setups) == 1
    reads.clear()
    config, run, resumed = flags.parse("ppo", Config, ["--resume", path])
    cli.train_and_log("ppo", config, run, make_train(config), resumed)
    assert f"nothing to do: {path} is at update 16 of 16" in capsys.readouterr().out
    assert reads == [path]


def test_a_resumed_run_logs_where_its_checkpoint_is_from_any_directory(tmp_path, monkeypatch):
    """The default --log-dir, `runs`, is relative to where the run started: resumed from
    elsewhere, its TensorBoard runs go on beside the checkpoint, not in a new `runs`."""
    path = save_initial(tmp_path / "start" / "runs" / "ppo_run_0" / checkpoint.LATEST, "ppo")
    assert checkpoint.load(path)["run"]["log_dir"] == "runs"
    monkeypatch.chdir(tmp_path)
    run = flags.parse("ppo", Config, ["--resume", path]).run
    assert run.log_dir == str(tmp_path / "start" / "runs")
    run = flags.parse("ppo", Config, ["--resume", path, "--log-dir", "elsewhere"]).run
    assert run.log_dir == "elsewhere"  # a flag given still wins


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_last_checkpoint(
        tmp_path, monkeypatch, capsys):
    writes = []
    write = checkpoint._write

    def fill_up(tmp, data):
        writes.append(tmp)
        if len(writes) == 3:  # as `write` raises it: no file name
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(tmp, data)

    monkeypatch.setattr(checkpoint, "_write", fill_up)
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--log-dir", str(tmp_path), "--checkpoint-every", "4"])
    assert exit_info.value.code == 1
    line = one_error_line(capsys.readouterr().err)
    (path,) = glob.glob(str(tmp_path / "*" / checkpoint.LATEST))
    assert "No space left on device" in line
    assert line.startswith(f"error: could not write {path} (No space left"), line
    assert f"Last complete checkpoint: {path} (update 8)." in line, line
    assert checkpoint.load(path)["update"] == 8
    # The failed write left the previous checkpoint as it was, not a second copy of update 8.
    assert checkpoint.load(checkpoint.previous_path(path))["update"] == 4
    assert not glob.glob(str(tmp_path / "*" / ".tmp-*"))  # no temporary file left behind
    monkeypatch.undo()
    steps = record_progress(monkeypatch)
    metrics = main(["--resume", path])  # and the run goes on from there
    assert steps[0] == 8 * 128 and steps[-1] == 16 * 128, steps  # from update 8 on
    assert metrics["episodic_return"].shape == (1, 16)


def test_paths_that_cannot_hold_a_checkpoint_are_refused(tmp_path):
    (tmp_path / "a_file").write_text("")
    for path, message in [(str(tmp_path), "it is a directory"),
                          (str(tmp_path / "a_file" / "latest.msgpack"), "File exists")]:
        with pytest.raises(checkpoint.CheckpointError, match=message):
            checkpoint.check_writable(path)
    checkpoint.check_writable(str(tmp_path / "new" / "latest.msgpack"))
    assert os.listdir(tmp_path / "new") == []  # the test file is gone


# ------------------------------------------------------------------ signals and start-up
LONG = ["--total-timesteps", "2097152000", "--num-steps", "32", "--num-devices", "1"]
"""16,384,000 updates in chunks of 819,200: a chunk computes for many minutes (4,096 updates
of 128 steps took about 20 s here; these have 32), far longer than a test waits for the run
to stop. The config of `save_initial(..., "ppo", total_timesteps=2097152000)`, so that both
runs below compile one program."""


def started(run) -> list:
    """Wait for the first progress line of `run` (training has begun)."""
    seen = []
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        line = run.stdout.readline()
        assert line, "the run ended before training:\n" + "".join(seen) + run.stderr.read()
        seen.append(line)
        if "step" in line:
            return seen
    raise AssertionError("no progress line")


@pytest.mark.subprocess
@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_saves_at_once_not_at_the_end_of_a_chunk(signals, tmp_path):
    """Ctrl-C (once or twice) while the first chunk computes: the run exits with 130, having
    saved update 0, without waiting for that chunk (nor for the one queued behind it) to
    end. A chunk of `LONG` computes for many minutes, so a run that exits at all before the
    deadline did not wait for it; one that waited and then saved would say update 819200.

    Twice, the second signal may stop the first one's write: the run resumes `LONG` from a
    kept previous checkpoint, so that it writes its latest one when stopped and a complete
    checkpoint exists whichever signal wins; the one its last line names must be there."""
    command = [sys.executable, "algos/ppo.py", *LONG, "--log-dir", str(tmp_path)]
    if signals == 2:
        previous = save_initial(tmp_path / "ppo_run_0" / "latest.previous.msgpack", "ppo",
                                total_timesteps=2097152000)
        command = [sys.executable, "algos/ppo.py", "--resume", previous]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    started(run)
    time.sleep(1.0)  # well inside the first chunk
    for _ in range(signals):
        run.send_signal(signal.SIGINT)
    try:
        out, err = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        run.kill()
        out, err = run.communicate()
        pytest.fail(f"still running 60 s after Ctrl-C: it waited for the chunk\n{out}{err}")
    assert run.returncode == 130, err
    assert "Traceback" not in err, err
    paths = glob.glob(str(tmp_path / "*" / checkpoint.LATEST))
    if signals == 1:
        assert "interrupted at update 0 of 16384000" in out, out
        assert checkpoint.load(paths[0])["update"] == 0
    else:  # the latest is whole or absent; the one named, whole
        assert all(checkpoint.load(p)["update"] == 0 for p in paths)
        assert not glob.glob(str(tmp_path / "*" / ".tmp-*"))
        saved = re.search(r"^interrupted at update 0 of 16384000; checkpoint: (\S+)$", out, re.M)
        abandoned = re.search(r"^SIGINT again: stopped at once\. Last complete checkpoint: "
                              r"(\S+) \(update 0\)\.$", err, re.M)
        assert saved or abandoned, out + err
        named = (saved or abandoned).group(1)
        assert checkpoint.load(named)["update"] == 0


def test_ctrl_c_while_starting_exits_quietly(tmp_path, monkeypatch, capsys):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "compile_programs", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(TINY + ["--log-dir", str(tmp_path)])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.strip() == \
        "interrupted while starting; nothing was trained or written"


@pytest.mark.parametrize("session", [None, "library", "ipython"])
def test_inside_an_ipython_session_the_command_line_never_ends_the_process(session, tmp_path,
                                                                         monkeypatch):
    """`%run algos/ppo.py ...` runs `main()` (argv None) in the user's IPython session, which
    must outlive the run: no watcher that ends the process on Ctrl-C while starting, no
    `os._exit` when the run ends. A real command line has both; so does a script that merely
    imports IPython (mediapy does), where `get_ipython()` is None."""
    from common.host.starting import STARTING

    if session is not None:
        ipython = type(sys)("IPython", "a stand-in")
        ipython.get_ipython = lambda: object() if session == "ipython" else None
        monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setattr(sys, "argv", ["algos/ppo.py", *TINY, "--log-dir", str(tmp_path)])
    seen = {}

    def train_and_log(*args):  # what the run would see when training begins
        seen["watched"] = STARTING.thread is not None
        return "metrics"

    monkeypatch.setattr(cli, "train_and_log", train_and_log)
    monkeypatch.setattr(cli, "leave_now", lambda code: seen.setdefault("left with", code))
    before = signal.getsignal(signal.SIGINT)
    assert main() == "metrics"
    assert STARTING.thread is None and signal.getsignal(signal.SIGINT) is before
    if session == "ipython":
        assert seen == {"watched": False}
    else:
        assert seen == {"watched": True, "left with": 0}


@pytest.mark.subprocess
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_compiling_leaves_at_once_with_one_line(signum, tmp_path):
    """From the command line, Ctrl-C (or SIGTERM) while the programs are being built: one
    line, exit status 128 + the signal, within seconds (not once compiling ends, nor dropped
    inside a JAX callback so that the run goes on), and nothing written."""
    run = subprocess.Popen([sys.executable, "algos/ppo.py", "--env-id", "MaskedCartPole-v1",
                            "--log-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert run.stdout.readline().startswith("preset for ppo on MaskedCartPole-v1")  # parsed
    time.sleep(2.0)  # building the GRU's programs: compiling takes several seconds more
    sent = time.perf_counter()
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    assert time.perf_counter() - sent < 10, "waited for the compiler"
    assert run.returncode == 128 + signum, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["interrupted while starting; nothing was trained or written"], err
    assert "step" not in out and not glob.glob(str(tmp_path / "*" / checkpoint.LATEST))


@pytest.mark.subprocess
@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_ctrl_c_while_the_file_imports_is_the_same_one_line(algo, tmp_path):
    """Ctrl-C before any of the command line's own code has run, while the algorithm file
    still imports JAX and the rest (`python -X importtime` says when): the same one line, exit
    130, not a KeyboardInterrupt traceback."""
    returncode, lines, out = interrupted_while_importing(
        [f"algos/{algo}.py", "--log-dir", str(tmp_path)], ROOT)  # JAX loads inside distrax's
    assert returncode == 130, lines
    assert lines == ["interrupted while starting; nothing was trained or written"], lines
    assert out == ""


def test_a_train_without_a_piece_the_command_line_needs_is_one_line(tmp_path, monkeypatch,
                                                                    capsys):
    """A copied algorithm file whose `train` lost a piece `common/host/contract.py` lists:
    one line naming it, exit 1, before anything compiles or any directory is made."""
    import algos.ppo as ppo

    def without_act(config):
        train = ppo.make_train(config)
        del train.act
        return train

    def compiled(*args):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(cli, "compile_programs", compiled)
    with pytest.raises(SystemExit) as exit_info:
        cli.main("ppo", Config, without_act, TINY + ["--log-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: algos/ppo.py: the train its make_train returns has no "
                           "`act`, which the command line needs: `act(state, obs, first, "
                           "hidden) -> (action, hidden)`"), line
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ memory and host loops
def test_running_out_of_memory_is_one_line(capsys):
    from jax.errors import JaxRuntimeError

    with pytest.raises(SystemExit) as exit_info:
        config = type("C", (), {"num_envs": 1, "num_steps": 1})()
        with preflight.out_of_memory_is_one_line(config):
            raise JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                  "86431842304 bytes.\nmore lines")
    assert exit_info.value.code == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: does not fit in memory (RESOURCE_EXHAUSTED: Out of memory")
    assert line.endswith("reduce --num-seeds, --num-envs, --num-steps.")
    with pytest.raises(JaxRuntimeError):  # any other runtime error is not disguised
        with preflight.out_of_memory_is_one_line(None):
            raise JaxRuntimeError("INTERNAL: something else")


def lines_run(budget: int, fn, *args):
    """`fn(*args)`, counting the lines of Python it runs (each turn of a loop counts again,
    in the functions it calls too); past `budget` lines it stops with an AssertionError
    rather than run a long search to its end."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise AssertionError(f"{fn.__name__}{args} ran more than {budget} lines")
        return trace

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: trace)
    try:
        return fn(*args)
    finally:
        sys.settrace(previous)


def test_the_chunk_size_search_is_short_for_any_run_length():
    """O(sqrt(n)) steps, not O(n), counted rather than timed: each search runs at most
    100,000 lines of Python (the divisors of a number near 2**31 take about 46,400; a
    search through every chunk length would take up to 2**31)."""
    short = functools.partial(lines_run, 100_000, cli.chunk_size)
    assert short(2**31 - 1) == 107_374_182  # a prime: 20 chunks and a last one of 7
    assert short(2**30, 2**20) == 2**20
    assert short(2**31 - 2, 6) == 6  # 2**31 - 2 = 2 * 3**2 * 7 * 11 * 31 * 151 * 331
    assert short(1_953_125_000, 0, 0) == 97_656_250


def test_global_step_is_a_64_bit_count_on_the_host(same_second):
    metrics = same_second[1][0]  # a command-line run's
    assert metrics["global_step"].dtype == np.int64
    np.testing.assert_array_equal(metrics["global_step"][0], 128 * np.arange(1, 17))
    one = session.Session("ppo", type("C", (), {"batch_size": 2**20, "num_updates": 2**14})(),
                          type("R", (), {"num_seeds": 1, "eval_every": 0})(), None, None, None,
                          None, None)
    rows = {"global_step": np.zeros((1, 2), np.int32), "episodic_return": np.zeros((1, 2))}
    one.files = type("W", (), {"put": lambda *a, **k: None})()
    progress = type("P", (), {"report": lambda *a, **k: None, "timeline": []})()
    output.log_chunk(one, rows, np.ones(1, bool), 2**14 - 2, 2**14, None, progress, [])
    assert rows["global_step"].tolist() == [[(2**14 - 1) * 2**20, 2**34]]  # past 2**31


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_the_python_api_counts_steps_past_2_31_without_wrapping(algo):
    """Inside `train` JAX has no int64: a run of 2^32 steps counts them in float32, not in an
    int32 that would turn negative (traced, not compiled); a shorter run keeps int32."""
    import dataclasses
    import importlib

    import jax

    from common.rollout import steps_done

    module = importlib.import_module(f"algos.{algo}")
    config = dataclasses.replace(module.Config(), total_timesteps=2**32)
    shapes = jax.eval_shape(module.make_train(config), jax.random.PRNGKey(0))[1]
    assert shapes["global_step"].dtype == np.float32
    assert shapes["global_step"].shape == (config.num_updates,)
    last = steps_done(np.int32(config.num_updates - 1), config.batch_size, config.num_updates)
    total = config.num_updates * config.batch_size
    assert total > 2**31 and float(last) == pytest.approx(total, rel=2**-24)  # float32
    assert steps_done(np.int32(9), 512, 10).dtype == np.int32


def test_the_summary_and_progress_say_n_a_where_there_is_no_figure():
    """A run in which no episode ended (a short Brax run, say) summarises its return as
    `n/a`, not `nan`; runs without one are counted apart from those with one; and the first
    progress line, with no interval behind it yet, shows no SPS figure."""
    nan = float("nan")
    assert output.final_return_text(np.array([nan, nan])) == "n/a: no episode ended"
    assert output.final_return_text(np.array([10.0, nan, 30.0])) == \
        "mean 20.00, min 10.00 (1 of 3 runs: no episode ended)"
    assert output.final_return_text(np.array([10.0, 30.0])) == "mean 20.00, min 10.00"
    stream = io.StringIO()
    progress = Progress("ppo CartPole-v1", 1000, min_interval=0.0, stream=stream)
    progress.report(0, [nan])
    time.sleep(0.01)
    progress.report(500, [20.0])
    first, second = stream.getvalue().splitlines()
    assert "nan" not in first and "return       n/a |        n/a SPS per run | ETA    n/a" \
        in first, first
    assert "nan" not in second and "return     20.00 |" in second, second


def test_the_progress_line_keeps_each_run_s_last_return_through_chunks_without_an_episode():
    """Long episodes and short chunks: a chunk in which a run finished no episode shows that
    run's figure from the latest chunk in which it did (found in the rows so far on the
    first call, as after a resume), and NaN only before its first episode."""
    nan = np.nan
    rows = [{"episodic_return": np.array([[1.0, nan], [nan, nan], [nan, 7.0]])},
            {"episodic_return": np.array([[nan, 3.0], [nan, nan], [nan, nan]])}]
    recent = output.recent_returns(rows)  # a resumed run's first chunk: scan back
    np.testing.assert_array_equal(recent, [3.0, nan, 7.0])
    later = output.recent_returns([{"episodic_return": np.array([[nan, nan], [5.0, nan],
                                                              [2.0, 4.0]])}], recent)
    np.testing.assert_array_equal(later, [3.0, 5.0, 3.0])


def test_evaluation_keys_are_none_of_the_keys_init_derives():
    """The command line's evaluation keys (`output.eval_keys`) after any update are none of
    the keys `init` derives from a run's seed key: `split(seed key, 3)` (the carried key, the
    network's, the environments'), the environments' own, nor the first update's."""
    import jax

    from common.host.logger import seed_keys
    from helpers import initial_state

    run, num_envs = type("R", (), {"seed": 1, "num_seeds": 2})(), 4
    _, _, state = initial_state("ppo", num_seeds=2, num_envs=num_envs)
    derived = set()
    for seed_key, carried in zip(seed_keys(run.seed, run.num_seeds), np.asarray(state.key)):
        key, key_net, key_env = np.asarray(jax.random.split(seed_key, 3))
        np.testing.assert_array_equal(carried, key)  # as `init` splits it
        derived |= {tuple(k) for k in (key, key_net, key_env,
                                       *np.asarray(jax.random.split(key_env, num_envs)),
                                       *np.asarray(jax.random.split(key, 3)))}
    evaluated = np.concatenate([np.asarray(output.eval_keys(run, u)) for u in range(64)])
    assert not derived & {tuple(k) for k in evaluated}
    assert len({tuple(k) for k in evaluated}) == len(evaluated)  # each update its own
