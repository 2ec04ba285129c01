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
import os, sys, traceback
import jax, numpy as np
for algo in sys.argv[1:]:
    here = os.path.abspath(algo)  # {algo}.py and its common/, alone in a directory
    sys.path.insert(0, here)
    try:
        module = __import__(algo)
        config = module.Config(env_id="CartPole-v1", total_timesteps=1024, num_envs=4,
                               num_steps=16)
        state, metrics = jax.jit(module.make_train(config))(jax.random.PRNGKey(0))
        assert np.isfinite(np.asarray(metrics["value_loss"])).all()
        loaded = {m: getattr(sys.modules[m], "__file__", None) for m in sys.modules
                  if m == "common" or m.startswith("common.")}
        # every common module came from the copy (an editable install can resolve submodules
        # by name)
        outside = {m: f for m, f in loaded.items()
                   if not f or os.path.dirname(os.path.abspath(f)) != os.path.join(here, "common")}
        assert not outside, outside
        assert "common.host" not in loaded, sorted(loaded)
        print("trained", algo, metrics["global_step"][-1], flush=True)
    except Exception:
        print("FAILED", algo, traceback.format_exc(), flush=True)
    sys.path.remove(here)  # the next file imports its own copies
    for name in [m for m in sys.modules if m in ("common", algo) or m.startswith("common.")]:
        del sys.modules[name]
"""
"""Trains each algorithm file named in `sys.argv` from Python in turn, each from its own
directory (`{algo}/{algo}.py` and `{algo}/common/`), in one process (one import of JAX), the
`common` modules of one file forgotten before the next imports its own: prints `trained
ALGO STEPS` or `FAILED ALGO` and the traceback."""

ALGOS = ("ppo", "a2c", "impala")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each algorithm file and just the `common/` modules its docstring lists, copied into a
    directory of their own, trained by `SCRIPT` in one isolated Python process (`-I`: no
    PYTHONPATH, no user site, not this checkout's directory): its stdout and stderr."""
    root = tmp_path_factory.mktemp("copies")
    for algo in ALGOS:
        source = os.path.join(ROOT, "algos", f"{algo}.py")
        (root / algo / "common").mkdir(parents=True)
        shutil.copy(source, root / algo / f"{algo}.py")
        for name in ["__init__", *listed_modules(source)]:
            shutil.copy(os.path.join(ROOT, "common", f"{name}.py"), root / algo / "common")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-I", "-c", SCRIPT, *ALGOS], cwd=root,
                            capture_output=True, text=True, timeout=600, env=env)
    return result.stdout, result.stderr


def listed_modules(path: str) -> list[str]:
    """The `common/` modules an algorithm file's docstring says its Python API needs."""
    text = open(path).read()
    listed = re.search(r"needs only `common/` modules (.*?);", text, re.S).group(1)
    return re.findall(r"`(\w+)`", listed)


@pytest.mark.subprocess
@pytest.mark.parametrize("algo", ALGOS)
def test_one_file_and_its_listed_modules_train_in_an_empty_directory(algo, trained):
    out, err = trained
    assert f"trained {algo} 1024\n" in out, out[-3000:] + err[-3000:]
