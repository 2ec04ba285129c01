"""The layers all three algorithms build their networks from: `Dense`, `Conv`, `orthogonal`,
and the recurrent cores `GRU` and `LSTM` (`CORES`).

`orthogonal`, `Dense` and `Conv` are drop-ins for their flax counterparts (the same parameter
names, shapes, initialisation and outputs, to float rounding); they differ only in how XLA
runs them. `GRU` and `LSTM` have `flax.linen.GRUCell`'s and `LSTMCell`'s equations,
initialisation and outputs, with their gates' kernels stored side by side (so their parameter
trees are not the cells').

- `orthogonal(scale)`: `flax.linen.initializers.orthogonal` (Saxe, McClelland, Ganguli 2014,
  arXiv:1312.6120; PPO's, A2C's and IMPALA's since OpenAI Baselines), one unbatched QR per
  seed under `vmap` (`sequential_vmap`, the same numbers): jaxlib 0.10.0-0.10.2's batched QR
  on CPU waits on XLA's thread pool from inside it, and with as many such calls in flight as
  threads even plain `jit(vmap(train))` on one device stops at 0% CPU forever.
- `Dense`: `nn.Dense` whose weight gradient `x^T @ g` is an ordinary product of a
  materialised transpose: XLA:CPU (jaxlib 0.10) gives autodiff's dot, which contracts the
  batch axis of both operands, no fast kernel (twice the forward products' time in PPO's
  CartPole update). Vmapped, XLA folds the transpose into one batched product
  (`kept_transpose`); other backends use plain autodiff.
- `Conv`: `nn.Conv(features, kernel_size)` with stride 1 and 'SAME' padding, computed as one
  matrix product over the kh*kw shifted copies of the padded image (im2col),
      y[..., i, j, f] = b[f] + sum_{di, dj, c} x_pad[..., i + di, j + dj, c] K[di, dj, c, f].
  XLA:CPU runs a convolution inside a training loop slowly, and a vmapped one (a kernel per
  seed) as a grouped convolution, slower still; a matrix product batches well.
- `GRU`: `flax.linen.GRUCell` (Cho et al. 2014, arXiv:1406.1078) scanned over a leading time
  axis, its state reset to zeros at the first step of every episode, with the gates' products
  batched (below). `LSTM`: `flax.linen.LSTMCell` the same way, its state `c` and `h` side by
  side in one array, so that both cores carry one [N, width] array per environment.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import custom_batching, lax


def orthogonal(scale: float = 1.0):
    """`flax.linen.initializers.orthogonal(scale)`, batched sequentially under `vmap`."""
    base = nn.initializers.orthogonal(scale)

    def init(key, shape, dtype=jnp.float32):
        return jax.custom_batching.sequential_vmap(lambda k: base(k, shape, dtype))(key)

    return init


@jax.custom_vjp
def _matmul(x, kernel):
    return x @ kernel


def _matmul_fwd(x, kernel):
    return x @ kernel, (x, kernel)


@custom_batching.custom_vmap
def kept_transpose(x):
    """`x.T` for `x` [B, n], materialised (an optimisation barrier), so that XLA:CPU runs the
    weight gradient `x^T @ g` as an ordinary product. Under `vmap` (seeds) a plain transpose
    that XLA folds into one batched product: there the batch keeps XLA's fast kernels busy
    and copying the transposes costs (PPO on CartPole, 32 seeds on one core: 1.22x as fast
    without them; even on two threads)."""
    return lax.optimization_barrier(x.T)


@kept_transpose.def_vmap
def _kept_transpose_vmapped(axis_size, in_batched, x):
    return jnp.swapaxes(x, -1, -2), in_batched[0]


def _matmul_bwd(residuals, g):
    x, kernel = residuals
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731  [..., n] -> [batch, n]
    x_transposed = kept_transpose(rows(x))  # first, as ever: XLA:CPU runs kernels in order
    return g @ kernel.T, x_transposed @ rows(g)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(x, kernel):
    """`x` [..., in] @ `kernel` [in, out], with the weight gradient above on CPU."""
    return _matmul(x, kernel) if jax.default_backend() == "cpu" else x @ kernel


def _dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`lax.dot_general` for `nn.Dense`: its one contraction (last axis of `lhs` with the first
    of `rhs`) goes through `matmul`, anything else to `lax.dot_general` unchanged."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    dense_form = (tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
                  and not lhs_batch and not rhs_batch and rhs.ndim == 2)
    if not dense_form or precision is not None or preferred_element_type is not None:
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
    return matmul(lhs, rhs)


Dense = functools.partial(nn.Dense, dot_general=_dot_general)
"""`nn.Dense` with the weight gradient above; use it wherever `nn.Dense` would be used."""


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


def gates_orthogonal(key, shape, dtype=jnp.float32):
    """A recurrent kernel [H, k H] of k gates side by side, each gate's [H, H] block drawn
    orthogonal on its own (flax's recurrent cells initialise each gate's kernel so)."""
    h_size, gates = shape[0], shape[1] // shape[0]
    return jnp.concatenate([orthogonal()(k, (h_size, h_size), dtype)
                            for k in jax.random.split(key, gates)], axis=1)


class GRU(nn.Module):
    """A GRU core over time-major sequences, reset at episode starts:

        h_t = GRUCell(0 if first_t else h_{t-1}, x_t),   output y_t = h_t
        r = s(x W_ir + b_ir + h W_hr),  z = s(x W_iz + b_iz + h W_hz)
        n = tanh(x W_in + b_in + r (h W_hn + b_hn)),  GRUCell(h, x) = (1 - z) n + z h

    (`flax.linen.GRUCell`'s equations and initialisation: LeCun-normal input kernels,
    orthogonal recurrent ones, zero biases.) `__call__(hidden, x, first)`: `hidden` [N, H] is
    h_{-1}, the state the sequence starts from; `x` [T, N, F] the inputs; `first` [T, N] bool
    marks x_t as the first observation of an episode. Returns `(h_{T-1}, y)`, y [T, N, H].
    Acting is the case T = 1; the update recomputes a whole rollout from the state stored at
    its start, which gives the same values (truncated backpropagation through time).

    For speed the three gates' kernels are stored side by side (`input_kernel` [F, 3H],
    `recurrent_kernel` [H, 3H]) and the input products of all T steps are one matrix product
    before the loop, so a step of the loop is one [N, H] x [H, 3H] product and elementwise
    work. A step of flax's cell is six products and their sums: on XLA:CPU, where a loop step
    this small costs about as much per kernel as per flop, it ran recurrent PPO's update at
    less than half the speed.
    """

    features: int

    @staticmethod
    def initial_state(num_envs: int, features: int):
        """h for environments that have not started an episode yet: zeros [num_envs, H]."""
        return jnp.zeros((num_envs, features), jnp.float32)

    @staticmethod
    def output(states):
        """The output after each step: the state h itself."""
        return states

    @nn.compact
    def __call__(self, hidden, x, first):
        h_size = self.features

        w_i = self.param("input_kernel", nn.initializers.lecun_normal(),
                         (x.shape[-1], 3 * h_size))
        b_i = self.param("input_bias", nn.initializers.zeros, (3 * h_size,))
        w_h = self.param("recurrent_kernel", gates_orthogonal, (h_size, 3 * h_size))
        b_hn = self.param("recurrent_bias", nn.initializers.zeros, (h_size,))
        x_gates = matmul(x, w_i) + b_i  # [T, N, 3H]: every step's input products at once

        def step(h, inputs):
            x_t, first_t = inputs
            h = jnp.where(first_t[:, None], jnp.zeros_like(h), h)
            h_gates = matmul(h, w_h)
            r = nn.sigmoid(x_t[:, :h_size] + h_gates[:, :h_size])
            z = nn.sigmoid(x_t[:, h_size:2 * h_size] + h_gates[:, h_size:2 * h_size])
            n = jnp.tanh(x_t[:, 2 * h_size:] + r * (h_gates[:, 2 * h_size:] + b_hn))
            h = (1.0 - z) * n + z * h
            return h, h

        return lax.scan(step, hidden, (x_gates, first))


class LSTM(nn.Module):
    """An LSTM core over time-major sequences, reset at episode starts (Hochreiter &
    Schmidhuber 1997, with a forget gate, Gers et al. 2000):

        (c_t, h_t) = LSTMCell(0 if first_t else (c_{t-1}, h_{t-1}), x_t)
        i = s(x W_ii + h W_hi + b_i),  f = s(x W_if + h W_hf + b_f),
        g = tanh(x W_ig + h W_hg + b_g),  o = s(x W_io + h W_ho + b_o),
        c' = f c + i g,  h' = o tanh(c')

    (`flax.linen.LSTMCell`'s equations and initialisation: LeCun-normal input kernels,
    orthogonal recurrent ones, zero biases.) The interface is `GRU`'s, with the state
    [N, 2H] holding `c` and `h` side by side: `__call__(state, x, first)` returns
    `(state_{T-1}, states)`, `states` [T, N, 2H] the state after each step, whose last H
    entries, `h`, are the output (`output`). The gates' kernels are stored side by side
    (`input_kernel` [F, 4H], `recurrent_kernel` [H, 4H], in the order i, f, g, o) and the
    input products of all T steps are one product before the loop, as in `GRU`.
    """

    features: int

    @staticmethod
    def initial_state(num_envs: int, features: int):
        """(c, h) for environments that have not started an episode yet: zeros [num_envs, 2H]."""
        return jnp.zeros((num_envs, 2 * features), jnp.float32)

    @staticmethod
    def output(states):
        """h, the last half of the state: [..., 2H] -> [..., H]."""
        return states[..., states.shape[-1] // 2:]

    @nn.compact
    def __call__(self, state, x, first):
        h_size = self.features
        w_i = self.param("input_kernel", nn.initializers.lecun_normal(),
                         (x.shape[-1], 4 * h_size))
        w_h = self.param("recurrent_kernel", gates_orthogonal, (h_size, 4 * h_size))
        b = self.param("bias", nn.initializers.zeros, (4 * h_size,))
        x_gates = matmul(x, w_i) + b  # [T, N, 4H]: every step's input products at once

        def step(state, inputs):
            x_t, first_t = inputs
            state = jnp.where(first_t[:, None], jnp.zeros_like(state), state)
            c, h = state[:, :h_size], state[:, h_size:]
            gates = x_t + matmul(h, w_h)
            i, f, g, o = (gates[:, k * h_size:(k + 1) * h_size] for k in range(4))
            c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
            h = nn.sigmoid(o) * jnp.tanh(c)
            state = jnp.concatenate([c, h], axis=-1)
            return state, state

        return lax.scan(step, state, (x_gates, first))


CORES = {"gru": GRU, "lstm": LSTM}
"""The recurrent cores by their `--network` name."""
