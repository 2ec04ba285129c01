"""`lax.scan` with its pytrees packed into one array per dtype: the same values, fewer kernels.

XLA:CPU runs a compiled loop body as a graph of kernels on the calling thread, and whenever
more than 8 kernels are ready at the same moment it hands half of them to its thread pool
(`ThunkExecutor`'s split threshold, fixed in XLA). For a body as small as an RL step (a few
microseconds) the hand-off costs more than the work it shares: a pool thread must wake up and
the data move to its core. A scan over a pytree of many small leaves makes such a moment every
iteration: each leaf of the carry is copied in, and each leaf of the per-step output written
back, by a kernel of its own, all ready together. Packed, each of those is one kernel.

In PPO's CartPole rollout a step went from 53 kernels (10 ready at its start) to 35 (never
more than 8), and a one-seed run from about 110k to 125k steps per second on a 2-core CPU.

`packed_scan(f, init, xs)` is `lax.scan(f, init, xs)`: packing only moves data. (XLA may fuse
the arithmetic around it differently, so floating-point results can differ in the last bit.)
"""

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax


def packing(template):
    """`(pack, unpack)` for pytrees with the structure, shapes and dtypes of `template`.

    `pack(tree)` flattens every leaf's trailing dimensions (those of its template leaf) and
    concatenates the leaves of each dtype along the last axis: a tuple of arrays shaped
    `[*lead, n_dtype]`, one per dtype, where `lead` is any leading shape the leaves share
    beyond their template's (a scan's time axis, say). `unpack` inverts it exactly.
    """
    leaves, treedef = jax.tree.flatten(template)
    shapes = [tuple(jnp.shape(x)) for x in leaves]
    kinds = [jnp.result_type(x) for x in leaves]
    dtypes = sorted(set(kinds), key=str)
    slot = [dtypes.index(k) for k in kinds]  # which packed array each leaf goes to
    offsets, ends = [], [0] * len(dtypes)
    for s, shape in zip(slot, shapes):
        offsets.append(ends[s])
        ends[s] += math.prod(shape)

    def pack(tree):
        if not leaves:
            return ()
        parts = [[] for _ in dtypes]
        for s, shape, x in zip(slot, shapes, jax.tree.leaves(tree)):
            lead = x.shape[:x.ndim - len(shape)]
            parts[s].append(jnp.reshape(x, lead + (math.prod(shape),)))
        return tuple(jnp.concatenate(p, axis=-1) if len(p) > 1 else p[0] for p in parts)

    def unpack(packed):
        if not leaves:
            return jax.tree.unflatten(treedef, [])
        lead = packed[0].shape[:-1]
        out = []
        for s, shape, start in zip(slot, shapes, offsets):
            x = lax.slice_in_dim(packed[s], start, start + math.prod(shape), axis=len(lead))
            out.append(jnp.reshape(x, lead + shape))
        return jax.tree.unflatten(treedef, out)

    return pack, unpack


def packed_scan(f: Callable, init, xs, length: int | None = None):
    """`lax.scan(f, init, xs, length)` with the carry, the per-step inputs and the per-step
    outputs each packed into one array per dtype while the loop runs, where the program is
    traced for a CPU (`jax.default_backend()`). Elsewhere it is `lax.scan` itself: a TPU lays
    each array out in tiles, and unpacking a packed carry re-lays out every leaf at every step
    (a quarter of PPO's Brax Ant rollout on a TPU v5e; docs/performance.md)."""
    if jax.default_backend() != "cpu":
        return lax.scan(f, init, xs, length)
    x0 = jax.tree.map(lambda x: x[0], xs)
    pack_c, unpack_c = packing(init)  # the carry keeps its shapes and dtypes from step to step
    # f's outputs' shapes, from the carry as the loop hands it over (packed and unpacked: weak
    # types made strong), so that the loop's trace of f repeats this one and a jitted function
    # inside f is traced once (`common.envapi.per_env`)
    _, y_shape = jax.eval_shape(lambda c, x: f(unpack_c(pack_c(c)), x), init, x0)
    pack_x, unpack_x = packing(x0)
    pack_y, unpack_y = packing(y_shape)

    def body(carry, x):
        carry, y = f(unpack_c(carry), unpack_x(x))
        return pack_c(carry), pack_y(y)

    carry, ys = lax.scan(body, pack_c(init), pack_x(xs), length)
    return unpack_c(carry), unpack_y(ys)
