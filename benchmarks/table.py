"""The README's learning table, printed from the committed raw results; and their recheck.

    python benchmarks/table.py                 # every result in benchmarks/results{,/gpu}
    python benchmarks/table.py --speed         # the speed tables, from speed*__*.json
    python benchmarks/table.py --recheck --rows 'MaskedCartPole-v1__gru$' [--dry-run]

One row per results file written by `benchmarks/learning.py`: the final return (mean over the
last 10% of updates) as mean +- std over seeds and the worst seed, recomputed from the saved
per-update returns (a file whose curves are thinned to blocks of updates, `updates_per_point`,
gives each seed's final return as its run computed it from every update), beside the return
of a uniformly random policy on that environment
(computed here: 64 environments for 4000 steps), the commit the file records it was measured
on, and the command that reruns it; then, per environment, published figures from other
projects with their sources (`REFERENCES`).

`--recheck` reruns the rows whose name (the results file's, without `.json`: `ppo__CartPole-v1`,
`gpu/ppo__Breakout-MinAtar`) matches `--rows` (a regular expression, searched), one after the
other, each with its table command writing into `--recheck-dir` (default `benchmarks/out/
recheck/`, under the same name; a command-line run, `algos/...`, keeps its log directory
there), never over the committed file. Then it compares each rerun's per-seed final returns
with the committed file's (`compare`): a row has **moved** when Welch's t-test rejects equal
means at `--alpha` (default 0.05, two-sided): t = (mean_new - mean_old) / sqrt(s_old^2/n_old +
s_new^2/n_new) with sample variances, its degrees of freedom Welch-Satterthwaite's. Where
neither run has any spread (every seed of each ending alike, as CartPole's 500), any change of
the mean beyond the files' rounding (`SAME`) has moved. At 0.05 about one row in twenty whose
code did not change is flagged by chance: recheck a flagged row once more before believing it.
Prints a table (committed mean +- std, new mean +- std, the difference, p, verdict), writes
every figure with the command, commit and library versions to `--out` (default
`benchmarks/results/recheck.json`), and exits 1 when a row moved or its command failed.
`--dry-run` prints the commands, one a line, and runs nothing.
"""

import argparse
import contextlib
import dataclasses
import glob
import importlib
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common.host.logger import final_return  # noqa: E402

ENVS = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0",
        "Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar",
        "MaskedCartPole-v1", "MaskedPendulum-v1", "MemoryChain-bsuite",
        "brax/inverted_pendulum", "brax/hopper", "brax/halfcheetah", "brax/ant",
        "playground/CartpoleBalance"]
ALGOS = ["ppo", "a2c", "impala"]

CLEANRL = "CleanRL `docs/rl-algorithms/ppo.md` (3 seeds, 5e5 steps)"
GYMNAX = "gymnax README, PPO, 1 seed, 1e7 steps (gymnax-blines configs)"
MEASURED = "PureJaxRL's `ppo.py` with its MinAtar MLP, measured for this project"
MINATAR = "MinAtar paper (Young & Tian 2019, arXiv:1903.03176) AC(lambda), 5e6 frames, " \
          "30 runs, read off its plot"
