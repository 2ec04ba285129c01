"""Checkpoints and exact resume (`common/host/checkpoint.py`, `common/host/cli.py`), through PPO's CLI.

One small config (66 tiny updates, 2 seeds: 8 chunks of 8, then a last, shorter chunk of 2
with its own compiled program) is trained once uninterrupted in this process; every other run
here (interrupted by SIGINT in-process, killed by SIGKILL in a subprocess, then resumed) must
end with the same training state and metrics, bitwise. They share one compiled chunk through
the session's persistent compilation cache (conftest).
"""

import glob
import hashlib
import importlib
import os
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from algos.ppo import Config, main, make_train
from common.host import checkpoint, cli, flags, logger, preflight, session
from helpers import record_progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--env-id", "CartPole-v1", "--total-timesteps", "8448", "--num-envs", "4",
        "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1", "--num-seeds", "2",
        "--checkpoint-every", "16", "--eval-every", "16", "--eval-episodes", "4",
        "--num-devices", "1"]  # bitwise comparisons need one layout (2 seeds on 1 device)
NUM_UPDATES = 66  # 8 chunks of 8 and one of 2: cli.chunk_size(66, 16, 16, steps_per_update=256)


def latest(log_dir) -> str:
    (path,) = glob.glob(os.path.join(str(log_dir), "*", checkpoint.LATEST))
    return path


def restored(record):
    """The TrainState of a checkpoint record of ARGS' config."""
    config, run, _ = flags.parse("ppo", Config, ARGS)
    train = make_train(config)
    keys = logger.seed_keys(run.seed, run.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    template = jax.eval_shape(jax.vmap(train.init), keys, hparams)
    return checkpoint.restore(template, record["train_state"])


def tensorboard_files(run_dir):
    """The events of each TensorBoard event file of `run_dir` (oldest file first), parsed
    from the TFRecord framing: 8-byte length, 4-byte CRC, the Event, 4-byte CRC."""
    from tensorboardX.proto import event_pb2

    files = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")),
                       key=os.path.getmtime):
        data, i, events = open(path, "rb").read(), 0, []
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            events.append(event_pb2.Event.FromString(data[i + 12:i + 12 + n]))
            i += 12 + n + 4
        files.append(events)
    return files


def returns_logged(events):
    return [e.step for e in events for v in e.summary.value
            if v.tag == "charts/episodic_return"]


