"""JAX's Threefry random numbers, bit for bit, hashed in straight-line code: fast on XLA:CPU.

JAX draws every random number with the Threefry-2x32 hash (Salmon et al., "Parallel Random
Numbers: As Easy as 1, 2, 3", SC 2011). On CPU it lowers the hash's 20 rounds as a loop of 5
iterations, each run as separate kernels: a large part of a rollout step, which hashes
several times (docs/performance.md). The command line switches the lowering for the whole
process (`common.host.prng`); `make_train` changes no process-wide setting.

`THREEFRY` is instead a PRNG implementation of its own (`jax.extend.random.define_prng_impl`)
that computes exactly JAX's default (`threefry2x32` with `jax_threefry_partitionable`, on in
the pinned 0.10.2) in plain `jnp` code, so the hash is straight-line wherever it runs. Keys
wrapped with it (`straight_keys`) give the same bits as the keys they wrap, through every
`jax.random` function: same numbers, faster on a CPU. For a key with data `(k1, k2)`:

    hash(k1, k2, x1, x2): Threefry-2x32, 20 rounds, key schedule (k1, k2, k1 ^ k2 ^ 0x1BD11BDA)
    split(key, shape)[i]       = hash(k1, k2, 0, i)                     (i: the flat index)
    random_bits(key, 32, shape)[i] = b1 ^ b2 where (b1, b2) = hash(k1, k2, 0, i)
    random_bits(key, 8 or 16, ...) = the low bits of the same
    fold_in(key, d)            = hash(k1, k2, 0, d)

(The high word of the 64-bit counter is 0 for any array this small: fewer than 2^32 values.)
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import define_prng_impl

MEASURED_ON = ("0.10.",)
"""The JAX releases on which a straight-line hash was measured to pay on CPU (the pinned
0.10.2), here and in `common.host.prng`. With jax 0.11.2 on CPU it made `jit(vmap(train))` of
PPO on CartPole (2 seeds) compile for over five minutes, where the looped default took 6.8 s
(one seed: 7.7 s against 4.1 s), so on other releases JAX's default stays."""

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = 0x1BD11BDA


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash of the counter pairs `(x1, x2)` under the key `(k1, k2)`
    (uint32 arrays, broadcast together): 5 groups of 4 rounds `x1 += x2; x2 = rotl(x2, r);
    x2 ^= x1`, the key schedule added before and after each group."""
    schedule = (k1, k2, k1 ^ k2 ^ np.uint32(PARITY))
    x1, x2 = x1 + schedule[0], x2 + schedule[1]
    for group in range(5):
        for r in ROTATIONS[group % 2]:
            x1 = x1 + x2
            x2 = (x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))
            x2 = x2 ^ x1
        x1 = x1 + schedule[(group + 1) % 3]
        x2 = x2 + schedule[(group + 2) % 3] + np.uint32(group + 1)
    return x1, x2


def _counters(shape):
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 2**32:
        raise ValueError(f"common.threefry: {size} random values in one call; at most 2^32 - 1.")
    return jnp.arange(size, dtype=jnp.uint32).reshape(shape)


def _hash_counters(key, shape):
    return threefry2x32(key[0], key[1], jnp.zeros(shape, jnp.uint32), _counters(shape))


def _seed(seed):
    return jnp.stack([jnp.uint32(0), jnp.asarray(seed).astype(jnp.uint32)])


def _split(key, shape):
    return jnp.stack(_hash_counters(key, tuple(shape)), axis=-1)


def _random_bits(key, bit_width, shape):
    if bit_width not in (8, 16, 32):
        raise ValueError(f"common.threefry: {bit_width}-bit random numbers are not implemented "
                         f"(8, 16 and 32 are).")
    bits1, bits2 = _hash_counters(key, tuple(shape))
    return (bits1 ^ bits2).astype(f"uint{bit_width}")


def _fold_in(key, data):
    bits1, bits2 = threefry2x32(key[0], key[1], jnp.uint32(0), jnp.asarray(data, jnp.uint32))
    return jnp.stack([bits1, bits2])


THREEFRY = define_prng_impl(key_shape=(2,), seed=_seed, split=_split, random_bits=_random_bits,
                            fold_in=_fold_in, name="threefry2x32_straight", tag="fs")
"""JAX's default Threefry, hashed in straight-line `jnp` code (the module docstring)."""


def straight_keys(keys):
    """`keys` as `THREEFRY` keys where the program is traced for a CPU with a JAX release on
    which the straight-line hash was measured to pay (`MEASURED_ON`) and JAX's partitionable
    Threefry on (the bits `THREEFRY` gives), else unchanged.

    `keys`: raw Threefry keys (uint32, [..., 2], as `jax.random.PRNGKey` makes them) or typed
    `threefry2x32` keys. Either way every `jax.random` call gives the bits the original keys
    give. Other key kinds (a typed key of another implementation) are returned unchanged."""
    if (jax.default_backend() != "cpu" or not jax.__version__.startswith(MEASURED_ON)
            or not jax.config.jax_threefry_partitionable):
        return keys  # JAX's own hash is straight-line there, or not measured, or other bits
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(keys)) != "threefry2x32":
            return keys
        keys = jax.random.key_data(keys)
    return jax.random.wrap_key_data(keys, impl=THREEFRY)


def raw_keys(tree):
    """`tree` with every typed key leaf replaced by its raw data (uint32 [..., 2])."""
    return jax.tree.map(lambda x: jax.random.key_data(x)
                        if jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key) else x, tree)
