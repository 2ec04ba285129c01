"""A deadlock-free orthogonal initialiser.

Saxe, McClelland, Ganguli (2014), "Exact solutions to the nonlinear dynamics of learning in
deep linear neural networks", arXiv:1312.6120: the initialiser used by PPO, A2C and IMPALA
implementations since OpenAI Baselines.

Why not `flax.linen.initializers.orthogonal` directly: it draws a QR decomposition. Under
`jax.vmap` (many seeds in one call) that becomes a *batched* QR, and jaxlib 0.10.0-0.10.2 on
CPU splits a batched LAPACK call into chunks on XLA's intra-op thread pool and then blocks on a
thread of that same pool. With as many such calls in flight as the pool has threads, nothing is
left to run the chunks and the process stops at 0% CPU, forever -- even plain
`jit(vmap(train))` on one device, and reliably under `pmap`/`shard_map`. Wrapping the
initialiser in `jax.custom_batching.sequential_vmap` makes `vmap` run one unbatched QR per
seed (a loop), which never takes that path. The numbers are identical; only the batching rule
changes. `tests/test_common.py` holds a regression test that hangs (under a timeout) if the
hazard comes back.
"""

import jax
from flax.linen import initializers


def orthogonal(scale: float = 1.0):
    """`flax.linen.initializers.orthogonal(scale)`, batched sequentially under `vmap`."""
    base = initializers.orthogonal(scale)

    def init(key, shape, dtype=jax.numpy.float32):
        @jax.custom_batching.sequential_vmap
        def draw(k):
            return base(k, shape, dtype)

        return draw(key)

    return init
