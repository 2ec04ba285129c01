"""A 'SAME' convolution as one matrix product, for the MinAtar CNN torso.

`Conv(features, kernel_size)` is a drop-in for `flax.linen.Conv(features, kernel_size)` with
stride 1 and 'SAME' padding: the same parameters (`kernel` [kh, kw, C, F], `bias` [F]), the same
initialisation and the same outputs to float rounding. It builds the kh*kw shifted copies of
the zero-padded image, concatenates them along channels (im2col) and multiplies by the kernel
reshaped to [kh*kw*C, F]:

    y[..., i, j, f] = b[f] + sum_{di, dj, c} x_pad[..., i + di, j + dj, c] * K[di, dj, c, f]

Why not `flax.linen.Conv`: on XLA's CPU backend a convolution inside the training loop runs
slowly, and under `vmap` over seeds (different kernels per seed) it becomes a grouped
convolution that runs slower still. On the project's 2-core CPU with PPO's MinAtar settings
(Breakout, 64 envs x 128 steps, 8 minibatches x 4 epochs), `flax.linen.Conv` trained at 4.1k
steps per second for one seed and 1.4k for 4 vmapped seeds together; with this form, 8.6k for
one seed and 10.8k for 8 (README, Speed). A matrix product batches well under `vmap`.
"""

import flax.linen as nn
import jax.numpy as jnp


def conv_same(x, kernel, bias):
    """`x` [..., H, W, C] convolved ('SAME', stride 1) with `kernel` [kh, kw, C, F] (odd kh,
    kw), plus `bias` [F]: [..., H, W, F]."""
    kh, kw, channels, features = kernel.shape
    if kh % 2 == 0 or kw % 2 == 0 or x.shape[-1] != channels:
        raise ValueError(f"conv_same: kernel {kernel.shape} needs odd sizes and {channels} "
                         f"input channels; got an input of shape {x.shape}.")
    height, width = x.shape[-3], x.shape[-2]
    pad = [(0, 0)] * (x.ndim - 3) + [(kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)]
    padded = jnp.pad(x, pad)
    patches = jnp.concatenate([padded[..., i:i + height, j:j + width, :]
                               for i in range(kh) for j in range(kw)], axis=-1)
    return patches @ kernel.reshape(kh * kw * channels, features) + bias


class Conv(nn.Module):
    """`flax.linen.Conv(features, kernel_size)` (stride 1, 'SAME'), computed by `conv_same`."""

    features: int
    kernel_size: tuple
    kernel_init: object = nn.initializers.lecun_normal()
    bias_init: object = nn.initializers.zeros

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init,
                            (*self.kernel_size, x.shape[-1], self.features))
        bias = self.param("bias", self.bias_init, (self.features,))
        return conv_same(x, kernel, bias)
