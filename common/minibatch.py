"""Minibatch SGD pieces: the shuffle that splits a batch into random, disjoint minibatches,
and `flat_optimizer`, an optax optimiser run on one flat vector (the same numbers, fewer
kernels on CPU).

`permutation` draws the shuffle the way `jax.random.permutation` does (sort the indices by
random 32-bit keys, in enough rounds that equal keys leave no measurable bias), with one
change for speed: each index rides in the low bits of its own sort key, so XLA sorts a single
`uint32` array with its built-in comparison instead of (key, index) pairs with a compiled
comparator. On CPU that is about 2x faster for PPO's 512-sample batches (it takes two rounds
where `jax.random.permutation` takes one, and is still faster), where the permutations take
about 8% of a CartPole run with `jax.random.permutation`.
"""

import math

import jax
import jax.numpy as jnp
import optax
from jax import lax


def permutation(key, n: int):
    """A uniformly random permutation of `range(n)`, int32 [n].

    Round r sorts the current order by `(random bits << index_bits) | position`: positions are
    distinct, so the sort is a permutation, and it is uniform except among positions whose
    `32 - index_bits` random bits collide, which keep their previous relative order. As in
    `jax.random.permutation`, there are enough rounds to give each position at least
    `3 * log2(n)` random bits in all, so two positions collide in every round with probability
    at most `n ** -3`.
    """
    if n < 1:
        raise ValueError(f"permutation: n must be positive, got {n}.")
    index_bits = max(1, (n - 1).bit_length())
    random_bits = 32 - index_bits
    if random_bits < 8:  # n > 2**24: too few bits left for the keys
        return jax.random.permutation(key, n)
    rounds = max(1, math.ceil(3 * math.log(n) / (random_bits * math.log(2))))
    position = jnp.arange(n, dtype=jnp.uint32)
    mask = jnp.uint32((1 << index_bits) - 1)
    order = jnp.arange(n, dtype=jnp.int32)
    for round_key in jax.random.split(key, rounds):
        sort_keys = (jax.random.bits(round_key, (n,), jnp.uint32) << index_bits) | position
        order = order[(lax.sort(sort_keys) & mask).astype(jnp.int32)]
    return order


def shuffled_minibatches(key, batch, num_minibatches: int):
    """Split `batch` (a pytree, leading axis [batch_size]) into `num_minibatches` random disjoint
    minibatches: a pytree with leading axes [num_minibatches, batch_size // num_minibatches]."""
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    if batch_size % num_minibatches:
        raise ValueError(f"shuffled_minibatches: batch size {batch_size} does not divide into "
                         f"{num_minibatches} minibatches.")
    order = permutation(key, batch_size)
    return jax.tree.map(
        lambda x: x[order].reshape((num_minibatches, -1) + x.shape[1:]), batch)


def flat_optimizer(inner):
    """`optax.flatten(inner)` with the vectors first: `inner` runs on one flat vector holding
    every leaf of fewer than two dimensions (biases, log-std), then every matrix, in tree order.

    The same numbers as `inner` on the tree for any elementwise transformation (clipping by
    global norm, Adam, RMSprop), in far fewer kernels. Vectors first, so that unravelling an
    update slices each matrix out whole; in the tree's order, under `vmap` XLA:CPU gathers the
    biases from pieces, a kernel each. A transformation that looks at the tree's structure
    (`optax.masked`, per-layer rates) must go outside it.
    """

    def ravel(tree):
        leaves = jax.tree.leaves(tree)
        return jnp.concatenate([jnp.ravel(x) for x in leaves if x.ndim < 2] +
                               [jnp.ravel(x) for x in leaves if x.ndim >= 2])

    def unravel(flat, template):
        leaves, treedef = jax.tree.flatten(template)
        order = [i for i, x in enumerate(leaves) if x.ndim < 2] + \
            [i for i, x in enumerate(leaves) if x.ndim >= 2]
        out, offset = [None] * len(leaves), 0
        for i in order:
            out[i] = jnp.reshape(flat[offset:offset + leaves[i].size], leaves[i].shape)
            offset += leaves[i].size
        return jax.tree.unflatten(treedef, out)

    def init(params):
        return inner.init(ravel(params))

    def update(updates, state, params=None):
        flat, state = inner.update(ravel(updates), state,
                                   None if params is None else ravel(params))
        return unravel(flat, updates), state

    return optax.GradientTransformation(init, update)
