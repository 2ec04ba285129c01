"""Run as a script: initialise PPO's network for 4 seeds per device under `pmap(vmap(...))`
on 2 forced CPU devices -- the pattern that deadlocked jaxlib 0.10.x when the orthogonal
initialiser ran batched QRs. Prints "ok" and exits 0 when it finishes. `--flax-orthogonal`
swaps in flax's own initialiser, to show the probe does detect the hazard.

The XLA flags it is started with are kept: run by hand, XLA's defaults; from the test suite,
its faster compile options (`conftest.FAST_COMPILE`: 3.6 CPU s instead of 8). The deadlock is
the runtime's, not the compiler's: with jaxlib 0.10.2, `--flax-orthogonal` hangs under both."""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +  # keeps the caller's flags
                           " --xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common.nn  # noqa: E402, F401

if "--flax-orthogonal" in sys.argv:
    import algos.ppo
    algos.ppo.orthogonal = jax.nn.initializers.orthogonal
from algos.ppo import ActorCritic  # noqa: E402
from common.envs import make_env  # noqa: E402

assert jax.device_count() == 2, jax.devices()
spec = make_env("CartPole-v1")[2]
net = ActorCritic(spec, hidden_size=64)
init = lambda key: net.init(key, jnp.zeros((1, 4)))  # noqa: E731
keys = jax.random.split(jax.random.PRNGKey(0), 8).reshape(2, 4, -1)
for _ in range(3):
    params = jax.pmap(jax.vmap(init))(keys)
    jax.block_until_ready(params)
print("ok")
