"""Learning curves from saved benchmark results: mean and 95% band over seeds; or a PBT run's
population and hyperparameter schedules.

    python benchmarks/plot.py benchmarks/results/ppo__CartPole-v1.json ... --out curves.png
    python benchmarks/plot.py --pbt runs/CartPole-v1__ppo__1__1700000000 --out pbt.png

One panel per environment; each JSON file written by `benchmarks/learning.py` becomes one
line on its environment's panel (other files are skipped): episodic return per saved point (an
update, or a block of `updates_per_point` updates in a long run), smoothed with a NaN-aware
moving mean over a fiftieth of the points (points that finished no episode are NaN), then the
mean over seeds and mean +- 1.96 standard errors, against environment steps.

`--pbt RUN_DIR`: a command-line PBT run's directory (`--pbt-population`, docs/pbt.md). The
first panel is each member's episodic return per update (smoothed as above) from the
checkpoint's metrics (`latest.msgpack`; without one, each interval's score from the lineage),
a dot where a member took another's state; then one panel per searched hyperparameter, each
member's value against environment steps (a log axis for a log-scaled range), from
`pbt_lineage.json`.
Needs matplotlib (`pip install -e ".[bench]"`).
"""

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smooth(returns, window):
    """Moving mean over the last axis that skips NaNs."""
    ok = np.isfinite(returns)
    kernel = np.ones(window)
    conv = lambda x: np.convolve(x, kernel, "same")  # noqa: E731
    total = np.apply_along_axis(conv, -1, np.where(ok, returns, 0.0))
    count = np.apply_along_axis(conv, -1, ok.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def pbt_curves(run_dir: str) -> dict:
    """What `--pbt` draws of the PBT run in `run_dir`: `steps` [U] and `returns` [N, U] (per
    update, from the checkpoint; per interval, the lineage's scores, without one),
    `copies` (member, global step) of each copy, and per searched hyperparameter `hparams`
    `(steps [2I], values [N, 2I], log)`: each member's value from the start of each interval
    to its end, a step function."""
    with open(os.path.join(run_dir, "pbt_lineage.json")) as f:
        lineage = json.load(f)
    steps_per_interval = lineage["interval"] * lineage["batch_size"]
    scores = np.array([[np.nan if m["score"] is None else m["score"] for m in step["members"]]
                       for step in lineage["steps"]], float).T
    steps = steps_per_interval * np.arange(1, scores.shape[1] + 1)
    path = os.path.join(run_dir, "latest.msgpack")
    if os.path.isfile(path):
        sys.path.insert(0, ROOT)
        from common.host import checkpoint

        metrics = checkpoint.load(path)["metrics"]
        steps, returns = metrics["global_step"][0], metrics["episodic_return"]
    else:
        returns = scores
    copies = [(m["member"], step["global_step"]) for step in lineage["steps"]
              for m in step["members"] if m["source"] != m["member"]]
    hparams = {}
    for r in lineage["search"]:
        values = [[m["hparams"][r["name"]] for m in lineage["initial"]]] + [
            [m["hparams"][r["name"]] for m in step["members"]] for step in lineage["steps"]]
        values = np.array(values[:len(lineage["steps"])]).T  # those each interval used
        ends = steps_per_interval * np.arange(values.shape[1] + 1)
        hparams[r["name"]] = (np.repeat(ends, 2)[1:-1], np.repeat(values, 2, axis=1), r["log"])
    return dict(steps=np.asarray(steps), returns=np.asarray(returns, float), copies=copies,
                hparams=hparams, title=f"PBT: {lineage['algo'].upper()} on "
                                       f"{lineage['env_id']}, {lineage['population']} members")


def plot_pbt(run_dir: str, out: str, cols: int, plt):
    """Draw `pbt_curves(run_dir)`: the returns, then one panel per hyperparameter."""
    curves = pbt_curves(run_dir)
    panels = 1 + len(curves["hparams"])
    cols = min(cols, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.3 * rows), squeeze=False)
    ax = axes.flat[0]
    x, returns = curves["steps"], curves["returns"]
    smoothed = smooth(returns, max(1, len(x) // 50))
    for i, curve in enumerate(smoothed):
        ok = np.isfinite(curve)
        ax.plot(x[ok], curve[ok], lw=1.2, color=f"C{i % 10}", label=f"member {i}")
    for member, step in curves["copies"]:
        at = np.searchsorted(x, step)
        if at < len(x) and np.isfinite(smoothed[member, at]):
            ax.plot(x[at], smoothed[member, at], "o", ms=3, color=f"C{member % 10}")
    ax.set_ylabel("episodic return (dots: copied)")
    for ax, (name, (steps, values, log)) in zip(axes.flat[1:], curves["hparams"].items()):
        for i, line in enumerate(values):
            ax.plot(steps, line, lw=1.2, color=f"C{i % 10}")
        ax.set_yscale("log" if log else "linear")
        ax.set_ylabel(name)
    for ax in axes.flat[:panels]:
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=6.5)
    axes.flat[0].set_title(curves["title"], fontsize=10)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print("saved", out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cols", type=int, default=3)
    parser.add_argument("--pbt", metavar="RUN_DIR",
                        help="a PBT run's directory: its population and hyperparameters")
    args = parser.parse_args()
    if not args.files and not args.pbt:
        parser.error("give results files, or --pbt RUN_DIR")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.pbt:
        return plot_pbt(args.pbt, args.out, args.cols, plt)

    # One panel per environment, one line per results file (algorithm and variant).
    panels = {}
    for path in args.files:
        record = json.load(open(path))
        if "episodic_return" not in record:
            continue  # a speed or scaling result
        panels.setdefault(record["config"]["env_id"], []).append((path, record))
    cols = min(args.cols, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.3 * rows), squeeze=False)
    order = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"]
    panels = dict(sorted(panels.items(), key=lambda kv: (kv[0] not in order,
                                                         order.index(kv[0]) if kv[0] in order
                                                         else kv[0])))
    colors = {"ppo": "C0", "a2c": "C1", "impala": "C2"}  # one colour per algorithm
    for ax, (env_id, records) in zip(axes.flat, panels.items()):
        styles = {}
        for path, record in sorted(records):
            x = np.asarray(record["global_step"])
            returns = np.asarray(record["episodic_return"], float)
            curves = smooth(returns, max(1, len(x) // 50))
            mean = np.nanmean(curves, axis=0)
            band = 1.96 * np.nanstd(curves, axis=0) / np.sqrt(len(curves))
            name = os.path.basename(path)[:-5].split("__")
            label = name[0].upper() + (f" {name[2]}" if len(name) > 2 else "") \
                + (" (GPU)" if os.sep + "gpu" + os.sep in path else "")
            # variants of one algorithm on one panel: the same colour, another line style
            dashes = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]
            style = dashes[(styles.setdefault(name[0], -1) + 1) % len(dashes)]
            styles[name[0]] += 1
            ok = np.isfinite(mean)  # skip windows in which no seed finished an episode
            color = colors.get(name[0], "C3")
            ax.plot(x[ok], mean[ok], linestyle=style, lw=1.5, color=color,
                    label=f"{label}, {len(curves)} seeds")
            ax.fill_between(x[ok], (mean - band)[ok], (mean + band)[ok], color=color,
                            alpha=0.2)
        ax.set_title(env_id, fontsize=10)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episodic return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print("saved", args.out)


if __name__ == "__main__":
    main()