# Published figures: (who, figure, source). "~" marks a value read off a plot.
REFERENCES = {
    "CartPole-v1": [("CleanRL PPO", "490.0 ± 6.1", CLEANRL),
                    ("gymnax PPO", "500", "gymnax README (1 seed, 1.5e5 steps)")],
    "Acrobot-v1": [("CleanRL PPO", "−86.4 ± 1.3", CLEANRL),
                   ("gymnax PPO", "−80", "gymnax README (1 seed, 5e5 steps)")],
    "Pendulum-v1": [("CleanRL PPO / RPO", "−1142.0 ± 135.6 / −151.1 ± 3.7",
                     "CleanRL `docs/rl-algorithms/rpo.md` (Gymnasium, 10 seeds, 8e6 steps)"),
                    ("gymnax ES", "−130", "gymnax README (evolution strategies, ~4e7 steps)")],
    "MountainCarContinuous-v0": [("gymnax ES", "92", "gymnax README (evolution strategies, "
                                  "~8e8 steps; its PPO log ends at −0.1)")],
    "Breakout-MinAtar": [("gymnax PPO", "28", GYMNAX + "; its stored log ends at 22.9"),
                         ("PureJaxRL PPO (MLP)", "≈26 at 1e6 steps", MEASURED),
                         ("PureJaxRL PPO", "~40", "PureJaxRL `docs/minatar_plot_seconds.png`, "
                          "budget not stated"),
                         ("AC(λ)", "~17.5", MINATAR)],
    "SpaceInvaders-MinAtar": [("gymnax PPO", "131", GYMNAX),
                              ("PureJaxRL PPO (MLP)", "≈78 at 1e6 steps", MEASURED),
                              ("PureJaxRL PPO (MLP)", "~170", "PureJaxRL "
                               "`examples/brax_minatar.ipynb`, 1 seed, 1e7 steps"),
                              ("AC(λ)", "~185", MINATAR)],
    "Asterix-MinAtar": [("gymnax PPO", "15", GYMNAX), ("AC(λ)", "~19", MINATAR)],
    "Freeway-MinAtar": [("gymnax PPO", "58", GYMNAX), ("AC(λ)", "~47.5", MINATAR)],
    "brax/inverted_pendulum": [("the maximum", "1000", "Brax `inverted_pendulum`: reward 1 "
                                "per step, episodes of at most 1000 steps")],
    "playground/CartpoleBalance": [
        ("Playground PPO", "~950", "MuJoCo Playground's training plots (2048 envs, 6e7 steps), "
         "as read by SLM-Lab `docs/BENCHMARKS.md`; the paper's own figure not checked here"),
        ("the maximum", "1000", "the Control Suite's rewards, at most 1 per step, episodes "
         "of 1000 steps")],
}


def random_return(env_id: str, num_envs: int = 64, num_steps: int = 4000) -> float:
    """Mean return of the episodes a uniformly random policy finishes (actions uniform over
    the discrete set or the box)."""
    import jax

    from common.envs import make_env
    from common.rollout import finished_episode_stats, reset, rollout

    env, env_params, spec = make_env(env_id)

    def policy(key, obs, first, hidden):
        if spec.discrete:
            return jax.random.randint(key, obs.shape[:1], 0, spec.action_dim), None, hidden
        return jax.random.uniform(key, obs.shape[:1] + (spec.action_dim,),
                                  minval=np.array(spec.action_low),
                                  maxval=np.array(spec.action_high)), None, hidden

    @jax.jit
    def run(key):
        key_reset, key_rollout = jax.random.split(key)
        state = reset(env, env_params, key_reset, num_envs)
        _, traj = rollout(env, env_params, spec, policy, state, key_rollout, num_steps)
        ret_sum, _, _, count = finished_episode_stats(traj)
        return ret_sum / count

    return float(run(jax.random.PRNGKey(0)))


def final_returns(record: dict) -> np.ndarray:
    """Each seed's final return in a results file (as its run computed it from every update,
    where the saved curves are thinned)."""
    return (np.asarray(record["final_return"], float) if "updates_per_point" in record
            else final_return(np.asarray(record["episodic_return"], float)))


def row_name(path: str) -> str:
    """A results file's row name: its file name without `.json`, after `gpu/` for a GPU row."""
    name = os.path.basename(path)[:-len(".json")]
    return f"gpu/{name}" if os.sep + "gpu" + os.sep in path else name


