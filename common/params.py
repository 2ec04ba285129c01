"""Network parameters in the form a minibatch loop carries fastest on XLA:CPU: the matrices
as they are, every vector (biases, log-std) together in one flat vector.

XLA:CPU runs a compiled loop body as a graph of kernels on the calling thread and, whenever
more than 8 kernels are ready at once, hands half of them to its thread pool, which for a body
of about 100 us (a PPO minibatch on CartPole) costs more than it shares (`common/scan.py`).
How the parameters are carried decides how many kernels a minibatch readies at once:

- as the network's tree (12 arrays for PPO's two 3-layer MLPs), the step at the end of the
  minibatch writes 12 arrays, all ready together after the optimiser's global clipping;
- as one flat vector, each weight matrix must be copied out of it for its matrix product at
  the start, 6 copies ready together with the minibatch's own slices and Adam's scalars;
- matrices apart and vectors together, the end writes 7 arrays and the start copies nothing
  (a bias is read straight from the vector by the kernel that adds it).

`carry_form(template)` converts between the network's tree, that form and one flat vector (for
the optimiser); nothing is computed.
"""

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class CarryForm(NamedTuple):
    """The conversions of `carry_form`; all are exact (they only move data)."""

    to_carry: Callable
    """params -> (matrices, vector)."""
    to_params: Callable
    """(matrices, vector) -> params."""
    ravel: Callable
    """(matrices, vector) -> one flat vector: `vector`, then each matrix row-major."""
    unravel: Callable
    """The inverse of `ravel`."""


def carry_form(template) -> CarryForm:
    """The conversions between parameter trees shaped like `template` and the carried form
    `(matrices, vector)`: a tuple of the leaves with 2 or more dimensions, in tree order, and
    the other leaves flattened and concatenated in tree order (float32 [0] if there are none).
    They work on gradients and updates too.

    `ravel` flattens the carried form with the vector first, so that unravelling an update
    slices each array out whole (an interleaved order would gather the vector from pieces).
    """
    leaves, treedef = jax.tree.flatten(template)
    is_matrix = [jnp.ndim(x) >= 2 for x in leaves]
    shapes = [tuple(jnp.shape(x)) for x in leaves]
    matrix_shapes = [s for s, m in zip(shapes, is_matrix) if m]
    vector_size = sum(math.prod(s) for s, m in zip(shapes, is_matrix) if not m)

    def to_carry(params):
        leaves = jax.tree.leaves(params)
        vectors = [jnp.ravel(x) for x, m in zip(leaves, is_matrix) if not m]
        vector = jnp.concatenate(vectors) if vectors else jnp.zeros((0,), jnp.float32)
        return tuple(x for x, m in zip(leaves, is_matrix) if m), vector

    def to_params(carry):
        matrices, vector = carry
        out, next_matrix, offset = [], iter(matrices), 0
        for m, shape in zip(is_matrix, shapes):
            if m:
                out.append(next(next_matrix))
            else:
                size = math.prod(shape)
                out.append(jnp.reshape(vector[offset:offset + size], shape))
                offset += size
        return jax.tree.unflatten(treedef, out)

    def ravel(carry):
        matrices, vector = carry
        return jnp.concatenate([vector] + [jnp.ravel(m) for m in matrices])

    def unravel(flat):
        matrices, offset = [], vector_size
        for shape in matrix_shapes:
            size = math.prod(shape)
            matrices.append(jnp.reshape(flat[offset:offset + size], shape))
            offset += size
        return tuple(matrices), flat[:vector_size]

    return CarryForm(to_carry, to_params, ravel, unravel)
