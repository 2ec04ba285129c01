"""Checks of a config's fields, run in its `__post_init__`, and of array shapes: plain Python
and NumPy, no JAX.

Each check raises `ValueError` with one line that names the command-line flag, what it must
be, and the value it got, e.g. `--num-envs must be a positive integer, got 0.`
"""

import math

import numpy as np


def flag(name: str) -> str:
    """The command-line flag of a config field: `num_envs` -> `--num-envs`."""
    return "--" + name.replace("_", "-")


RULES = {
    "positive_int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                     "must be a positive integer"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "must be >= 0 (0: never)"),
    "nonnegative_int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                        "must be >= 0"),
    "positive": (lambda v: _real(v) and math.isfinite(v) and v > 0, "must be > 0"),
    "nonnegative": (lambda v: _real(v) and math.isfinite(v) and v >= 0, "must be >= 0"),
    "unit": (lambda v: _real(v) and 0.0 <= v <= 1.0, "must be in [0, 1]"),
    "unit_open": (lambda v: _real(v) and 0.0 <= v < 1.0, "must be in [0, 1)"),
}
"""rule name -> (test, what the value must be)."""


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def require(config, rule: str, *names: str):
    """Raise `ValueError` for the first field in `names` whose value breaks `rule` (`RULES`)."""
    test, must = RULES[rule]
    for name in names:
        value = getattr(config, name)
        if not test(value):
            raise ValueError(f"{flag(name)} {must}, got {value!r}.")


def one_of(config, name: str, options):
    """Raise `ValueError` unless field `name` is one of `options`."""
    value = getattr(config, name)
    if value not in options:
        raise ValueError(f"{flag(name)} must be one of {', '.join(map(repr, options))}, "
                         f"got {value!r}.")


def optional_positive(config, name: str):
    """Raise `ValueError` unless field `name` is None or a finite number > 0."""
    value = getattr(config, name)
    if value is not None and not RULES["positive"][0](value):
        raise ValueError(f"{flag(name)} must be > 0 (or None), got {value!r}.")


def check_time_major(fn_name: str, values, **arrays):
    """Raise a `ValueError` naming the argument whose shape differs from `values`' [T, *batch]."""
    shape = np.shape(values)
    for name, x in arrays.items():
        if np.shape(x) != shape:
            raise ValueError(f"{fn_name}: `{name}` has shape {np.shape(x)}, expected {shape} "
                             "(the shape of `values`, time-major [T, *batch]).")
    if len(shape) < 1:
        raise ValueError(f"{fn_name}: inputs need a leading time axis, shape [T, *batch].")