def assert_same_run(metrics, record, reference):
    """`metrics` and the checkpoint `record` equal the reference run's, bitwise."""
    ref_metrics, ref_record = reference
    assert metrics.keys() == ref_metrics.keys()
    for k in ref_metrics:
        np.testing.assert_array_equal(metrics[k], ref_metrics[k], err_msg=k)
    assert record["update"] == ref_record["update"] == NUM_UPDATES
    for k in ref_metrics:
        np.testing.assert_array_equal(record["metrics"][k], ref_metrics[k], err_msg=k)
    ours = jax.tree_util.tree_flatten_with_path(record["train_state"])[0]
    theirs = jax.tree.leaves(ref_record["train_state"])
    assert len(ours) == len(theirs)
    for (where, a), b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(where))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted CLI run: its metrics and its final checkpoint."""
    log_dir = tmp_path_factory.mktemp("reference")
    metrics = main(ARGS + ["--log-dir", str(log_dir)])
    return metrics, checkpoint.load(latest(log_dir))


def test_cli_run_equals_all_updates_in_one_call_and_logs_evaluations(reference):
    metrics, record = reference
    assert metrics["global_step"].shape == (2, NUM_UPDATES)
    # Evaluations ran at updates 16, 32, 48, 64 (rows 15, ...) and at the end, 66.
    evaluated = np.isfinite(metrics["eval_return"][0])
    np.testing.assert_array_equal(np.flatnonzero(evaluated), [15, 31, 47, 63, 65])
    assert (metrics["eval_return"][:, evaluated] >= 8).all()

    # The same as `train.init` then all the updates in one call. (Not bitwise the same as
    # `jit(vmap(train))(keys)`: with `init` inside the same program XLA compiles the vmapped
    # computation differently, and the runs drift apart by rounding.)
    config, run, _ = flags.parse("ppo", Config, ARGS)
    train = make_train(config)
    keys = logger.seed_keys(run.seed, run.num_seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    state, api = jax.jit(jax.vmap(train.run_updates, in_axes=(0, 0, None)))(
        jax.jit(jax.vmap(train.init))(keys, hparams), hparams, jnp.arange(NUM_UPDATES))
    for k in api:
        np.testing.assert_array_equal(metrics[k], api[k], err_msg=k)
    for a, b in zip(jax.tree.leaves(restored(record)), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)


def test_interrupted_in_process_and_resumed_equals_uninterrupted(reference, tmp_path,
                                                                 monkeypatch, capsys):
    # Ctrl-C arrives while the 5th chunk's progress is printed: the run finishes that chunk,
    # writes a checkpoint at update 5 * 8 = 40 (between the periodic ones at 32 and 48)
    # and exits with 130.
    record_progress(monkeypatch, interrupt_after=6)  # the step-0 report, then one per chunk
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest was started in background
    with pytest.raises(SystemExit) as exit_info:
        main(ARGS + ["--log-dir", str(tmp_path)])
    assert exit_info.value.code == 130
    path = latest(tmp_path)
    out = capsys.readouterr()
    assert f"interrupted at update 40 of {NUM_UPDATES}; checkpoint: {path}" in out.out
    assert "SIGINT: saving the last complete update and stopping" in out.err
    assert checkpoint.load(path)["update"] == 40
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is restored

    # TensorBoard was written as training went: every update up to the interruption that
    # finished an episode (the uninterrupted run's) is there, and none after it.
    run_dir = os.path.dirname(path)
    (before,) = tensorboard_files(run_dir)
    finished = np.flatnonzero(np.isfinite(reference[0]["episodic_return"][0]))
    assert returns_logged(before) == [128 * (1 + u) for u in finished if u < 40]  # 4 x 32

    monkeypatch.undo()
    steps = record_progress(monkeypatch)
    metrics = main(["--resume", path])  # every other flag comes from the checkpoint
    assert_same_run(metrics, checkpoint.load(path), reference)
    # It went on from update 40: chunks ending at 48, 56, 64, then the last one at 66.
    assert steps == [u * 128 for u in (40, 48, 56, 64, NUM_UPDATES)], steps
    # The resumed run's file starts by purging what the first process wrote (a SessionLog
    # START at step 0: TensorBoard hides older events from step 0 on), then logs every
    # update once, the saved ones included.
    _, after = tensorboard_files(run_dir)
    start = [i for i, e in enumerate(after) if e.session_log.status == e.session_log.START]
    assert start and after[start[0]].step == 0 and not returns_logged(after[:start[0]])
    finished = np.isfinite(metrics["episodic_return"][0])
    np.testing.assert_array_equal(returns_logged(after),
                                  128 * (1 + np.flatnonzero(finished)))


KILLED_MID_WRITE = """
import os
import time

from algos.ppo import main
from common.host import checkpoint

write, calls = checkpoint._write, []


