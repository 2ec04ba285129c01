"""Per-environment settings of the learning benchmarks.

`CONFIGS` are the package's presets (`common/presets.py`), the same settings the command
line applies for an environment: the overrides of the algorithm's `Config` defaults, step
budget included. Anything not listed is the algorithm file's default.

`VARIANTS` are named sets of overrides applied on top (`benchmarks/learning.py --variant
NAME`, results saved as `{algo}__{env_id}__{NAME}.json`).

`source_commit()` is the commit every saved result records; `thin_curves` keeps a saved
learning curve to at most `MAX_POINTS` points; `time_in_alternation` times compiled programs
side by side for the comparison scripts.
"""

import ast
import dataclasses
import json
import os
import re
import subprocess
import time
from importlib import metadata

import numpy as np

from common.presets import MINATAR, PRESETS as CONFIGS  # noqa: F401  (one place for both)

VARIANTS = {
    # MinAtar on this project's 2-core CPU: PPO's CNN runs at about 8k SPS for one seed there
    # (and no faster in all for 8 or 32 vmapped seeds; docs/performance.md), so a 1e7-step
    # cell would take hours. The CPU grid uses PureJaxRL's MinAtar network instead -- 64x64
    # ReLU MLPs on the flattened 10x10xC image -- at 1e6 steps, the budget of PureJaxRL's
    # MinAtar figures.
    "mlp1e6": dict(network="mlp", activation="relu", total_timesteps=1_000_000),
    # The CNN (the default for image observations) at the same 1e6-step budget, to compare
    # with the MLP and with PureJaxRL's MLP figures at that budget.
    "cnn1e6": dict(network="cnn", total_timesteps=1_000_000),
    # The same MLP at 5e6 steps, the MinAtar paper's budget (Young & Tian 2019).
    "mlp5e6": dict(network="mlp", activation="relu", total_timesteps=5_000_000),
}


def settings(algo: str, env_id: str, variant: str = "") -> dict:
    """The `Config` overrides of one grid cell: its `CONFIGS` entry, then the variant's."""
    if variant and variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}.")
    return {**CONFIGS.get((algo, env_id), {}), **VARIANTS.get(variant, {})}


def source_commit() -> str:
    """The commit a result is measured on, for its JSON record: `SOURCE_COMMIT` when set (a
    tree copied to another machine, such as a GPU, whose own git metadata need not match),
    else this checkout's `git rev-parse --short HEAD`, else "unknown"."""
    if os.environ.get("SOURCE_COMMIT"):
        return os.environ["SOURCE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                              ).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def parse_overrides(items) -> dict:
    """`["field=value", ...]` (a script's `--set`) -> {field: value}, each value read as a
    Python literal when it is one, else kept as a string."""
    out = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: expected FIELD=VALUE, got {item!r}.")
        try:
            out[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[field] = value
    return out


def check_overrides(algo: str, config_cls, overrides: dict, total_timesteps=None):
    """Exit with one line unless every name in `overrides` (a script's `--set`) is a field of
    `config_cls` other than `env_id` (which `--env-id` sets), and the step budget is given at
    most once. `--set total_timesteps=N` is the same as `--total-timesteps N`: it is taken out
    of `overrides`, and the budget (or None) is returned."""
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name != "env_id"]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise SystemExit(f"error: --set {unknown[0]} is not a field of algos/{algo}.py's "
                         f"Config to override here (--env-id sets the environment); fields: "
                         f"{', '.join(fields)}.")
    if "total_timesteps" in overrides:
        if total_timesteps is not None:
            raise SystemExit("error: give the step budget once: --total-timesteps or --set "
                             "total_timesteps=..., not both.")
        total_timesteps = overrides.pop("total_timesteps")
    return total_timesteps


def library_versions() -> dict:
    """The versions of the libraries a result depends on, for its JSON record."""
    return {p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "optax", "distrax",
                                             "gymnax")}


