"""Threefry without a loop on CPU: the same random bits, fewer kernels per draw.

Every `jax.random` call (key splits, uniforms, the categorical sample of an action, gymnax's
resets) evaluates the Threefry-2x32 hash (Salmon, Moraes, Dror, Shaw 2011, "Parallel random
numbers: as easy as 1, 2, 3"). JAX lowers its 20 rounds as straight-line code on GPU and TPU,
but on CPU as a `fori_loop` of 5 iterations, which keeps programs small to compile. XLA:CPU
runs each iteration as its own kernels plus copies of the loop state; on the few numbers an RL
step draws, that loop costs more than the hash. In PPO's CartPole rollout (4 environments) a
step took 6.3 us with the loop and 4.7 us without (`benchmarks/vs_purejaxrl.py` measures the
whole run).

`unroll_threefry_on_cpu()` registers JAX's own straight-line lowering for CPU as well. The hash
is integer arithmetic, so every random number is bit for bit what it was; programs compiled
after the call, in this process, use it (whichever library built them).
"""

import jax
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

from common.threefry import MEASURED_ON

try:  # JAX's lowerings: straight-line (GPU/TPU) and looped (its CPU default).
    from jax._src.random.threefry2x32 import (
        _threefry2x32_cpu_lowering_rule as _LOOPED,
        _threefry2x32_lowering_rule as _UNROLLED,
    )
except ImportError:  # another JAX layout: keep its default lowering
    _LOOPED = _UNROLLED = None

def unroll_threefry_on_cpu(enabled: bool = True) -> bool:
    """Lower Threefry on CPU without its loop (`enabled=False`: JAX's default again).

    Affects what is compiled afterwards, not what is already compiled. Returns whether the
    choice could be made (False on a JAX release that lays out these lowerings differently,
    or, for `enabled`, one it was not measured on: `MEASURED_ON`; there its default stays).
    """
    if _UNROLLED is None or (enabled and not jax.__version__.startswith(MEASURED_ON)):
        return False
    mlir.register_lowering(threefry2x32_p, _UNROLLED if enabled else _LOOPED, platform="cpu")
    return True