def half_then_wait(tmp, data):  # the second checkpoint: half its bytes, then wait for SIGKILL
    calls.append(tmp)
    if len(calls) < 2:
        return write(tmp, data)
    with open(os.open(tmp, os.O_WRONLY), "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
    print("KILL ME: half of the second checkpoint written", flush=True)
    time.sleep(300)


checkpoint._write = half_then_wait
main()
"""
"""`algos/ppo.py` whose writer thread stops halfway through writing its second checkpoint's
file (update 32 of ARGS), says so on stdout and waits there to be killed: `python -c` this,
then the flags. Training goes on meanwhile on the main thread."""


@pytest.mark.subprocess
def test_sigkill_during_a_run_then_resume_completes_identically(reference, tmp_path,
                                                                 monkeypatch, capsys):
    """SIGKILL (no handler runs) while the run writes a checkpoint, half of its bytes on disk:
    the checkpoint before it (update 16) is whole and in place, the half-written file beside it
    under a temporary name, and resumed from there the run ends as the uninterrupted one."""
    run = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, *ARGS, "--log-dir",
                            str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in run.stdout] + [lines.put(None)],
                     daemon=True).start()
    try:
        deadline, seen = time.monotonic() + 300, []
        while not seen or not seen[-1].startswith("KILL ME"):
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "".join(seen) + run.stderr.read()[-3000:]
            seen.append(line)
        run.kill()
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == -signal.SIGKILL
    path = latest(tmp_path)
    assert checkpoint.load(path)["update"] == 16  # the last whole one, in its place
    (half,) = glob.glob(os.path.join(os.path.dirname(path), ".tmp-*"))
    assert 0 < os.path.getsize(half) < os.path.getsize(path)  # the killed write's own file

    steps = record_progress(monkeypatch)
    metrics = main(["--resume", path])
    assert "done: PPO on CartPole-v1, 2 run(s)" in capsys.readouterr().out
    assert steps[0] == 16 * 128, steps  # it went on from the checkpoint
    record = checkpoint.load(path)
    assert_same_run(metrics, record, reference)


def test_non_finite_loss_stops_training_with_a_clear_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(ARGS + ["--log-dir", str(tmp_path), "--learning-rate", "1e30"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: non-finite ") and "in update 1 (global step 128, seed 1)" \
        in err, err
    assert err.endswith("Last good checkpoint: none was written."), err
    assert not glob.glob(str(tmp_path / "*" / checkpoint.LATEST))


def test_a_fresh_run_traces_init_once_for_its_template_and_its_first_state(tmp_path):
    """One trace of `train.init` gives the state's template and (on one device) the program
    of the first state: an MJX reset takes seconds to trace (a TPU host's CheetahRun start
    spent 47 s in two), and that state is `jit(vmap(init))`'s, bit for bit."""
    config, run, _ = flags.parse("ppo", Config, ARGS + ["--log-dir", str(tmp_path)])
    train = make_train(config)
    init, traced = train.init, []

    def counted(key, hparams=None):
        traced.append(key.shape)
        return init(key, hparams)

    train.init = counted
    s = cli.start_or_resume("ppo", config, run, train)
    cli.first_state(s)
    assert traced == [(2,)], traced  # one trace, of vmap's one-run shapes
    expected = jax.jit(jax.vmap(init))(s.keys, s.hparams)
    for a, b in zip(jax.tree.leaves(s.state), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


def test_non_finite_parameter_keeps_the_last_good_checkpoint(tmp_path, capsys):
    config, run, _ = flags.parse("ppo", Config,
                                 ARGS + ["--log-dir", str(tmp_path), "--eval-every", "0"])
    train = make_train(config)
    run_updates = train.run_updates

    def poisoned(state, hparams, updates):  # parameters turn NaN in the chunk of update 44
        state, metrics = run_updates(state, hparams, updates)
        nan = jnp.where(updates[-1] >= 44, jnp.nan, 0.0)
        return state._replace(params=jax.tree.map(lambda p: p + nan, state.params)), metrics

    train.run_updates = poisoned
    with pytest.raises(SystemExit) as exit_info:
        cli.train_and_log("ppo", config, run, train)
    assert exit_info.value.code == 1
    path = latest(tmp_path)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: non-finite parameter ['params']") and \
        "in update 48 (global step 6,144, seed 1)" in err, err  # the chunk 40-47
    assert err.endswith(f"Last good checkpoint: {path} (update 32)."), err
    record = checkpoint.load(path)
    assert record["update"] == 32
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(record["train_state"]))


def test_checkpoint_writes_are_atomic_and_leave_no_temporary_file(tmp_path, monkeypatch):
    path = str(tmp_path / "run" / checkpoint.LATEST)
    state = {"w": np.arange(6.0).reshape(2, 3)}
    checkpoint.save(path, algo="ppo", config={"lr": 0.1}, run={}, run_names=[], update=3,
                    run_time=7, train_state=state, metrics={"loss": np.ones((2, 3))})
    before = open(path, "rb").read()

    def crash(src, dst):  # the process dies between writing the new file and renaming it
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, algo="ppo", config={"lr": 0.1}, run={}, run_names=[], update=4,
                        run_time=7, train_state=state, metrics={"loss": np.ones((2, 4))})
    assert open(path, "rb").read() == before  # the old checkpoint is intact
    assert os.listdir(tmp_path / "run") == [checkpoint.LATEST]
    record = checkpoint.load(path)
    assert record["update"] == 3 and record["config"] == {"lr": 0.1}
    np.testing.assert_array_equal(record["train_state"]["w"], state["w"])


