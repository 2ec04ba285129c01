"""`Dense`: flax's `nn.Dense` with a weight gradient that XLA:CPU computes on its fast kernels.

For `y = x @ W` (x: [batch, in], W: [in, out]) the backward pass needs two matrix products:
`dL/dx = g @ W^T` and `dL/dW = x^T @ g`, with `g = dL/dy`. Autodiff writes the second one as a
single dot that contracts the *leading* (batch) axis of both operands. XLA:CPU (jaxlib 0.10)
hands only dots whose left operand contracts its last axis to its YNNPACK kernels, so this one
falls back to a slower generic loop: in PPO's CartPole update (128 x 64 minibatches) the
64 x 64 weight gradients took about twice as long as the forward products of the same size.

Here the weight gradient is `transpose(x) @ g` with the transpose kept as a real array
(`lax.optimization_barrier` stops XLA from folding it back into the dot), which makes it an
ordinary product for the fast kernels; the copy it costs is small next to the product. The
result is the same gradient, up to float rounding. Other backends (GPU, TPU) run the usual
autodiff, since their matrix libraries take transposed operands directly.

Parameters are named and initialised exactly as by `nn.Dense` (`kernel`, `bias`).
"""

import functools

import flax.linen as nn
import jax
from jax import lax


@jax.custom_vjp
def _matmul(x, kernel):
    return x @ kernel


def _matmul_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _matmul_bwd(residuals, g):
    x, kernel = residuals
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731  [..., n] -> [batch, n]
    x_transposed = lax.optimization_barrier(rows(x).T)
    return g @ kernel.T, x_transposed @ rows(g)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(x, kernel):
    """`x` [..., in] @ `kernel` [in, out], with the weight gradient above on CPU."""
    if jax.default_backend() != "cpu":
        return x @ kernel
    return _matmul(x, kernel)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`lax.dot_general` for `nn.Dense`: its one contraction (last axis of `lhs` with the first
    of `rhs`) goes through `matmul`, anything else to `lax.dot_general` unchanged."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    dense_form = (tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
                  and not lhs_batch and not rhs_batch and rhs.ndim == 2)
    if not dense_form or precision is not None or preferred_element_type is not None:
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
    return matmul(lhs, rhs)


Dense = functools.partial(nn.Dense, dot_general=dot_general)
"""`nn.Dense` with the weight gradient above; use it wherever `nn.Dense` would be used."""
