"""The PPO command line: a smoke run, and bad input refused without a traceback.

The in-process catalogue of bad input for every entry point is `tests/test_bad_input.py`.
"""

import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ppo_bad_input_from_a_real_process_has_no_traceback():
    result = subprocess.run([sys.executable, "algos/ppo.py", "--env-id", "Pong"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "unknown environment id 'Pong'" in result.stderr and "Pong-misc" in result.stderr


def test_ppo_cli_trains_logs_and_summarises(tmp_path):
    result = subprocess.run(
        [sys.executable, "algos/ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "8192",
         "--num-seeds", "2", "--log-dir", str(tmp_path), "--exp-name", "smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "ONPOLICY_JAX_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[ppo CartPole-v1] step" in result.stdout and "SPS" in result.stdout
    assert "done: PPO on CartPole-v1, 2 run(s)" in result.stdout
    # Both compiled programs (init and the chunk of updates) land in the persistent cache, so a
    # second identical command skips compiling them.
    cached = os.listdir(tmp_path / "cache")
    for program in ("jit_init-", "jit_run_updates-"):
        assert any(name.startswith(program) for name in cached), (program, cached)
    runs = sorted(d for d in os.listdir(tmp_path) if d.startswith("CartPole-v1__smoke__"))
    assert [r.split("__")[2] for r in runs] == ["1", "2"], runs
    for run in runs:
        assert glob.glob(str(tmp_path / run / "events.out.tfevents.*"))
