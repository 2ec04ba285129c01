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

`carry_form(template)` converts between the network's tree and that form; nothing is computed.
"""

import math

import jax
import jax.numpy as jnp


def carry_form(template):
    """`(to_carry, to_params)` for parameter trees shaped like `template`.

    `to_carry(params)` is `(matrices, vector)`: a tuple of the leaves with 2 or more dimensions,
    in tree order, and the other leaves flattened and concatenated in tree order (float32 [0]
    if there are none). `to_params` inverts it exactly. Both work on gradients and updates too.
    """
    leaves, treedef = jax.tree.flatten(template)
    is_matrix = [jnp.ndim(x) >= 2 for x in leaves]
    shapes = [jnp.shape(x) for x in leaves]

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

    return to_carry, to_params
