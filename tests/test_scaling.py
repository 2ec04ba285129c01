"""Scaling out over several devices in one process (several processes: `tests/test_processes.py`).

Everything here needs devices set before JAX starts, so it runs in subprocesses with forced CPU
devices (`--xla_force_host_platform_device_count`). Every subprocess runs under a hard
`timeout -k` (a `jax.distributed` process catches SIGTERM): a hang -- the jaxlib 0.10
batched-LAPACK deadlock under `shard_map(vmap)` among them -- fails the test instead of
stalling the suite.
"""

import glob
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from common.host import checkpoint

pytestmark = pytest.mark.subprocess  # every test here starts Python processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "scaling_probe.py")
TINY = ["--env-id", "CartPole-v1", "--total-timesteps", "4096", "--num-envs", "8",
        "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2"]
SHORT = TINY[:2] + ["--total-timesteps", "1024"] + TINY[4:]  # 8 updates


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hard_timeout(seconds: int) -> list:
    return ["timeout", "-k", "5", str(seconds)]


def env(devices=None):
    """The environment of a subprocess: `devices` forced CPU devices (None: the CLI's choice,
    one per core), this checkout first on the path (and, from conftest, the session's
    compilation cache)."""
    e = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    flags = [f for f in e.get("XLA_FLAGS", "").split()  # conftest's flags stay
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    e["XLA_FLAGS"] = " ".join(flags)
    return e


def run(command, seconds, **kwargs):
    result = subprocess.run(hard_timeout(seconds) + command, cwd=ROOT, capture_output=True,
                            text=True, **kwargs)
    assert result.returncode not in (124, 137), \
        f"{command} hung (killed after {seconds}s):\n{result.stderr[-3000:]}"
    return result


def cli(args, seconds=180, processes=1, devices=None, log_dir=None, program=("algos/ppo.py",)):
    """Run `algos/ppo.py` (or Python's arguments `program` that run it) in `processes`
    coordinated processes; the CompletedProcess of each."""
    base = [sys.executable, *program, *args, "--log-dir", str(log_dir)]
    if processes == 1:
        return [run(base, seconds, env=env(devices))]
    address = f"127.0.0.1:{free_port()}"
    runs = [subprocess.Popen(hard_timeout(seconds) + base + [
        "--coordinator-address", address, "--num-processes", str(processes),
        "--process-id", str(i), "--distributed-timeout", "30"], cwd=ROOT,
        env=env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(processes)]
    results = []
    for r in runs:
        out, err = r.communicate()
        assert r.returncode not in (124, 137), f"process hung:\n{err[-3000:]}"
        results.append(subprocess.CompletedProcess(r.args, r.returncode, out, err))
    return results


def final_state(log_dir):
    (path,) = glob.glob(os.path.join(str(log_dir), "*", checkpoint.LATEST))
    return checkpoint.load(path)


# ------------------------------------------------------------------ one agent, data-parallel
PARTS = ("learn", "update", "gru", "api", "chunks")


@pytest.fixture(scope="module")
def probe():
    """`scaling_probe.py` with all its parts in one process of 4 CPU devices (one start-up
    and one import of JAX for the five tests below); its stdout and stderr."""
    result = run([sys.executable, PROBE, *PARTS], 600)
    return result.stdout, result.stderr


def probe_part(probe, part: str):
    out, err = probe
    assert f"ok {part}\n" in out, f"scaling_probe.py {part}:\n{out[-4000:]}\n{err[-3000:]}"


def test_ppo_a2c_impala_learn_gives_the_same_parameters_on_1_2_4_devices(probe):
    """One `learn` step of each algorithm from the same state on the same global batch: the
    same parameters on 1, 2 and 4 devices as without a device axis (`scaling_probe.py`)."""
    probe_part(probe, "learn")


def test_data_parallel_ppo_a2c_impala_keep_parameters_identical_on_every_device(probe):
    probe_part(probe, "update")


def test_recurrent_learn_is_the_same_on_4_devices_and_data_parallel_runs_agree(probe):
    """`--network gru`: each algorithm's `learn` (sequences recomputed from their stored start
    states, split with their environments) gives the same parameters on 4 devices as
    without a device axis, and data-parallel training keeps them identical on every device."""
    probe_part(probe, "gru")


def test_python_api_spread_seeds_and_data_parallel(probe):
    probe_part(probe, "api")


def test_seeds_on_several_devices_run_one_program_per_device_with_the_same_results(probe):
    """The command line's chunks for seeds on several devices: one program per device,
    called apart (no barrier between the devices at each chunk), what one program over the
    mesh gives, to float rounding (`scaling_probe.py`)."""
    probe_part(probe, "chunks")


# ------------------------------------------------------------------ the command line
def test_cli_seeds_on_2_devices_equal_1_device_and_do_not_hang(tmp_path):
    """4 seeds, 2 per device: the shard_map(vmap(init)) pattern that deadlocked jaxlib 0.10
    with batched QRs; the runs must equal the same seeds on one device."""
    one, two = tmp_path / "one", tmp_path / "two"
    args = SHORT + ["--num-seeds", "4"]
    (a,) = cli(args + ["--num-devices", "1"], devices=2, log_dir=one)
    (b,) = cli(args, devices=2, log_dir=two)  # default: every device
    for r in (a, b):
        assert r.returncode == 0, r.stderr[-3000:]
    assert "on 1 device(s), parallel seeds" in a.stdout
    assert "on 2 device(s), parallel seeds" in b.stdout
    ra, rb = final_state(one), final_state(two)
    for name in ("episodic_return", "value_loss", "approx_kl"):
        np.testing.assert_allclose(rb["metrics"][name], ra["metrics"][name], rtol=1e-4,
                                   atol=1e-5, err_msg=name)
    import jax
    for x, y in zip(jax.tree.leaves(ra["train_state"]), jax.tree.leaves(rb["train_state"])):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


def test_cli_refuses_seeds_that_do_not_divide(tmp_path):
    (r,) = cli(TINY + ["--num-seeds", "3", "--num-devices", "2"], devices=2, log_dir=tmp_path,
               seconds=120)
    assert r.returncode == 2
    assert "error: --num-seeds 3 does not divide among 2 devices" in r.stderr, r.stderr


def test_cli_data_parallel_on_2_devices_keeps_the_global_layout(tmp_path):
    args = TINY + ["--parallel", "data", "--num-seeds", "2", "--checkpoint-every", "16"]
    (r,) = cli(args, devices=2, log_dir=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on 2 device(s), parallel data" in r.stdout
    record = final_state(tmp_path)
    assert record["update"] == 32
    assert record["train_state"]["env"]["obs"].shape == (2, 8, 4)  # global layout, 2 seeds
