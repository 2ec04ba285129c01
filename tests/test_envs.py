"""`common.envs` and its gymnax adapters: environment ids and their errors, actions clipped
for the environment, the lazy import of gymnax's environments (`common/gymnaxenv.py`), and
the velocity-hidden tasks (`common/maskedenv.py`)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envapi import to_env_action
from common.envs import check_env_id, make_env
from common.rollout import reset, rollout


def test_continuous_actions_are_clipped_for_the_environment_only():
    _, _, spec = make_env("Pendulum-v1")
    action = jnp.array([[5.0], [-0.5]])
    np.testing.assert_allclose(to_env_action(action, spec, (1,)), [[2.0], [-0.5]])


def test_unknown_environment_names_the_closest_ids():
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env("Cartpole-v1")


def test_a_brax_id_without_brax_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)  # what find_spec sees where it is missing
    with pytest.raises(ValueError, match=r'brax/ant needs Brax, which is not installed: '
                                         r'pip install -e "\.\[brax\]"'):
        check_env_id("brax/ant")
    with pytest.raises(ValueError, match="unknown environment id 'brax/walker'"):
        check_env_id("brax/walker")


LAZY_MAKE = """
import sys
import jax
import numpy as np
from common.envs import known_env_ids, make_env
from common.maskedenv import MASKED
made = {}
first = ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"]
others = [i for i in known_env_ids() if i not in first and i != "MNISTBandit-bsuite"  # download
          and i not in MASKED and not i.startswith(("brax/", "playground/"))]  # not gymnax's
for env_id in first + others:
    env, params, _ = make_env(env_id)
    made[env_id] = (type(env), params)
    if env_id == first[-1]:
        heavy = [m for m in ("gymnax", "gymnax.environments", "matplotlib", "seaborn",
                             "scipy.stats") if m in sys.modules]
        assert not heavy, heavy
assert "gymnax" not in sys.modules
import gymnax
unbound = [n for n, m in list(sys.modules.items()) if n.startswith("gymnax.") and  # as Python's
           getattr(sys.modules[n.rpartition(".")[0]], n.rpartition(".")[2], None) is not m]
assert not unbound, unbound  # own import binds each module to its package: spaces, cartpole, ...
for env_id, (cls, params) in made.items():
    env, default = gymnax.make(env_id)
    assert type(env) is cls, (env_id, type(env), cls)
    assert jax.tree.structure(default) == jax.tree.structure(params), env_id
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b, equal_nan=True)), default, params)
    assert all(jax.tree.leaves(same)), (env_id, same)
print("made", len(made))
"""


@pytest.mark.subprocess
def test_make_env_imports_only_the_environment_s_own_module_and_makes_what_gymnax_makes():
    """In a fresh process: CartPole, Pendulum and Breakout import no gymnax package init and no
    plotting library; every other built-in id (but MNIST, a download) is made too; then
    `import gymnax` works, finds each module loaded before as its package's attribute
    (`gymnax.environments.spaces`), and makes the same classes and default parameters."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", LAZY_MAKE], cwd=root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "made 25" in result.stdout, result.stdout


@pytest.mark.parametrize("masked,base,keep", [("MaskedCartPole-v1", "CartPole-v1", [0, 2]),
                                              ("MaskedPendulum-v1", "Pendulum-v1", [0, 1])])
def test_masked_tasks_hide_the_velocities(masked, base, keep):
    """The same environment and keys: the masked observation is the full one without its
    velocity entries, at every step, across automatic resets, and in the final observation
    of a truncated or terminated episode."""
    env, params, spec = make_env(masked)
    full_env, full_params, full_spec = make_env(base)
    assert spec.obs_shape == (2,) and full_spec.obs_shape[0] in (3, 4)
    assert spec.discrete == full_spec.discrete and spec.action_dim == full_spec.action_dim
    policy = lambda key, obs, first, h: (  # noqa: E731
        jax.random.randint(key, (obs.shape[0],), 0, 2) if spec.discrete
        else jax.random.uniform(key, (obs.shape[0], 1), minval=-2, maxval=2), None, h)
    key = jax.random.PRNGKey(0)
    _, traj = rollout(env, params, spec, policy, reset(env, params, key, 4), key, 250)
    _, full = rollout(full_env, full_params, full_spec, policy,
                      reset(full_env, full_params, key, 4), key, 250)
    np.testing.assert_array_equal(traj.obs, full.obs[..., keep])
    np.testing.assert_array_equal(traj.next_obs, full.next_obs[..., keep])
    assert (np.asarray(traj.terminated) | np.asarray(traj.truncated)).any()  # resets happened
    hidden = [i for i in range(full_spec.obs_shape[0]) if i not in keep]
    assert np.std(np.asarray(full.obs)[..., hidden]) > 0.1  # what is hidden does vary
    space = env.observation_space(params)
    assert space.shape == (2,) and np.shape(space.low) == (2,)
