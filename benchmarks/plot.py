"""Learning curves from saved benchmark results: mean and 95% band over seeds.

    python benchmarks/plot.py benchmarks/results/ppo__CartPole-v1.json ... --out curves.png

Each JSON file (written by `benchmarks/learning.py`) becomes one panel: episodic return per
update, smoothed with a NaN-aware moving mean (updates that finished no episode are NaN),
then the mean over seeds and mean +- 1.96 standard errors, against environment steps.
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

    cols = min(args.cols, len(args.files))
    rows = -(-len(args.files) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.3 * rows), squeeze=False)
    for ax, path in zip(axes.flat, args.files):
        record = json.load(open(path))
        x = np.asarray(record["global_step"])
        returns = np.asarray(record["episodic_return"], float)
        curves = smooth(returns, max(1, len(x) // 50))
        mean = np.nanmean(curves, axis=0)
        band = 1.96 * np.nanstd(curves, axis=0) / np.sqrt(len(curves))
        config = record["config"]
        ax.plot(x, mean, lw=1.8)
        ax.fill_between(x, mean - band, mean + band, alpha=0.3)
        name = os.path.basename(path)[:-5].split("__")
        ax.set_title(f"{name[0].upper()} {config['env_id']} ({len(curves)} seeds)"
                     + (f"\n{name[2]}" if len(name) > 2 else ""), fontsize=9)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episodic return")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(args.files):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print("saved", args.out)


if __name__ == "__main__":
    main()