def describe(path):
    record = json.load(open(path))
    if "episodic_return" not in record:
        return None  # a speed or scaling file
    name = os.path.basename(path)[:-len(".json")]
    algo, _, *tag = name.split("__")
    config = record["config"]
    env_id = config["env_id"]  # the file name has `brax-hopper` for `brax/hopper`
    network = config.get("network", "auto")
    core = next((c for c in ("gru", "lstm") if network.endswith(c)), None)
    torso = "auto" if network == core else network.split("-")[0]
    cnn = torso == "cnn" or (torso == "auto" and env_id.endswith("MinAtar"))
    final = final_returns(record)
    return dict(algo=algo, env_id=env_id, tag=tag[0] if tag else "", name=row_name(path),
                path=path, commit=record.get("commit", "unknown"), final=final,
                where="GPU" if os.sep + "gpu" + os.sep in path else "CPU",
                network=("CNN" if cnn else "MLP") + (f"-{core.upper()}" if core else ""),
                steps=record["global_step"][-1],
                seeds=len(final), mean=final.mean(), std=final.std(), worst=final.min(),
                command=command(record, tag[0] if tag else ""))


RENAMED = {"rmsprop_alpha": "rms_decay", "eps": "opt_eps", "rms_eps": "opt_eps"}
"""Config fields that some results files record under another name: A2C's `rmsprop_alpha` and
`eps`, IMPALA's `rms_eps`."""


def ran_config(record: dict) -> dict:
    """The Config a results file records, under the Config's field names. (IMPALA's
    `rms_eps` was RMSprop's epsilon only; its Adam ran with eps 1e-5.)"""
    config = dict(record["config"])
    if "rms_eps" in config and config.get("optimizer") == "adam":
        config["rms_eps"] = 1e-5
    return {RENAMED.get(k, k): v for k, v in config.items()}


def command(record: dict, tag: str = "") -> str:
    """The command that trains the config a results file records, into the same file (`tag`:
    the part of its name after the environment): its recorded command line, without its
    output directory, with a `--set` for every field whose value the presets
    (`common/presets.py`) and variants no longer give, so that it reproduces the row after
    the presets are retuned."""
    from benchmarks.learning import cell_config

    words = record["command"].split()
    if words[0] != "benchmarks/learning.py":  # a command-line run (`accelerator.py run brax`)
        return " ".join(["python", *words, *retuned_flags(record, words)])
    args, overrides, budget = read_command(words[1:])
    ran = ran_config(record)
    overrides = {k: ran[k] for k in overrides}
    now = as_json(cell_config(args.algo, args.env_id, budget, args.variant, **overrides))
    differ = [k for k in now if k in ran and k != "total_timesteps" and ran[k] != now[k]]
    budget = ran["total_timesteps"] if now["total_timesteps"] != ran["total_timesteps"] \
        else budget
    out = ["python", words[0], "--algo", args.algo, "--env-id", args.env_id,
           "--seeds", str(args.seeds)]
    out += ["--total-timesteps", str(budget)] if budget is not None else []
    out += ["--variant", args.variant] if args.variant else []
    sets = [f"{k}={_short(ran[k])}" for k in [*overrides, *differ]]
    out += ["--set", *sets] if sets else []
    out += ["--tag", tag] if tag != args.variant else []
    return " ".join(out)


def retuned_flags(record: dict, words: list) -> list:
    """The flags that a command-line run's recorded command (`words`: `algos/<algo>.py`, then
    its flags) needs so that it builds the config the file records with the presets of today:
    `--field value` (`--field` / `--no-field` for a switch) for every field it sets otherwise."""
    from common.host import flags

    if not words[0].startswith("algos/"):
        return []  # another script's command (a sweep's)
    algo = os.path.basename(words[0])[:-len(".py")]
    with contextlib.redirect_stdout(io.StringIO()):  # the preset's line
        config = flags.parse(algo, importlib.import_module(f"algos.{algo}").Config,
                             words[1:]).config
    ran, out = ran_config(record), []
    for name, value in as_json(config).items():
        if name in ran and ran[name] != value:
            flag = name.replace("_", "-")
            out += ([f"--{flag}" if ran[name] else f"--no-{flag}"] if isinstance(value, bool)
                    else [f"--{flag}", _short(ran[name])])
    return out