class AbandonedWrite:
    """A `session.CheckpointWriter` about to write update 4 over a checkpoint of update 3, and
    `handler`, which abandons its writes as a second signal's handler does from the main
    thread (run here on a thread of its own, while the writer is inside one of its steps),
    noting the temporary files left the moment `abandon` returns."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "run"
        self.path = str(self.dir / checkpoint.LATEST)
        self.record = dict(algo="ppo", config={}, run={}, run_names=[], run_time=7,
                           train_state={"w": np.arange(6.0)})
        checkpoint.save(self.path, update=3, metrics={}, **self.record)
        self.before = open(self.path, "rb").read()
        self.writer, self.seen = session.CheckpointWriter(), {}
        self.thread = threading.Thread(target=self.handler)

    def temporary(self) -> list:
        return glob.glob(str(self.dir / ".tmp-*"))

    def handler(self):
        self.writer.abandon()
        self.seen["after abandon"] = self.temporary()

    def write(self):
        """The write, which stops quietly: nothing reported, the last checkpoint as it was,
        no temporary file."""
        self.writer.write(self.path, keep_previous=True, metrics=[], update=4, **self.record)
        self.thread.join()
        assert self.writer.written.empty()
        assert open(self.path, "rb").read() == self.before
        assert not self.temporary()


def test_abandon_between_the_writer_s_steps_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Abandoned once the new file is made, before its bytes are written: the file is gone
    when `abandon` returns, and the write does not make it again (with `os._exit` next, a
    file made again would stay behind)."""
    abandoned, write = AbandonedWrite(tmp_path), checkpoint._write

    def abandoned_first(tmp, data):
        abandoned.thread.start()
        abandoned.thread.join()
        try:
            write(tmp, data)
        finally:
            abandoned.seen["after the write"] = abandoned.temporary()

    monkeypatch.setattr(checkpoint, "_write", abandoned_first)
    abandoned.write()
    assert abandoned.seen == {"after abandon": [], "after the write": []}


def test_abandon_while_a_temporary_file_is_made_waits_and_removes_it(tmp_path, monkeypatch):
    """Abandoned while the writer makes its temporary file (it exists, not yet registered):
    `abandon` waits for that step, under the lock they share, then removes the file; without
    the lock it would miss the file. The writer gives the handler 0.2 s to run first."""
    abandoned, mkstemp, write = AbandonedWrite(tmp_path), tempfile.mkstemp, checkpoint._write

    def made_then_abandoned(*args, **kwargs):
        made = mkstemp(*args, **kwargs)
        abandoned.thread.start()
        abandoned.thread.join(timeout=0.2)
        return made

    def after_the_handler(tmp, data):  # the handler has had its turn
        abandoned.thread.join()
        write(tmp, data)

    monkeypatch.setattr(tempfile, "mkstemp", made_then_abandoned)
    monkeypatch.setattr(checkpoint, "_write", after_the_handler)
    abandoned.write()
    assert abandoned.seen == {"after abandon": []}


