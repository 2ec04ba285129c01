"""Averaging and summing across devices (`lax.pmean`, `lax.psum`), a no-op where the axis is not bound.

One `make_train` runs on one device or many: inside `jax.shard_map`/`jax.pmap` with the named
axis (data-parallel training), gradients and statistics are averaged over it; anywhere else
(plain `jit`, `vmap` over seeds) the same call returns its input unchanged.
"""

from jax import lax

DATA_AXIS = "data"
"""The axis name the algorithms average gradients over in data-parallel training."""


def pmean(tree, axis_name=DATA_AXIS):
    """Mean of `tree` over the devices along `axis_name`; `tree` itself if that axis is unbound."""
    if axis_name is None:
        return tree
    try:
        return lax.pmean(tree, axis_name)
    except NameError:  # JAX raises NameError for an axis name no enclosing map binds.
        return tree


def psum(tree, axis_name=DATA_AXIS):
    """Sum of `tree` over the devices along `axis_name`; `tree` itself if that axis is unbound."""
    if axis_name is None:
        return tree
    try:
        return lax.psum(tree, axis_name)
    except NameError:
        return tree
