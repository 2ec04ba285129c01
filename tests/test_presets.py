"""Tuned presets (`common/presets.py`): valid for their algorithm, applied by the command line
for the named environment (printed, any flag given wins, `--no-presets` off, never on
resume), and the very settings the benchmarks run."""

import dataclasses
import importlib
import os
import re
import sys

import pytest

from common import presets
from common.host import flags
from helpers import save_initial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("key", sorted(presets.PRESETS), ids=lambda k: f"{k[0]}:{k[1]}")
def test_every_preset_is_a_valid_config_of_its_algorithm(key):
    algo, env_id = key
    if env_id.startswith("brax/"):
        pytest.importorskip("brax")  # a brax/... id needs Brax installed
    config_cls = importlib.import_module(f"algos.{algo}").Config
    fields = {f.name for f in dataclasses.fields(config_cls)}
    assert set(presets.PRESETS[key]) <= fields, set(presets.PRESETS[key]) - fields
    config_cls(env_id=env_id, **presets.PRESETS[key])  # its own validation passes


def test_every_environment_of_the_results_table_has_a_preset_for_each_algorithm():
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = readme[readme.index("| environment | steps | PPO | A2C | IMPALA"):]
    envs = re.findall(r"^\| ([A-Za-z]+-[A-Za-z0-9]+|brax/[a-z_]+) \|", table, flags=re.M)
    assert len(envs) == 10, envs
    missing = [(a, e) for e in envs for a in ("ppo", "a2c", "impala")
               if (a, e) not in presets.PRESETS]
    assert not missing, missing


def parse(algo, argv):
    return flags.parse(algo, importlib.import_module(f"algos.{algo}").Config, argv)


def test_the_command_line_applies_the_preset_and_says_which(capsys):
    config, run, _ = parse("ppo", ["--env-id", "Pendulum-v1"])
    assert (config.num_envs, config.num_steps, config.update_epochs) == (8, 256, 10)
    assert config.normalize_obs and config.ent_coef == 0.0 and run.presets
    out = capsys.readouterr().out
    assert out.startswith("preset for ppo on Pendulum-v1 (common/presets.py): "
                          "total_timesteps=2000000, num_envs=8, num_steps=256,"), out
    config = parse("impala", ["--env-id=Breakout-MinAtar"]).config
    assert (config.optimizer, config.num_envs, config.total_timesteps) == ("adam", 64,
                                                                           10_000_000)


def test_a_flag_given_wins_over_the_preset_and_no_presets_turns_them_off(capsys):
    config = parse("a2c", ["--env-id", "Pendulum-v1", "--num-envs", "4", "--gamma", "0.95"]).config
    assert (config.num_envs, config.gamma, config.num_steps, config.gae_lambda) == \
        (4, 0.95, 8, 0.9)
    out = capsys.readouterr().out
    assert "num_envs" not in out and "gamma" not in out and "num_steps=8" in out, out
    config, run, _ = parse("a2c", ["--env-id", "Pendulum-v1", "--no-presets"])
    defaults = importlib.import_module("algos.a2c").Config(env_id="Pendulum-v1")
    assert config == defaults and not run.presets
    assert capsys.readouterr().out == ""
    parse("ppo", [])  # CartPole's preset is the file's default: nothing to say
    assert capsys.readouterr().out == ""


def test_a_resumed_run_keeps_its_saved_config_not_the_preset(tmp_path, capsys):
    path = save_initial(tmp_path / "pendulum.msgpack", "ppo", env_id="Pendulum-v1")
    config = parse("ppo", ["--resume", path]).config
    assert config.env_id == "Pendulum-v1" and config.num_envs == 4  # the saved run's
    assert "preset" not in capsys.readouterr().out


def test_the_benchmarks_run_the_same_presets():
    sys.path.insert(0, ROOT)
    from benchmarks import configs

    assert configs.CONFIGS is presets.PRESETS
    assert configs.settings("ppo", "Pendulum-v1") == presets.preset("ppo", "Pendulum-v1")
