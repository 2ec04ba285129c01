"""Collectives across devices (`pmean`, `psum`, `all_gather`), no-ops where no axis is bound.

One `make_train` runs on one device or many: inside `jax.shard_map` with the named axis
`DATA_AXIS` (data-parallel training: one agent, its environments split across devices),
gradients and statistics are averaged over it; anywhere else (plain `jit`, `vmap` over seeds,
`shard_map` over `SEEDS_AXIS`) the same call returns its input unchanged, `axis_size()` is 1
and `axis_index()` is 0.

Data-parallel training keeps one invariant: every device holds the same parameters, optimiser
state, observation statistics and PRNG key; only its environments (and their keys,
`fold_in_device`) differ. Each update all-gathers the rollout (`all_gather`), every device
shuffles that global batch with the same key, and each takes the gradient of its 1/D share of
each minibatch (`device_share`), their mean (`pmean`) the minibatch's: the same parameters
on 1, 2 or 4 devices, to float rounding (`tests/test_scaling.py`).

`common/parallel.py` wraps a `train` function for either layout from Python (the command
line does the same with more bookkeeping in `common/host/devices.py`'s `Layout`).
"""

import jax
import jax.numpy as jnp
from jax import lax

DATA_AXIS = "data"
"""The axis name the algorithms average gradients over in data-parallel training."""

SEEDS_AXIS = "seeds"
"""The axis name independent runs are split over (no collective ever names it)."""


def _bound(axis_name) -> bool:
    if axis_name is None:
        return False
    try:
        lax.axis_size(axis_name)
        return True
    except NameError:  # JAX raises NameError for an axis name no enclosing map binds.
        return False


def pmean(tree, axis_name=DATA_AXIS):
    """Mean of `tree` over the devices along `axis_name`; `tree` itself if that axis is unbound."""
    return lax.pmean(tree, axis_name) if _bound(axis_name) else tree


def psum(tree, axis_name=DATA_AXIS):
    """Sum of `tree` over the devices along `axis_name`; `tree` itself if that axis is unbound."""
    return lax.psum(tree, axis_name) if _bound(axis_name) else tree


def axis_size(axis_name=DATA_AXIS) -> int:
    """Number of devices along `axis_name` (a Python int); 1 if that axis is unbound."""
    return lax.axis_size(axis_name) if _bound(axis_name) else 1


def axis_index(axis_name=DATA_AXIS):
    """This device's position along `axis_name`; 0 if that axis is unbound."""
    return lax.axis_index(axis_name) if _bound(axis_name) else jnp.int32(0)


def all_gather(tree, axis: int, axis_name=DATA_AXIS):
    """Concatenate every device's `tree` along `axis`, in device order (`tiled`); `tree`
    itself if the axis is unbound. Devices holding consecutive blocks of environments get back
    the arrays one device would have had."""
    if not _bound(axis_name):
        return tree
    return jax.tree.map(lambda x: lax.all_gather(x, axis_name, axis=axis, tiled=True), tree)


def device_share(tree, axis_name=DATA_AXIS, axis: int = 0):
    """This device's 1/D block of `tree` along `axis` (D devices on `axis_name`); the whole
    `tree` if the axis is unbound. The size along `axis` must divide by D."""
    n = axis_size(axis_name)
    if n == 1:
        return tree
    index = axis_index(axis_name)

    def share(x):
        if x.shape[axis] % n:
            raise ValueError(f"device_share: size {x.shape[axis]} along axis {axis} does not "
                             f"divide among {n} devices.")
        size = x.shape[axis] // n
        return lax.dynamic_slice_in_dim(x, index * size, size, axis)

    return jax.tree.map(share, tree)


def fold_in_device(key, axis_name=DATA_AXIS):
    """A key of this device's own (`fold_in` of its index) where the axis is bound with more
    than one device; `key` itself otherwise, so one device keeps the numbers it always had."""
    return jax.random.fold_in(key, axis_index(axis_name)) if axis_size(axis_name) > 1 else key


def mean_var(x, axis_name=DATA_AXIS):
    """Mean and (population) variance of all elements of `x` across the devices along
    `axis_name` (equal shards), two-pass as `jnp.var`: `x.mean()`, `x.var()` if unbound."""
    mean = pmean(jnp.mean(x), axis_name)
    return mean, pmean(jnp.mean(jnp.square(x - mean)), axis_name)


def explained_variance(target, prediction, axis_name=DATA_AXIS):
    """1 - Var[target - prediction] / Var[target] over all elements and devices (`mean_var`);
    NaN where Var[target] = 0, as OpenAI Baselines' `explained_variance` (not -inf)."""
    _, var_error = mean_var(target - prediction, axis_name)
    _, var_target = mean_var(target, axis_name)
    return jnp.where(var_target > 0, 1.0 - var_error / var_target, jnp.nan)
