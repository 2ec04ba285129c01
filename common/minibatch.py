"""Minibatch SGD pieces: the shuffle that splits a batch into random, disjoint minibatches,
and `flat_optimizer`, an optax optimiser run on one flat vector (the same numbers, fewer
kernels on CPU).

`packed_sort_permutation` shuffles as `jax.random.permutation` does (sorts by random keys, in
enough rounds), but with each index in the low bits of its own key, so XLA sorts one `uint32`
array instead of (key, index) pairs with a compiled comparator: about 2x faster on CPU for
PPO's 512-sample batches (the shuffle was 8% of a CartPole run), slower on a TPU
(docs/performance.md), where `wide_key_permutation` sorts a large batch once, not twice.
`permutation` takes each backend's faster (`lax.platform_dependent`).

`shuffled_minibatches` returns the permutation and the batch packed (`Minibatches`), and
`sgd_scan` gathers the minibatches: on a CPU all at once before its loop, elsewhere each in
the step that uses it, a few steps unrolled together (faster on a TPU, docs/performance.md).
"""

import dataclasses
import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from common.scan import packing
from common.threefry import straight_keys


def permutation(key, n: int):
    """A uniform permutation of `range(n)`, int32 [n]: the packed sort on CPU (its bits hashed
    in straight-line code, `common/threefry.py`), else `wide_key_permutation`."""
    return lax.platform_dependent(
        key, cpu=lambda k: packed_sort_permutation(straight_keys(k), n),
        default=lambda k: wide_key_permutation(k, n))


def wide_key_permutation(key, n: int):
    """A uniformly random permutation of `range(n)`, int32 [n], in one sort by 64 random bits.

    `jax.random.permutation` sorts the indices by 32 random bits in `ceil(3 log n / log 2**32)`
    rounds: one up to n = 1,625, two up to about 2.6 million. Here two rounds' bits are one
    sort's two `uint32` keys, so the order is uniform except among indices whose 64 bits all
    collide (probability at most `n**2 / 2**65`), as with jax's rounds; up to n = 2**21 that
    is the `3 log2 n` bits jax asks for, beyond it this is jax's own. On a TPU v5e the sort of
    Brax Ant's batch (4 seeds x 20,480 samples) took 203 us against jax's 324
    (docs/performance.md). Where jax sorts once, this is `jax.random.permutation` itself.
    """
    jax_rounds = math.ceil(3 * math.log(max(1, n)) / math.log(2 ** 32 - 1))
    if jax_rounds <= 1 or n > 2 ** 21:
        return jax.random.permutation(key, n).astype(jnp.int32)  # int64 under jax_enable_x64
    high, low = jax.random.bits(key, (2, n), jnp.uint32)
    return lax.sort((high, low, jnp.arange(n, dtype=jnp.int32)), num_keys=2)[2]


