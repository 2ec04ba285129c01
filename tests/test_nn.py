"""`common.nn`: the orthogonal initialiser (flax's values, no batched QR under `vmap`, the
jaxlib 0.10 deadlock it avoids), and `Conv` and `Dense` against NumPy loops and flax's layers.
(Which network each algorithm builds: `tests/test_networks.py`.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.nn import orthogonal
from helpers import qr_operand_shapes


# ------------------------------------------------------------------ init
def test_orthogonal_equals_flax_and_vmaps_sequentially():
    key = jax.random.PRNGKey(3)
    ours = orthogonal(np.sqrt(2))(key, (64, 64))
    flax_init = jax.nn.initializers.orthogonal(np.sqrt(2))(key, (64, 64))
    np.testing.assert_allclose(ours, flax_init, rtol=1e-6, atol=1e-6)
    keys = jax.random.split(key, 3)
    batched = jax.vmap(lambda k: orthogonal(1.0)(k, (8, 8)))(keys)
    for i in range(3):
        np.testing.assert_allclose(batched[i], orthogonal(1.0)(keys[i], (8, 8)), rtol=1e-6)
    # Under vmap: one 8 x 8 QR per seed in a loop, never flax's batched QR of [3, 8, 8] (the
    # jaxlib 0.10 deadlock below).
    def vmapped(init):
        return jax.make_jaxpr(jax.vmap(lambda k: init(k, (8, 8))))(keys).jaxpr

    assert qr_operand_shapes(vmapped(orthogonal(1.0))) == [(8, 8)]
    assert (3, 8, 8) in qr_operand_shapes(vmapped(jax.nn.initializers.orthogonal(1.0)))


# ------------------------------------------------------------------ the jaxlib 0.10 deadlock
@pytest.mark.subprocess
def test_vmapped_network_init_under_pmap_does_not_deadlock():
    """Regression test for the batched-QR deadlock of jaxlib 0.10.x (see `common.nn.orthogonal`).

    `tests/hang_probe.py --flax-orthogonal` (flax's own initialiser) hangs here, at 0% CPU;
    with `common.nn.orthogonal` the same probe finishes in seconds."""
    import os
    import subprocess
    import sys

    probe = os.path.join(os.path.dirname(__file__), "hang_probe.py")
    try:
        result = subprocess.run([sys.executable, probe], capture_output=True, text=True,
                                timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("pmap(vmap(network.init)) hung: the batched-QR deadlock is back")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


# ------------------------------------------------------------------ the CNN's convolution
def numpy_conv_same(x, kernel, bias):
    """The definition, one output at a time: zero padding, stride 1, cross-correlation."""
    kh, kw, _, features = kernel.shape
    height, width = x.shape[-3:-1]
    padded = np.pad(x, [(0, 0)] * (x.ndim - 3) + [(kh // 2,) * 2, (kw // 2,) * 2, (0, 0)])
    out = np.zeros(x.shape[:-1] + (features,))
    for i in range(height):
        for j in range(width):
            window = padded[..., i:i + kh, j:j + kw, :]
            out[..., i, j, :] = np.einsum("...abc,abcf->...f", window, kernel) + bias
    return out


@pytest.mark.parametrize("kernel_size", [(3, 3), (1, 1), (5, 3)])
def test_conv_same_matches_a_numpy_loop_and_flax(kernel_size):
    from common.nn import Conv, conv_same

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 6, 5, 4)).astype(np.float32)
    kernel = rng.normal(size=(*kernel_size, 4, 7)).astype(np.float32)
    bias = rng.normal(size=7).astype(np.float32)
    np.testing.assert_allclose(jax.jit(conv_same)(x, kernel, bias),
                               numpy_conv_same(x, kernel, bias), rtol=1e-5, atol=1e-5)
    # the module: flax.linen.Conv's parameters (names, shapes, initial values) and outputs
    import flax.linen as nn
    ours, theirs = Conv(7, kernel_size, orthogonal(1.4)), nn.Conv(7, kernel_size,
                                                                  kernel_init=orthogonal(1.4))
    params = ours.init(jax.random.PRNGKey(1), x)
    flax_params = theirs.init(jax.random.PRNGKey(1), x)
    jax.tree.map(np.testing.assert_array_equal, params, flax_params)
    np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-5,
                               atol=1e-5)
    # under vmap over kernels (seeds): each the same as alone
    kernels = np.stack([kernel, -kernel, 2 * kernel])
    batched = jax.vmap(conv_same, in_axes=(None, 0, None))(x, kernels, bias)
    for k, got in zip(kernels, batched):
        np.testing.assert_allclose(got, numpy_conv_same(x, k, bias), rtol=1e-5, atol=1e-4)


def test_conv_same_refuses_even_kernels_and_wrong_channels():
    from common.nn import conv_same

    x = np.zeros((10, 10, 4), np.float32)
    with pytest.raises(ValueError, match="odd sizes"):
        conv_same(x, np.zeros((2, 2, 4, 8), np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="4 input channels"):
        conv_same(np.zeros((10, 10, 3), np.float32), np.zeros((3, 3, 4, 8), np.float32),
                  np.zeros(8, np.float32))


# ------------------------------------------------------------------ Dense's weight gradient
@pytest.mark.parametrize("shape", [(32, 7), (3, 5, 7)])
def test_dense_equals_flax_dense_in_value_and_gradients(shape):
    """Same parameters, outputs and gradients (to rounding) as nn.Dense, also under vmap; the
    reference gradients are written out in NumPy: dL/dW = x^T g, dL/dx = g W^T, dL/db = sum g."""
    import flax.linen as nn
    from common.nn import Dense, matmul

    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    params = nn.Dense(4).init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, Dense(4).init(jax.random.PRNGKey(1), x)) == \
        jax.tree.map(jnp.shape, params)
    np.testing.assert_array_equal(Dense(4).init(jax.random.PRNGKey(1), x)["params"]["kernel"],
                                  params["params"]["kernel"])

    def loss(module, p, x):  # L = sum(sin(y)), so g = cos(y)
        return jnp.sum(jnp.sin(module.apply(p, x)))

    kernel = np.asarray(params["params"]["kernel"])
    x_rows = np.asarray(x).reshape(-1, shape[-1])
    g = np.cos(x_rows @ kernel + np.asarray(params["params"]["bias"]))
    grads, grad_x = jax.jit(jax.grad(lambda p, x: loss(Dense(4), p, x), argnums=(0, 1)))(params, x)
    np.testing.assert_allclose(grads["params"]["kernel"], x_rows.T @ g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["params"]["bias"], g.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_x, (g @ kernel.T).reshape(shape), rtol=1e-5, atol=1e-5)
    # under vmap over a leading axis of parameters (as over seeds): each equals its own grad
    stacked = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), params)
    batched = jax.vmap(jax.grad(lambda p: loss(Dense(4), p, x)))(stacked)
    for i in range(2):
        one = jax.tree.map(lambda a: a[i], stacked)
        expected = jax.grad(lambda p: loss(nn.Dense(4), p, x))(one)
        np.testing.assert_allclose(batched["params"]["kernel"][i], expected["params"]["kernel"],
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(matmul(x, kernel), np.asarray(x) @ kernel, rtol=1e-6, atol=1e-6)


def test_dense_kept_transpose_is_a_copy_for_one_run_and_folds_into_the_product_under_vmap():
    """`kept_transpose(x) = x.T`, also vmapped and nested; one run keeps it as an array (an
    optimisation barrier), vmapped over seeds it is a plain transpose, so that the weight
    gradient is one batched product; Dense's gradients with inputs batched too equal flax's."""
    import flax.linen as nn
    from common.nn import Dense, kept_transpose

    xs = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(kept_transpose(xs[0, 0]), xs[0, 0].T)
    np.testing.assert_array_equal(jax.vmap(kept_transpose)(xs[0]), xs[0].transpose(0, 2, 1))
    np.testing.assert_array_equal(jax.vmap(jax.vmap(kept_transpose))(xs),
                                  xs.transpose(0, 1, 3, 2))
    assert "optimization_barrier" in str(jax.make_jaxpr(kept_transpose)(xs[0, 0]))
    assert "optimization_barrier" not in str(jax.make_jaxpr(jax.vmap(kept_transpose))(xs[0]))

    def grads(module, p, x):
        return jax.grad(lambda p: jnp.sum(jnp.sin(module.apply(p, x))))(p)

    params = jax.vmap(nn.Dense(6).init)(jax.random.split(jax.random.PRNGKey(0), 3), xs[0])
    ours = jax.jit(jax.vmap(functools.partial(grads, Dense(6))))(params, xs[0])
    flax = jax.vmap(functools.partial(grads, nn.Dense(6)))(params, xs[0])
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), ours, flax)