def test_abandon_while_the_previous_checkpoint_is_linked_waits_and_removes_it(tmp_path,
                                                                             monkeypatch):
    """Abandoned while the writer links the checkpoint it replaces to its temporary name (to
    keep it as the previous one; the name is removed, then made again as the link): `abandon`
    waits for the link, then removes it; without the lock it would find no file, and the
    link would make one after it. The writer gives the handler 0.2 s to run first."""
    abandoned, link, keep = AbandonedWrite(tmp_path), os.link, checkpoint._link_or_copy

    def linked_then_abandoned(source, tmp):
        abandoned.thread.start()
        abandoned.thread.join(timeout=0.2)
        link(source, tmp)

    def kept(*args):
        try:
            return keep(*args)
        finally:
            abandoned.thread.join()
            abandoned.seen["after the link"] = abandoned.temporary()

    monkeypatch.setattr(os, "link", linked_then_abandoned)
    monkeypatch.setattr(checkpoint, "_link_or_copy", kept)
    abandoned.write()
    assert abandoned.seen == {"after abandon": [], "after the link": []}


def test_metric_rows_are_saved_chunk_by_chunk_and_format_3_files_still_load(tmp_path):
    path = str(tmp_path / checkpoint.LATEST)
    state = {"w": np.arange(6.0).reshape(2, 3)}
    first = {"loss": np.ones((2, 3), np.float32), "eval_return": np.full((2, 3), 7.0)}
    second = {"loss": np.zeros((2, 2), np.float32)}  # no evaluation in this chunk
    rows = checkpoint.Rows([first])
    blob = rows.blobs[0]
    rows.append(second)
    assert rows.blobs[0] is blob and len(rows) == 2  # a chunk is serialised once
    fields = dict(algo="ppo", config={"lr": 0.1}, run={}, run_names=[], run_time=7,
                  train_state=state)
    checkpoint.save(path, update=5, metrics=rows, **fields)
    metrics = checkpoint.load(path)["metrics"]
    np.testing.assert_array_equal(metrics["loss"], [[1, 1, 1, 0, 0]] * 2)
    np.testing.assert_array_equal(metrics["eval_return"], [[7, 7, 7, np.nan, np.nan]] * 2)
    # One dict of rows is saved as one chunk, and loads the same.
    checkpoint.save(path, update=5, metrics=metrics, **fields)
    again = checkpoint.load(path)["metrics"]
    for k in metrics:
        np.testing.assert_array_equal(again[k], metrics[k])
    # A file of the previous format (the metrics inside the payload, one checksum) loads.
    record = {**fields, "update": 5, "versions": {}, "metrics": metrics}
    payload = serialization.msgpack_serialize(record)
    old = serialization.msgpack_serialize({"format_version": 3, "payload": payload,
                                           "sha256": hashlib.sha256(payload).hexdigest()})
    open(path, "wb").write(old)
    loaded = checkpoint.load(path)
    assert loaded["update"] == 5
    np.testing.assert_array_equal(loaded["metrics"]["loss"], metrics["loss"])
    bad = bytearray(old)
    bad[-20] ^= 0x01
    open(path, "wb").write(bytes(bad))
    with pytest.raises(checkpoint.CheckpointError, match="is corrupt"):
        checkpoint.load(path)


def test_config_differences_name_each_field_with_both_values():
    saved = {"learning_rate": 2.5e-4, "num_envs": 4, "log_dir": "runs", "target_kl": None}
    now = {"learning_rate": 1e-3, "num_envs": 4, "log_dir": "elsewhere", "target_kl": 0.01}
    assert preflight.config_differences(saved, now, ignore=("log_dir",)) == [
        "learning_rate: 0.00025 -> 0.001", "target_kl: None -> 0.01"]


