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


def final_state(log_dir):
    (path,) = glob.glob(os.path.join(str(log_dir), "*", checkpoint.LATEST))
    return checkpoint.load(path)


# ------------------------------------------------------------------ one agent, data-parallel
PARTS = ("learn", "gru", "update", "api", "chunks", "cli-seeds", "cli-refuse", "cli-data",
         "cli-pbt")


@pytest.fixture(scope="module")
def probe():
    """`scaling_probe.py` with all its parts in one process of 4 CPU devices (one start-up
    and one import of JAX for the tests below, the command line's among them); its stdout
    and stderr."""
    result = run([sys.executable, PROBE, *PARTS], 600)
    return result.stdout, result.stderr


def probe_part(probe, part: str):
    out, err = probe
    assert f"ok {part}\n" in out, f"scaling_probe.py {part}:\n{out[-4000:]}\n{err[-3000:]}"


def test_ppo_a2c_impala_learn_gives_the_same_parameters_on_1_and_4_devices(probe):
    """One `learn` step of each algorithm from the same state on the same global batch: the
    same parameters on 1 and 4 devices as without a device axis (`scaling_probe.py`; why not
    2 as well: its `LEARN_DEVICES`)."""
    probe_part(probe, "learn")


def test_recurrent_learn_is_the_same_on_4_devices(probe):
    """`--network gru`: each algorithm's `learn` (sequences recomputed from their stored start
    states, split with their environments) gives the same parameters on 4 devices as
    without a device axis."""
    probe_part(probe, "gru")


def test_data_parallel_ppo_a2c_impala_keep_parameters_identical_on_every_device(probe):
    """Data-parallel training (`parallel.data_parallel`, `--network gru`) on 2 devices: each
    device's copy of the parameters is the same, the environments differ, the outputs have
    the global layout."""
    probe_part(probe, "update")


def test_python_api_spread_seeds_equals_vmap(probe):
    probe_part(probe, "api")


def test_seeds_on_several_devices_run_one_program_per_device_with_the_same_results(probe):
    """The command line's chunks for seeds on several devices: one program per device,
    called apart (no barrier between the devices at each chunk), what one program over the
    mesh gives, to float rounding (`scaling_probe.py`)."""
    probe_part(probe, "chunks")


# ------------------------------------------------------------------ the command line
def test_cli_seeds_on_2_devices_equal_1_device_and_do_not_hang(probe):
    """4 seeds, 2 per device: the shard_map(vmap(init)) pattern that deadlocked jaxlib 0.10
    with batched QRs; the runs must equal the same seeds on one device (PPO's command line
    in the probe's process: `algos.ppo.main`)."""
    probe_part(probe, "cli-seeds")


def test_cli_refuses_seeds_that_do_not_divide(probe):
    probe_part(probe, "cli-refuse")


def test_cli_data_parallel_on_2_devices_keeps_the_global_layout(probe):
    probe_part(probe, "cli-data")


def test_cli_pbt_on_2_devices_equals_1_device(probe):
    """A PBT population of 4, 2 members per device (one program over the mesh, the PBT
    step's gathers reaching the other device's members): the population, its
    hyperparameters, its lineage and its metrics are those of the same run on one device,
    bit for bit, and members were copied."""
    probe_part(probe, "cli-pbt")