def read_command(words: list):
    """`(args, overrides, budget)` of a `learning.py` command line (`words` after the script):
    its parsed arguments, its `--set` fields under today's names (`RENAMED`) and its step
    budget (`--total-timesteps` or `--set total_timesteps=N`; None: the preset's)."""
    from benchmarks.configs import parse_overrides
    from benchmarks.learning import make_parser

    args = make_parser().parse_args(words)
    overrides = {RENAMED.get(k, k): v for k, v in parse_overrides(args.set).items()}
    return args, overrides, args.total_timesteps or overrides.pop("total_timesteps", None)


def as_json(config) -> dict:
    """A Config's fields as a results file records them (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _short(value) -> str:
    """A value as `--set` reads it, floats in their shortest exact form (7e-4, not 0.0007)."""
    if not isinstance(value, float):
        return str(value)
    mantissa, exponent = f"{value:e}".split("e")
    scientific = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return min((repr(value), scientific) if float(scientific) == value else (repr(value),),
               key=len)


def speed_tables(files):
    """Markdown tables of `benchmarks/speed.py` results: one for seed sweeps, one for
    num_envs sweeps (a column per num_envs)."""
    seeds_rows, env_rows = [], {}
    for path in files:
        record = json.load(open(path))
        name = os.path.basename(path)[:-len(".json")].split("__")
        if not name[0].startswith("speed") or "rows" not in record:
            continue
        algo, env_id = name[1], name[2]
        network = "MLP" if len(name) > 3 or not env_id.endswith("MinAtar") else "CNN"
        label = f"{'IMPALA' if algo == 'impala' else algo.upper()} | {env_id} | {network}"
        commit = record.get("commit", "unknown")
        if record.get("sweep") == "num_envs":
            env_rows[label] = ({r["num_envs"]: r["sps"] for r in record["rows"]}, commit)
        else:
            seeds_rows += [(label, r, commit) for r in record["rows"]]
    print("| algorithm | environment | network | seeds | steps per seed | compile (s) | "
          "SPS, all seeds | SPS per seed | peak RSS (MiB) | commit |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for label, r, commit in seeds_rows:
        print(f"| {label} | {r['seeds']} | {r['steps'] // r['seeds']:,} | {r['compile_s']:.1f} | "
              f"{r['sps'] / 1e3:,.0f}k | {r['sps'] / r['seeds'] / 1e3:,.1f}k | "
              f"{r['peak_rss_mib']:,.0f} | {commit} |")
    sizes = sorted({n for row, _ in env_rows.values() for n in row})
    if sizes:
        print("\n| algorithm | environment | network | " + " | ".join(
            f"{n} envs" for n in sizes) + " | commit |\n|---|---|---|" + "---|" * (len(sizes) + 1))
        for label, (row, commit) in env_rows.items():
            print(f"| {label} | " + " | ".join(
                f"{row[n] / 1e3:,.0f}k" if n in row else "" for n in sizes) + f" | {commit} |")


ALPHA = 0.05
"""The recheck's significance level: a row has moved when Welch's test gives p below it."""
SAME = 1e-3
"""Means closer than this are equal where neither run has any spread (the results files keep
each seed's final return to 4 decimals)."""


def compare(committed, new, alpha: float = ALPHA) -> dict:
    """Has a row moved? Welch's t-test of equal means on two runs' per-seed final returns
    (NaNs, seeds that finished no episode, left out): t = (mean_new - mean_old) / se with
    se = sqrt(s_old^2/n_old + s_new^2/n_new) (sample variances), Welch-Satterthwaite's
    degrees of freedom, p two-sided. Where se is 0 (no spread in either run), p is 1 for means
    within `SAME` and 0 otherwise. Returns the figures and `verdict`: "moved" (p < alpha),
    "within spread", or "too few seeds" (under 2 in a run)."""
    from scipy import stats

    old, new = (np.asarray(x, float)[np.isfinite(x)] for x in (committed, new))
    out = {"n_old": len(old), "n_new": len(new)}
    if len(old) < 2 or len(new) < 2:
        return {**out, "verdict": "too few seeds"}
    diff = new.mean() - old.mean()
    var_old, var_new = old.var(ddof=1) / len(old), new.var(ddof=1) / len(new)
    se = np.sqrt(var_old + var_new)
    if se == 0:
        t, df, p = (0.0 if abs(diff) <= SAME else np.copysign(np.inf, diff)), np.nan, \
            float(abs(diff) <= SAME)
    else:
        t = diff / se
        df = se**4 / (var_old**2 / (len(old) - 1) + var_new**2 / (len(new) - 1))
        p = 2 * stats.t.sf(abs(t), df)
    return {**out, "diff": float(diff), "se": float(se), "t": float(t), "df": float(df),
            "p": float(p), "verdict": "moved" if p < alpha else "within spread"}


def recheck_argv(row: dict, recheck_dir: str) -> tuple:
    """`(argv, output)`: the row's table command writing into `recheck_dir` instead (a
    `gpu/` row into its `gpu/`), and what it writes there: the results file of a
    `learning.py` command, the log directory of a command-line run (`algos/...`)."""
    folder = os.path.join(recheck_dir, os.path.dirname(row["name"])).rstrip(os.sep)
    argv = row["command"].split()
    if argv[1] == "benchmarks/learning.py":
        return argv + ["--out-dir", folder], os.path.join(folder, os.path.basename(row["path"]))
    log_dir = os.path.join(folder, os.path.basename(row["name"]))
    return argv + ["--log-dir", log_dir], log_dir


def rerun_finals(output: str) -> np.ndarray:
    """Each seed's final return of a rerun: from its results file, or from the last
    checkpoint in a command-line run's log directory."""
    if output.endswith(".json"):
        return final_returns(json.load(open(output)))
    from common.host import checkpoint

    paths = [os.path.join(d, checkpoint.LATEST) for d, _, names in os.walk(output)
             if checkpoint.LATEST in names]
    if not paths:
        raise FileNotFoundError(f"no {checkpoint.LATEST} under {output}")
    latest = checkpoint.load(max(paths, key=os.path.getmtime))  # this rerun's, not an older
    return final_return(np.asarray(latest["metrics"]["episodic_return"], np.float64))


def shown(path: str) -> str:
    """A path as a command shows it: relative to the checkout where it is inside it."""
    relative = os.path.relpath(path, ROOT)
    return path if relative.startswith("..") else relative


def recheck(parser, rows: list, args) -> int:
    """`--recheck`: rerun each row, compare, print the table and write the record; 1 when a
    row moved or its command failed."""
    from benchmarks.configs import library_versions, out_file, source_commit

    commands = [recheck_argv(r, shown(args.recheck_dir)) for r in rows]
    if args.dry_run:
        for row, (argv, _) in zip(rows, commands):
            print(" ".join(argv), f" # {row['name']}")
        return 0
    out_file(parser, args.out)
    results = []
    for row, (argv, output) in zip(rows, commands):
        print(f"=== {row['name']}: {' '.join(argv)}", flush=True)
        start = time.perf_counter()
        status = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT).returncode
        entry = {"row": row["name"], "command": " ".join(argv), "seconds":
                 round(time.perf_counter() - start, 1), "output": output,
                 "committed": {"commit": row["commit"], "final_return": row["final"].tolist()}}
        try:
            if status:
                raise RuntimeError(f"exit {status}")
            new = rerun_finals(os.path.join(ROOT, output))
        except (OSError, RuntimeError, ValueError) as error:  # recorded; the others go on
            entry["verdict"] = f"failed ({error})"
        else:
            entry.update(new={"final_return": np.round(new, 4).tolist()},
                         **compare(row["final"], new, args.alpha))
        results.append(entry)
    print("\n| row | committed (commit), mean ± std | rerun, mean ± std | difference | p | "
          "verdict |\n|---|---|---|---|---|---|")
    for row, entry in zip(rows, results):
        new = np.asarray(entry.get("new", {}).get("final_return", [np.nan]))
        print(f"| {row['name']} | {row['mean']:.1f} ± {row['std']:.1f} ({row['commit']}) | "
              f"{np.nanmean(new):.1f} ± {np.nanstd(new):.1f} | {entry.get('diff', np.nan):+.1f} | "
              f"{entry.get('p', np.nan):.3g} | {entry['verdict']} |")
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
                   "commit": source_commit(), "versions": library_versions(),
                   "rule": f"Welch's t-test on per-seed final returns, moved at p < {args.alpha}",
                   "alpha": args.alpha, "rows": results}, f, indent=1)
    print(f"saved {shown(args.out)}")
    return int(any(e["verdict"] != "within spread" for e in results))