def test_chunk_size_divides_the_cadences_and_the_resume_point_and_the_run_where_it_can():
    assert cli.chunk_size(512) == 32  # 16 chunks: nearer 20 than 32 chunks
    assert cli.chunk_size(512, 64, 128) == 32
    assert cli.chunk_size(512, 64, 128, 80) == 16  # resumed at 80: gcd 16
    assert cli.chunk_size(512, 0, 0, 0) == 32  # 0: no cadence, a fresh run
    # No divisor of the run near 20 chunks: the cadence's divisor closest to 20 chunks, and a
    # shorter last chunk (512 = 42 x 12 + 8, 97 = 19 x 5 + 2), not 128 or 97 chunks.
    assert cli.chunk_size(512, 12) == 12
    assert cli.chunk_size(97, 10) == 5
    assert cli.chunk_size(97) == 5  # a prime, no cadence: 20 chunks, the last of 2
    # A2C, 16 envs x 5 steps, 5e5 steps: 6247 updates (a prime) in 8 chunks, not 6247.
    assert cli.chunk_size(6247, steps_per_update=80) == 781
    # Closest to 20 chunks by ratio, not the most chunks up to 20: 781 = 11 x 71.
    assert cli.chunk_size(781) == 71  # 11 chunks, not 71
    assert cli.chunk_size(976) == 61  # 976 = 16 x 61: 16 chunks, not 61
    assert cli.chunk_size(6250) == 250  # 25 chunks, not 10
    # Fewer chunks, down to 8, where 20 would hold under MIN_CHUNK_STEPS steps each.
    assert cli.chunk_size(6250, steps_per_update=8 * 80) == 625  # 10 chunks of 400k steps
    assert cli.chunk_size(6250, steps_per_update=32 * 80) == 250  # 16M steps: 25 chunks
    assert cli.chunk_size(976, steps_per_update=512) == 122  # 5e5 steps: 8 chunks
    assert cli.chunk_size(NUM_UPDATES, 16, 16, steps_per_update=256) == 8  # ARGS' chunks
    # A cadence as long as the run or longer never falls inside it: it constrains nothing
    # (it made 3906 updates run as 3906 chunks of one).
    assert cli.chunk_size(3906, 4001, 3906, steps_per_update=512) == \
        cli.chunk_size(3906, steps_per_update=512) == 434


@pytest.mark.parametrize("algo, network", [("a2c", "auto"), ("impala", "lstm"),
                                           ("ppo", "gru")])
