"""Checks of a config's fields, run in its `__post_init__`, and of array shapes: plain Python
and NumPy, no JAX.

Each check raises `ValueError` with one line that names the command-line flag, what it must
be, and the value it got, e.g. `--num-envs must be a positive integer, got 0.`
"""

import dataclasses
import math
import types
import typing

import numpy as np

FLOAT32_TINY = float(np.finfo(np.float32).tiny)
"""The smallest normal float32 (about 1.2e-38): a nonzero float field below it in magnitude
becomes 0 (or a denormal, which XLA flushes to 0) once it is a float32 in the program."""


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
    "unit_open": (lambda v: _real(v) and 0.0 <= v and float(np.float32(v)) < 1.0,
                  "must be in [0, 1)"),
    "fraction": (lambda v: v is None or (_real(v) and 0.0 < v <= 1.0),
                 "must be in (0, 1] (or None)"),
}
"""rule name -> (test, what the value must be)."""


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def check_fields(config, wide=()):
    """Raise `ValueError` for the first field of dataclass `config` whose value does not have
    its declared type: `int` fields hold integers (not `1e5`, not `True`), `float` fields
    finite numbers that survive the conversion to float32 (neither overflow to inf nor round
    to 0), `bool` fields booleans, `str` fields strings, `Literal` fields one of their values,
    and `X | None` fields None or an `X`.

    Integers must also fit the program's 32-bit integers (below 2**31 in magnitude), except
    the fields named in `wide` (counted on the host in Python's integers, e.g. the seed).

    Run first in `__post_init__`, so that the range checks after it can trust the types; from
    Python this is what stops `Config(total_timesteps=1e5)` (a float step counter).
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        problem = _type_problem(value, field.type)
        if problem:
            raise ValueError(f"{flag(field.name)} {problem}.")
        if field.name not in wide and isinstance(value, (int, np.integer)) and \
                not isinstance(value, bool) and abs(int(value)) >= 2**31:
            raise ValueError(f"{flag(field.name)} must be below 2**31 = 2,147,483,648, got "
                             f"{value}.")


def _type_problem(value, annotation) -> str | None:
    """What is wrong with `value` as an `annotation` (None: nothing)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(value, a) for a in args if a is not type(None)]
        return None if None in problems else problems[0]
    if origin is typing.Literal:
        return None if value in args else \
            f"must be one of {', '.join(map(repr, args))}, got {value!r}"
    if annotation is bool:
        return None if isinstance(value, (bool, np.bool_)) else \
            f"must be true or false, got {value!r}"
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            return f"must be an integer, got {value!r} ({type(value).__name__})"
        return None
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            return f"must be a number, got {value!r} ({type(value).__name__})"
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        with np.errstate(over="ignore"):
            as_float32 = float(np.float32(value))
        if not math.isfinite(as_float32):
            return f"is {value!r}, beyond float32's range (about 3.4e38) in the program"
        if value != 0 and abs(value) < FLOAT32_TINY:
            return (f"is {value!r}, which rounds to 0 in float32 in the program (the smallest "
                    f"float32 is about {FLOAT32_TINY:.1e})")
        return None
    if annotation is str:
        return None if isinstance(value, str) else f"must be a string, got {value!r}"
    return None


def require(config, rule: str, *names: str):
    """Raise `ValueError` for the first field in `names` whose value breaks `rule` (`RULES`)."""
    test, must = RULES[rule]
    for name in names:
        value = getattr(config, name)
        if not test(value):
            if _real(value) and value < 1.0 <= float(np.float32(value)):
                raise ValueError(f"{flag(name)} {must}, got {value!r}, which rounds to 1.0 in "
                                 f"float32 in the program (the largest float32 below 1 is "
                                 f"{float(np.nextafter(np.float32(1), np.float32(0))):.8f}).")
            raise ValueError(f"{flag(name)} {must}, got {value!r}.")


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