RECHECK_ONLY = ("rows", "dry_run", "alpha", "recheck_dir", "out")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--speed", action="store_true", help="print the speed tables")
    parser.add_argument("--recheck", action="store_true",
                        help="rerun the rows of --rows and flag those that moved")
    parser.add_argument("--rows", default=".", metavar="REGEX",
                        help="--recheck: the rows whose name this matches (default: all)")
    parser.add_argument("--dry-run", action="store_true",
                        help="--recheck: print the commands, run nothing")
    parser.add_argument("--alpha", type=float, default=ALPHA,
                        help="--recheck: moved at p below this (default 0.05)")
    parser.add_argument("--recheck-dir", default=os.path.join(ROOT, "benchmarks", "out",
                                                              "recheck"),
                        help="--recheck: where the reruns write (default benchmarks/out/recheck)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "recheck.json"),
                        help="--recheck: the record (default benchmarks/results/recheck.json)")
    args = parser.parse_args()
    defaults = parser.parse_args([])
    given = [name for name in RECHECK_ONLY if getattr(args, name) != getattr(defaults, name)]
    if given and not args.recheck:
        parser.error(f"--{given[0].replace('_', '-')} applies only with --recheck")
    if args.speed and args.recheck:
        parser.error("--speed prints the speed tables; --recheck reruns learning rows: pick one")
    if args.speed:
        return speed_tables(args.files or sorted(glob.glob(
            os.path.join(ROOT, "benchmarks", "results", "speed*__*.json"))))
    files = args.files or sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json"))
                                 + glob.glob(os.path.join(ROOT, "benchmarks", "results", "gpu",
                                                          "*.json")))
    if args.recheck:
        try:
            pattern = re.compile(args.rows)
        except re.error as error:
            parser.error(f"--rows {args.rows!r} is not a regular expression: {error}")
        files = [f for f in files if pattern.search(row_name(f))]
    rows = [r for r in map(describe, files) if r is not None and r["algo"] in ALGOS]
    rows.sort(key=lambda r: (ALGOS.index(r["algo"]), ENVS.index(r["env_id"]), r["where"],
                             r["tag"]))
    if args.recheck:
        if not rows:
            parser.error(f"--rows {args.rows!r} matches no row of the table")
        return recheck(parser, rows, args)
    random = {env_id: random_return(env_id) for env_id in {r["env_id"] for r in rows}}
    print("| algorithm | environment | network, machine, variant | steps | seeds | "
          "random policy | final return, mean ± std | worst seed | commit | command |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        what = ", ".join(x for x in (r["network"], r["where"], r["tag"]) if x)
        print(f"| {r['algo'].upper() if r['algo'] != 'impala' else 'IMPALA'} | {r['env_id']} | "
              f"{what} | {r['steps']:.1e} | {r['seeds']} | {random[r['env_id']]:.1f} | "
              f"{r['mean']:.1f} ± {r['std']:.1f} | {r['worst']:.1f} | {r['commit']} | "
              f"`{r['command']}` |".replace("e+0", "e"))
    print("\n| environment | published | figure | source |\n|---|---|---|---|")
    for env_id in ENVS:
        for who, figure, source in REFERENCES.get(env_id, []):
            print(f"| {env_id} | {who} | {figure} | {source} |")


if __name__ == "__main__":
    sys.exit(main())
