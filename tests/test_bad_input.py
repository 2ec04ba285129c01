"""The bad-input catalogue: every mistake on the command line that can be detected before
training gets one line on stderr, `error: ...`, and a non-zero exit (2), for every algorithm and
for the `evaluate` entry point. Mistakes during training (a diverging loss, an interrupted run)
are tested in `tests/test_checkpoint.py`.

Not in the catalogue: a continuous-only option on a discrete environment, because no option
is continuous-only (every flag applies to both kinds of action space). Malformed flags (an
unknown name, a value of the wrong type) are caught by tyro, which explains them in its own
boxed message, also with exit status 2 (last test).
"""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from flax import serialization

from helpers import save_initial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths for the `{name}` placeholders of the catalogue."""
    d = tmp_path_factory.mktemp("bad_input")
    good = save_initial(d / "ppo.msgpack", "ppo")
    data = open(good, "rb").read()
    (d / "truncated.msgpack").write_bytes(data[: len(data) // 2])
    (d / "corrupt.msgpack").write_bytes(np.random.default_rng(0).bytes(4096))
    (d / "empty.msgpack").write_bytes(b"")
    (d / "foreign.msgpack").write_bytes(serialization.msgpack_serialize({"weights": [1, 2]}))
    (d / "run_without_checkpoint").mkdir()
    return {"ckpt": good, "truncated": str(d / "truncated.msgpack"),
            "corrupt": str(d / "corrupt.msgpack"), "empty": str(d / "empty.msgpack"),
            "foreign": str(d / "foreign.msgpack"), "missing": str(d / "nowhere.msgpack"),
            "dir": str(d / "run_without_checkpoint"),
            "umbrella": save_initial(d / "umbrella.msgpack", "ppo",
                                     env_id="UmbrellaChain-bsuite")}


CATALOGUE = [
    # (entry point, arguments, expected part of the message)
    # --- environment ---
    ("ppo", ["--env-id", "CartPole-v9"], "unknown environment id 'CartPole-v9'"),
    ("a2c", ["--env-id", "Breakout"], "unknown environment id 'Breakout'"),
    ("impala", ["--env-id", "cartpole"], "unknown environment id 'cartpole'"),
    ("a2c", ["--env-id", "CartPole-v9"], "unknown environment id 'CartPole-v9'"),
    # --- network ---
    ("ppo", ["--network", "cnn"], "--network cnn needs image observations"),
    ("a2c", ["--network", "cnn", "--env-id", "Pendulum-v1"], "--network cnn needs image"),
    ("impala", ["--network", "cnn", "--env-id", "Acrobot-v1"], "--network cnn needs image"),
    # --- sizes ---
    ("ppo", ["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
    ("impala", ["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    ("ppo", ["--num-envs", "0"], "--num-envs must be a positive integer"),
    ("a2c", ["--num-steps", "0"], "--num-steps must be a positive integer"),
    ("a2c", ["--num-envs", "0"], "--num-envs must be a positive integer"),
    ("ppo", ["--total-timesteps", "-5"], "--total-timesteps must be a positive integer"),
    ("a2c", ["--total-timesteps", "50"], "less than one rollout"),
    ("ppo", ["--total-timesteps", "100"], "less than one rollout"),
    ("impala", ["--total-timesteps", "100"], "less than one batch"),
    ("ppo", ["--eval-episodes", "0"], "--eval-episodes must be a positive integer"),
    ("a2c", ["--eval-episodes", "-3"], "--eval-episodes must be a positive integer"),
    ("impala", ["--eval-episodes", "0"], "--eval-episodes must be a positive integer"),
    ("ppo", ["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0"),
    ("a2c", ["--eval-every", "-2"], "--eval-every must be >= 0"),
    # --- rates and lags ---
    ("ppo", ["--learning-rate", "0"], "--learning-rate must be > 0"),
    ("ppo", ["--learning-rate", "-1e-3"], "--learning-rate must be > 0"),
    ("ppo", ["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    ("a2c", ["--rms-decay", "1.0"], "--rms-decay must be in [0, 1)"),
    ("impala", ["--actor-lag", "-1"], "--actor-lag must be >= 0"),
    # --- checkpoints ---
    ("ppo", ["--resume", "{missing}"], "no checkpoint file at '{missing}'"),
    ("ppo", ["--resume", "{dir}"], "no checkpoint file at '{dir}/latest.msgpack'"),
    ("ppo", ["--resume", "{truncated}"], "'{truncated}' is not a readable checkpoint (corrupt"),
    ("a2c", ["--resume", "{corrupt}"], "'{corrupt}' is not a readable checkpoint (corrupt"),
    ("impala", ["--resume", "{empty}"], "'{empty}' is empty, not a checkpoint"),
    ("ppo", ["--resume", "{foreign}"], "'{foreign}' is not a checkpoint of this project"),
    ("ppo", ["--resume", "{ckpt}", "--learning-rate", "0.1", "--num-envs", "8"],
     "cannot resume '{ckpt}' with a different config (saved -> now): num_envs: 4 -> 8; "
     "learning_rate: 0.00025 -> 0.1."),
    ("a2c", ["--resume", "{ckpt}"], "'{ckpt}' holds a ppo run; resume it with algos/ppo.py"),
    # --- the evaluate entry point ---
    ("evaluate", ["{missing}"], "no checkpoint file at '{missing}'"),
    ("evaluate", ["{truncated}"], "'{truncated}' is not a readable checkpoint"),
    ("evaluate", ["{ckpt}", "--episodes", "0"], "--episodes must be a positive integer"),
    ("evaluate", ["{umbrella}", "--capture-video", "x.gif"],
     "gymnax has no renderer for 'UmbrellaChain-bsuite'"),
]


def entry_point(name):
    module = f"algos.{name}"
    return importlib.import_module(module).main


@pytest.mark.parametrize("name,argv,message", CATALOGUE,
                         ids=[f"{n}:{' '.join(a)}" for n, a, _ in CATALOGUE])
def test_bad_input_is_one_clear_line_and_exit_2(name, argv, message, files, capsys):
    argv = [a.format(**files) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        entry_point(name)(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.format(**files) in err, err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", [["algos/a2c.py", "--resume", "{corrupt}"],
                                     ["-m", "algos.evaluate", "{missing}"]])
def test_bad_checkpoint_from_a_real_process_has_no_traceback(command, files):
    result = subprocess.run([sys.executable, *[a.format(**files) for a in command]], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("argv,message", [(["--num-envs", "abc"], "Error parsing --num-envs"),
                                          (["--num-env", "3"], "Unrecognized options")])
def test_malformed_flags_are_explained_by_tyro_with_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        entry_point("ppo")(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
