"""Every flag of every algorithm, given values a hostile user might type: how each command
line ends. Prints the counts and every case that did not end in one clear line.

    python benchmarks/bad_input_sweep.py [--out benchmarks/results/bad_input_sweep.json]

For each algorithm and each flag of its `Config` and of the run options, the values tried
depend on the flag's type: integers get `-1`, `0`, `1.5`, `abc`, `1e5`, a 25-digit number and
a missing value; floats `nan`, `inf`, `-inf`, `-1`, `0`, `abc`, `1e-50` and `1e39`; booleans a
stray value; choices an unknown one; `--resume` a missing file, a directory, an empty file and
random bytes; plus an unknown environment and a mistyped flag. Each command runs in this
process up to the point where it would compile (`cli.compile_programs` is replaced by a stub
that stops there), and ends in one of:

- `refused`: exit status 2 (or 1) with exactly one line on stderr, `error: ...`;
- `accepted`: the value is valid and the run would have compiled (e.g. `--seed 0`);
- `unclear`: anything else (a traceback, several lines, exit status 0 without running).
"""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from common.host import cli  # noqa: E402
from common.host.options import RunOptions  # noqa: E402

INTS = ["-1", "0", "1.5", "abc", "1e5", "9" * 25, None]
FLOATS = ["nan", "inf", "-inf", "-1", "0", "abc", "1e-50", "1e39"]


class WouldCompile(Exception):
    pass


def values_for(field, files: dict) -> list:
    """The bad (or borderline) values to try for one dataclass field."""
    kind = field.type
    args = typing.get_args(kind)
    if field.name == "log_dir":  # every case writes to a temporary --log-dir
        return []
    if field.name == "resume":
        return [files["missing"], files["dir"], files["empty"], files["random"]]
    if field.name == "env_id":
        return ["CartPole-v9", "", "MNISTBandit-bsuite"]
    if kind is bool:
        return ["maybe"]
    if typing.get_origin(kind) is typing.Literal:
        return ["zzz"]
    if kind is int:
        return INTS
    if kind is float or float in args:
        return FLOATS
    if kind is str or str in args:
        return ["", "x" * 300]
    return []


def run_case(main, argv: list) -> tuple[str, str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(argv)
        return "unclear", "returned without compiling"
    except WouldCompile:
        return "accepted", ""
    except SystemExit as exit_:
        lines = [line for line in err.getvalue().strip().splitlines() if line.strip()]
        if exit_.code in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
            return "refused", lines[0]
        return "unclear", f"exit {exit_.code}: {err.getvalue()[-300:]!r}"
    except Exception as error:  # noqa: BLE001  (a traceback the user would have seen)
        return "unclear", f"{type(error).__name__}: {error}"[:300]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write every case to this JSON file")
    args = parser.parse_args()
    import importlib

    def stop(*a, **k):
        raise WouldCompile

    cli.compile_programs = stop
    rows = []
    with tempfile.TemporaryDirectory() as d:
        files = {"missing": os.path.join(d, "nowhere.msgpack"), "dir": d,
                 "empty": os.path.join(d, "empty.msgpack"),
                 "random": os.path.join(d, "random.msgpack")}
        open(files["empty"], "wb").close()
        with open(files["random"], "wb") as f:
            f.write(np.random.default_rng(0).bytes(4096))
        for algo in ("ppo", "a2c", "impala"):
            module = importlib.import_module(f"algos.{algo}")
            fields = dataclasses.fields(RunOptions) + dataclasses.fields(module.Config)
            cases = [["--env-i", "CartPole-v1"], ["--num-envs", "4", "--bogus"]]
            for field in fields:
                flag = "--" + field.name.replace("_", "-")
                for value in values_for(field, files):
                    cases.append([flag] if value is None else [flag, value])
            for argv in cases:
                outcome, detail = run_case(module.main, argv + ["--log-dir", d])
                rows.append({"algo": algo, "argv": argv, "outcome": outcome, "detail": detail})
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("refused", "accepted", "unclear")}
    print(f"{len(rows)} command lines: {counts['refused']} refused with one line, "
          f"{counts['accepted']} accepted (valid values), {counts['unclear']} unclear")
    for r in rows:
        if r["outcome"] != "refused":
            print(f"  {r['outcome']:8s} {r['algo']:6s} {' '.join(r['argv'])[:60]:60s} "
                  f"{r['detail'][:120]}")
    if args.out:
        from benchmarks.configs import source_commit

        commit = source_commit()
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "counts": counts, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