def packed_sort_permutation(key, n: int):
    """A uniformly random permutation of `range(n)`, int32 [n], sorting one `uint32` array.

    Round r sorts the current order by `(random bits << index_bits) | position`: a permutation,
    uniform except among positions whose `32 - index_bits` random bits collide (they keep their
    order). As in `jax.random.permutation`, the rounds give each position `3 * log2(n)` random
    bits in all, so two collide in every round with probability at most `n ** -3`.
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


def shuffled_minibatches(key, batch, num_minibatches: int) -> "Minibatches":
    """Split `batch` (a pytree, leading axis [batch_size]) into `num_minibatches` random disjoint
    minibatches of `batch_size // num_minibatches` samples: a `Minibatches`, whose `stacked()`
    is the pytree with leading axes [num_minibatches, batch_size // num_minibatches], and
    which `sgd_scan` steps through."""
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    if batch_size % num_minibatches:
        raise ValueError(f"shuffled_minibatches: batch size {batch_size} does not divide into "
                         f"{num_minibatches} minibatches.")
    sample = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batch)
    leaves, treedef = jax.tree.flatten(sample)
    order = permutation(key, batch_size)
    return Minibatches(order, packing(sample)[0](batch), num_minibatches,
                       (treedef, tuple((x.shape, jnp.dtype(x.dtype)) for x in leaves)))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["order", "rows"],
                   meta_fields=["num_minibatches", "layout"])
@dataclasses.dataclass(frozen=True)
class Minibatches:
    """A batch split into random disjoint minibatches (`shuffled_minibatches`), not yet
    gathered: minibatch i is the samples `order[i * size:(i + 1) * size]`. The samples travel
    packed, one row of values per dtype (`common.scan.packing`): a TPU gathers a row of many
    values in about the time it takes for one value (docs/performance.md, "Speed on a TPU")."""

    order: jax.Array
    """[batch_size] int32: a random permutation of the samples."""
    rows: tuple
    """The batch packed (`common.scan.packing`): one [batch_size, n] array per dtype."""
    num_minibatches: int
    layout: tuple
    """One sample's tree structure and its leaves' shapes and dtypes."""

    def indices(self):
        """[num_minibatches, minibatch_size] int32: the samples of each minibatch."""
        return self.order.reshape((self.num_minibatches, -1))

    def take(self, index):
        """The samples `index` (int array [*lead]) as the batch's pytree with leading axes
        [*lead]: `jax.tree.map(lambda x: x[index], batch)`."""
        return self._unpack(tuple(rows[index] for rows in self.rows))

    def stacked(self):
        """Every minibatch, gathered at once: the pytree with leading axes [num_minibatches,
        minibatch_size]."""
        return self._unpack(tuple(rows[self.order].reshape((self.num_minibatches, -1,
                                                            rows.shape[-1]))
                                  for rows in self.rows))

    def _unpack(self, packed):
        treedef, leaves = self.layout
        return packing(jax.tree.unflatten(
            treedef, [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in leaves]))[1](packed)


class FlatOptimizer(NamedTuple):
    """An optax optimiser on parameter trees that runs `inner` on one flat vector
    (`flat_optimizer`)."""

    init: Callable
    update: Callable
    inner: optax.GradientTransformation
    """The optimiser of the flat vector: every leaf of fewer than two dimensions, then every
    matrix, in tree order (`vector_form`'s `ravel`)."""


def flat_optimizer(inner) -> FlatOptimizer:
    """`optax.flatten(inner)` with the vectors first: `inner` runs on one flat vector holding
    every leaf of fewer than two dimensions (biases, log-std), then every matrix, in tree order.

    The same numbers as `inner` on the tree for any elementwise transformation (clipping by
    global norm, Adam, RMSprop), in far fewer kernels, and `sgd_scan` steps it without
    taking the vector apart. A transformation that looks at the tree's structure
    (`optax.masked`, per-layer rates) must go outside it.
    """

    def init(params):
        return inner.init(vector_form(params).ravel(vector_form(params).to_carry(params)))

    def update(updates, state, params=None):
        form = vector_form(updates)
        flat, state = inner.update(form.ravel(form.to_carry(updates)), state,
                                   None if params is None else form.ravel(form.to_carry(params)))
        return form.to_params(form.unravel(flat)), state

    return FlatOptimizer(init, update, inner)


class VectorForm(NamedTuple):
    """Conversions between a parameter tree and its vector form `(vector, matrices)`: every
    leaf of fewer than two dimensions flattened into one vector, and the matrices as they are,
    both in tree order. They only move data."""

    to_carry: Callable
    to_params: Callable
    ravel: Callable
    """`(vector, matrices)` -> one flat vector: the vector, then each matrix row-major."""
    unravel: Callable


def vector_form(template) -> VectorForm:
    """The `VectorForm` of trees shaped like `template` (parameters, gradients, updates)."""
    leaves, treedef = jax.tree.flatten(template)
    is_matrix = [jnp.ndim(x) >= 2 for x in leaves]
    shapes = [tuple(jnp.shape(x)) for x in leaves]
    sizes = [math.prod(s) for s in shapes]
    vector_size = sum(n for n, m in zip(sizes, is_matrix) if not m)

    def to_carry(tree):
        leaves = jax.tree.leaves(tree)
        vectors = [jnp.ravel(x) for x, m in zip(leaves, is_matrix) if not m]
        return (jnp.concatenate(vectors) if vectors else jnp.zeros((0,), jnp.float32),
                tuple(x for x, m in zip(leaves, is_matrix) if m))

    def to_params(carry):
        vector, matrices = carry
        out, next_matrix, offset = [], iter(matrices), 0
        for m, shape, n in zip(is_matrix, shapes, sizes):
            if m:
                out.append(next(next_matrix))
            else:
                out.append(jnp.reshape(vector[offset:offset + n], shape))
                offset += n
        return jax.tree.unflatten(treedef, out)

    def ravel(carry):
        vector, matrices = carry
        return jnp.concatenate([vector] + [jnp.ravel(m) for m in matrices])

    def unravel(flat):
        matrices, offset = [], vector_size
        for m, shape, n in zip(is_matrix, shapes, sizes):
            if m:
                matrices.append(jnp.reshape(flat[offset:offset + n], shape))
                offset += n
        return flat[:vector_size], tuple(matrices)

    return VectorForm(to_carry, to_params, ravel, unravel)


def sgd_scan(loss_fn, optimizer, params, opt_state, batches, reduce=lambda tree: tree,
             vector_steps: bool | None = None, unroll: int | None = None):
    """Minibatch SGD, one step per minibatch of `batches` (a `Minibatches`, or a pytree whose
    leading axis is the steps):

        grads, aux = grad(loss_fn, has_aux=True)(params, batch);  grads, aux = reduce(...)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)

    as one `lax.scan`; `reduce` is applied to `(grads, aux)` (e.g. `pmean` over devices).
    Returns `(params, opt_state, aux)`, `aux` stacked over the steps. Trees in, trees out,
    any optax optimiser. With a `flat_optimizer` the loop carries the parameters in their
    `vector_form` and steps that form with the flat optimiser directly: the same numbers, and
    on XLA:CPU no bias is cut out of a vector and joined back in each step (for PPO on
    CartPole under `vmap`, about a quarter of the run's time).

    Off a CPU (`vector_steps` None: `jax.default_backend()`; True or False to choose), a flat
    optimiser steps the tree instead (`stepping_form`; on a TPU v5e joining Brax Ant's
    gradients into one vector cost 16 of each step's 58 us), its state moved out of the
    vector and back around the loop, so the state the caller holds, and a checkpoint, is the
    same on every backend (the same numbers, up to the rounding of the global norm's sum).

    A `Minibatches` is gathered where `unroll` says. None: on a CPU all at once before the
    loop (`stacked()`), elsewhere each in the step that uses it, `UNROLL_OFF_CPU` steps
    unrolled together so that one step's gather runs beside another's work (0.9 ms of Brax
    Ant's update on a TPU v5e; docs/performance.md); an int: in its step, unrolled so.
    """
    if unroll is not None and (not isinstance(unroll, int) or unroll < 1):
        raise ValueError(f"sgd_scan: unroll must be a whole number of steps, 1 or more (or "
                         f"None for the backend's choice), got {unroll!r}.")
    optimizer, opt_state, stored = stepping_form(optimizer, params, opt_state, vector_steps)
    xs, minibatch = batches, lambda batch: batch
    if isinstance(batches, Minibatches):
        if unroll is None and jax.default_backend() == "cpu":
            xs = batches.stacked()
        else:
            xs, minibatch = batches.indices(), batches.take
            unroll = unroll or UNROLL_OFF_CPU
    unroll = unroll or 1
    if isinstance(optimizer, FlatOptimizer):
        return _vector_sgd_scan(loss_fn, optimizer, params, opt_state, xs, minibatch, reduce,
                                unroll)

    def step(carry, x):
        p, s = carry
        grads, aux = reduce(jax.grad(loss_fn, has_aux=True)(p, minibatch(x)))
        updates, s = optimizer.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), aux

    (params, opt_state), aux = lax.scan(step, (params, opt_state), xs, unroll=unroll)
    return params, stored(params, opt_state), aux


UNROLL_OFF_CPU = 4
"""`sgd_scan`'s steps unrolled together off a CPU, where it gathers each minibatch in its
step: Brax Ant's update on a TPU v5e took 62.58 ms so, 64.29 ms unrolled by 1 and 63.45 ms
with the batch gathered before the loop (docs/performance.md)."""


def stepping_form(optimizer, params, opt_state, vector_steps: bool | None = None):
    """`(optimizer, opt_state, stored)`: the optimiser and state that `sgd_scan` steps, and
    `stored(params, opt_state)`, which gives the state back in the structure the caller holds.

    A `flat_optimizer` on a CPU (`vector_steps` None: `jax.default_backend()` when traced; True
    or False to choose) is stepped as it is, and `stored` is the identity. Elsewhere its
    `inner` steps the parameter tree, the state taken out of its vector (`tree_state`) and
    put back by `stored` (`flat_state`). Any other optimiser is returned as it is. Called once
    around an update's epochs, it moves the state once, not at every `sgd_scan` (275 us for
    Brax Ant's Adam state on a TPU v5e).
    """
    if not isinstance(optimizer, FlatOptimizer) or \
            (jax.default_backend() == "cpu" if vector_steps is None else vector_steps):
        return optimizer, opt_state, lambda params, state: state
    inner = optimizer.inner
    return (inner, tree_state(inner, params, opt_state),
            lambda params, state: flat_state(params, state, opt_state))


def _vector_sgd_scan(loss_fn, optimizer, params, opt_state, xs, minibatch, reduce, unroll):
    """`sgd_scan` of a `flat_optimizer` stepping the parameters' vector form."""
    form = vector_form(params)

    def flat_step(carry, x):
        c, s = carry
        batch = minibatch(x)
        grads, aux = reduce(jax.grad(lambda c: loss_fn(form.to_params(c), batch),
                                     has_aux=True)(c))
        updates, s = optimizer.inner.update(form.ravel(grads), s, form.ravel(c))
        return (optax.apply_updates(c, form.unravel(updates)), s), aux

    (carry, opt_state), aux = lax.scan(flat_step, (form.to_carry(params), opt_state), xs,
                                       unroll=unroll)
    return form.to_params(carry), opt_state, aux


def tree_state(inner, params, state):
    """A `flat_optimizer`'s state (`inner`'s state of the flat vector) as `inner`'s state of
    the parameter tree: each vector the size of the parameters' becomes a tree shaped like
    `params` (the vector's order: `vector_form`), every other leaf (a step count) stays."""
    form, template = vector_form(params), inner.init(params)  # the zeros are never used
    return jax.tree.map(
        lambda vector, tree: form.to_params(form.unravel(vector))
        if _shaped_like(params, tree, vector) else vector, state, template)


def flat_state(params, state, flat_template):
    """`tree_state`'s inverse: `inner`'s state of the tree back in the structure of
    `flat_template` (a `flat_optimizer`'s state)."""
    form = vector_form(params)
    return jax.tree.map(
        lambda vector, tree: form.ravel(form.to_carry(tree))
        if _shaped_like(params, tree, vector) else tree, flat_template, state)


def _shaped_like(params, tree, vector) -> bool:
    """Whether `tree` is a tree of parameters' shape whose flat form is `vector`."""
    size = sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(params))
    return jax.tree.structure(tree) == jax.tree.structure(params) and \
        jnp.shape(vector) == (size,) and \
        all(jnp.shape(a) == jnp.shape(b) for a, b in zip(jax.tree.leaves(tree),
                                                         jax.tree.leaves(params)))