def out_file(parser, path: str) -> str:
    """`path`, the one results file a script writes at its end, checked before it runs
    anything: a folder, or a folder that cannot be made for it, is `parser`'s error (one line,
    exit status 2). Makes the file's folder."""
    if os.path.isdir(path) or path.endswith(os.sep):
        parser.error(f"--out {path} is a folder; give the results file's path, for example "
                     f"{os.path.join(path, 'result.json')}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {path}: cannot make its folder {folder} ({error.strerror})")
    return path


def refuse_other_mode(parser, args, defaults, mode: str, only_with, only_without):
    """A script of two modes (`--{mode}` on or off): exit through `parser.error` when a flag of
    the other mode was given (its value differs from `defaults`, the parse of no flags)."""
    on = getattr(args, mode)
    wrong = [name for name in (only_without if on else only_with)
             if getattr(args, name) != getattr(defaults, name)]
    if wrong:
        flag = "--" + wrong[0].replace("_", "-")
        parser.error(f"{flag} applies only {'without' if on else 'with'} --{mode}")


def save_record(record: dict, out_dir: str, name: str) -> str:
    """Write one result's JSON record to `out_dir/name.json` (a `/` in `name`, as in a
    `brax/...` id, becomes `-`); returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name.replace('/', '-')}.json")
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
    return path


MAX_POINTS = 500
"""The most points a saved learning curve keeps, per run: a plot needs no more. Summary figures
(`final_return`, ...) are computed from the whole curve before it is thinned."""


def thin_curves(global_step, curves, max_points: int = MAX_POINTS):
    """`(global_step, curves, every)`: per-update curves (`curves` [..., num_updates], NaN
    where no episode finished) as the means of blocks of `every` consecutive updates, NaNs
    skipped (NaN where no update of the block finished one), each at the global step of its
    block's last update. `every` is the smallest block that leaves at most `max_points`
    points; 1 leaves the curves as they are."""
    curves = np.asarray(curves, np.float64)
    num_updates = curves.shape[-1]
    every = max(1, -(-num_updates // max_points))
    if every == 1:
        return list(global_step), curves, 1
    starts = np.arange(0, num_updates, every)
    finite = np.isfinite(curves)
    total = np.add.reduceat(np.where(finite, curves, 0.0), starts, axis=-1)
    count = np.add.reduceat(finite, starts, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    ends = np.minimum(starts + every, num_updates) - 1
    return [global_step[i] for i in ends], means, every


SUMMARY = re.compile(r"final return \(last 10% of updates\) (?:mean (?P<mean>-?[\d.]+), min "
                     r"(?P<min>-?[\d.]+)[^|]*|n/a[^|]*)\| compile (?P<compile>[\d.]+)s, train "
                     r"(?P<train>[\d.]+)s \((?P<sps>[\d,]+) SPS\)")
"""The figures of the command line's summary line, `done: ...`."""


def summary_figures(stdout: str) -> dict:
    """From a command-line run's output: the final return's `mean` and `min` (NaN where no
    episode ended), `compile` and `train` seconds and `sps`, from its summary line."""
    match = SUMMARY.search(stdout)
    if match is None:
        raise RuntimeError(f"no summary line in:\n{stdout[-2000:]}")
    return {k: float(match[k].replace(",", "")) if match[k] else float("nan")
            for k in ("mean", "min", "compile", "train", "sps")}


def time_in_alternation(compiled: dict, args: tuple, steps: dict, repeats: int):
    """`(sps, outputs)` of compiled programs `{name: fn}` called on `args`: each is called
    once untimed (a program's first call pays for first touches of its memory), then `repeats`
    rounds call each in turn, so that machine noise hits all alike. `sps[name]` lists the
    rounds' `steps[name] / seconds`; `outputs[name]` is the last round's output. Prints each
    run as it finishes."""
    import jax

    for fn in compiled.values():
        jax.block_until_ready(fn(*args))
    sps, outputs = {name: [] for name in compiled}, {}
    for i in range(repeats):
        for name, fn in compiled.items():
            start = time.perf_counter()
            outputs[name] = jax.block_until_ready(fn(*args))
            sps[name].append(steps[name] / (time.perf_counter() - start))
            print(f"run {i + 1}/{repeats} {name}: {sps[name][-1]:,.0f} SPS", flush=True)
    return sps, outputs
