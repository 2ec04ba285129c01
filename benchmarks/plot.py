"""Learning curves from saved benchmark results: mean and 95% band over seeds.

    python benchmarks/plot.py benchmarks/results/ppo__CartPole-v1.json ... --out curves.png

One panel per environment; each JSON file written by `benchmarks/learning.py` becomes one
line on its environment's panel (other files are skipped): episodic return per saved point (an
update, or a block of `updates_per_point` updates in a long run), smoothed with a NaN-aware
moving mean over a fiftieth of the points (points that finished no episode are NaN), then the
mean over seeds and mean +- 1.96 standard errors, against environment steps.
Needs matplotlib (`pip install -e ".[bench]"`).
"""

import argparse
import json
import os

import numpy as np


def smooth(returns, window):
    """Moving mean over the last axis that skips NaNs."""
    ok = np.isfinite(returns)
    kernel = np.ones(window)
    conv = lambda x: np.convolve(x, kernel, "same")  # noqa: E731
    total = np.apply_along_axis(conv, -1, np.where(ok, returns, 0.0))
    count = np.apply_along_axis(conv, -1, ok.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cols", type=int, default=3)
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