def test_a2c_impala_and_recurrent_networks_resume_exactly_too(algo, network, tmp_path,
                                                              monkeypatch):
    """The run's kept previous checkpoint (update 24 of 32), resumed, trains the last updates
    again into the same state and metrics, bitwise: every part of these algorithms' state (a
    recurrent core's state of every environment among them) is in the checkpoint."""
    main = importlib.import_module(f"algos.{algo}").main
    args = ["--total-timesteps", "2560", "--num-envs", "4", "--num-steps", "20",
            "--checkpoint-every", "8", "--num-seeds", "2"]  # 32 updates, chunks of 4
    if network != "auto":  # the core's state of every environment is in the checkpoint
        args += ["--network", network, "--hidden-size", "16", "--env-id", "MaskedCartPole-v1"]
    if algo == "ppo":
        args += ["--num-minibatches", "2", "--update-epochs", "2"]
    reference = main(args + ["--log-dir", str(tmp_path)])
    path = latest(tmp_path)
    theirs = checkpoint.load(path)["train_state"]
    previous = checkpoint.previous_path(path)
    assert checkpoint.load(previous)["update"] == 24
    steps = record_progress(monkeypatch)
    metrics = main(["--resume", previous])  # trains updates 24 to 32 into `path` again
    assert steps == [u * 80 for u in (24, 28, 32)], steps  # from update 24 on
    for k in reference:
        np.testing.assert_array_equal(metrics[k], reference[k], err_msg=k)
    record = checkpoint.load(path)
    assert record["update"] == 32
    for a, b in zip(jax.tree.leaves(record["train_state"]), jax.tree.leaves(theirs),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_background_writer_runs_in_order_finishes_on_exit_and_reraises():
    """The driver's file work: queued calls run in order, leaving the block (also by an
    exception) waits for all of them, and an error in one is raised in the caller."""
    done = []

    def slow(i):
        time.sleep(0.01)
        done.append(i)

    with pytest.raises(SystemExit), logger.BackgroundWriter() as writer:
        for i in range(5):
            writer.put(slow, i)
        raise SystemExit(1)  # as the NaN guard or a signal leaves the loop
    assert done == list(range(5))

    with logger.BackgroundWriter() as writer:
        writer.put(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            writer.flush()
        writer.put(done.append, 5)  # the error was handed over: work goes on
    assert done[-1] == 5


def test_tensorboard_points_are_means_of_blocks_of_updates_across_chunks(tmp_path):
    """With `every=3`, 8 updates written as chunks of 5 and 3 become points at updates 3, 6
    and 8 (a last, shorter block on close), each the NaN-ignoring mean of its updates; an
    evaluation (NaN at the updates without one) is a point at its own update's step."""
    returns = np.array([1, np.nan, 3, 4, 5, 6, 7, 8], np.float64)
    evals = np.full(8, np.nan)
    evals[4] = 10.0
    steps = 100 * np.arange(1, 9)
    board = logger.TensorBoardRun(str(tmp_path), "run", {"lr": 0.1}, purge=True, every=3)
    for part in (slice(0, 5), slice(5, 8)):
        board.write({"global_step": steps[part], "episodic_return": returns[part],
                     "eval_return": evals[part]}, sps_points=[(steps[part][-1], 123.0)])
        if part.start == 0:  # in the file for TensorBoard to read, before `close`
            (events,) = tensorboard_files(tmp_path / "run")
            assert [(e.step, v.simple_value) for e in events for v in e.summary.value
                    if v.tag == "charts/episodic_return"] == [(300, 2.0)]
    board.close()
    (events,) = tensorboard_files(tmp_path / "run")
    assert events[1].session_log.status == events[1].session_log.START  # purge, after version
    points = {}
    for e in events:
        for v in e.summary.value:
            if v.HasField("simple_value"):
                points.setdefault(v.tag, []).append((e.step, round(v.simple_value, 5)))
    assert points["charts/episodic_return"] == [(300, 2.0), (600, 5.0), (800, 7.5)]
    assert points["eval/episodic_return"] == [(500, 10.0)]
    assert points["charts/SPS"] == [(500, 123.0), (800, 123.0)]
    assert any(v.tag == "hyperparameters/text_summary" for e in events for v in e.summary.value)


def test_runs_with_many_updates_log_at_most_1000_points_per_chart():
    assert logger.log_every(976) == 1
    assert logger.log_every(1000) == 1
    assert logger.log_every(1001) == 2
    assert logger.log_every(6250) == 7  # 893 points
    assert logger.log_every(6250, requested=1) == 1  # --log-every 1: every update


def test_a_checkpoint_from_before_a_config_field_existed_resumes_at_its_default(tmp_path):
    """A field the Config gained after a checkpoint was written (PPO's network shape:
    `hidden_layers`, `critic_hidden_size`, `critic_hidden_layers`) is absent from its saved
    config: resumed with that field at its default, the configs match; at another value, the
    difference is named."""
    import dataclasses

    from common.host.options import RunOptions
    from helpers import initial_state, save_initial

    path = save_initial(tmp_path / checkpoint.LATEST, "ppo")
    record = checkpoint.load(path)
    added = ("hidden_layers", "critic_hidden_size", "critic_hidden_layers")
    old = {k: v for k, v in record["config"].items() if k not in added}
    assert set(record["config"]) - set(old) == set(added)
    config, _, state = initial_state("ppo", 1)
    template = jax.eval_shape(lambda: state)
    run = RunOptions(num_seeds=1, exp_name="ppo")
    restored = preflight.resume(path, {**record, "config": old}, "ppo", config, run, template)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    other = dataclasses.replace(config, hidden_layers=3)
    with pytest.raises(checkpoint.CheckpointError, match="hidden_layers: 2 -> 3"):
        preflight.resume(path, {**checkpoint.load(path), "config": old}, "ppo", other, run,
                         template)
