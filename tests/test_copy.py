"""A copyable file: each algorithm file, with just the `common/` modules its docstring lists,
trains from Python in an empty directory (no host side, no other module of this repository)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys, jax, numpy as np
sys.path.insert(0, ".")
from {algo} import Config, make_train
config = Config(env_id="CartPole-v1", total_timesteps=1024, num_envs=4, num_steps=16)
state, metrics = jax.jit(make_train(config))(jax.random.PRNGKey(0))
assert np.isfinite(np.asarray(metrics["value_loss"])).all()
import os
here = os.path.abspath("common")
loaded = {{m: getattr(sys.modules[m], "__file__", None) for m in sys.modules
          if m == "common" or m.startswith("common.")}}
# every common module came from the copy (an editable install can resolve submodules by name)
outside = {{m: f for m, f in loaded.items()
           if not f or os.path.dirname(os.path.abspath(f)) != here}}
assert not outside, outside
assert "common.host" not in loaded, sorted(loaded)
print("trained", metrics["global_step"][-1])
"""


def listed_modules(path: str) -> list[str]:
    """The `common/` modules an algorithm file's docstring says its Python API needs."""
    text = open(path).read()
    listed = re.search(r"needs only `common/` modules (.*?);", text, re.S).group(1)
    return re.findall(r"`(\w+)`", listed)


@pytest.mark.subprocess
@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_one_file_and_its_listed_modules_train_in_an_empty_directory(algo, tmp_path):
    source = os.path.join(ROOT, "algos", f"{algo}.py")
    modules = listed_modules(source)
    shutil.copy(source, tmp_path / f"{algo}.py")
    (tmp_path / "common").mkdir()
    for name in ["__init__", *modules]:
        shutil.copy(os.path.join(ROOT, "common", f"{name}.py"), tmp_path / "common")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-I", "-c", SCRIPT.format(algo=algo)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 1024" in result.stdout
