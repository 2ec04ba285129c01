"""IMPALA ablation on CartPole-v1: V-Trace vs the uncorrected actor-critic loss on the same
lagged data, for actor_lag in {1, 4, 8}, 8 seeds x 1e6 steps each. Saves JSON, prints a table,
draws the plot from the JSON.

    python benchmarks/impala_ablation.py [--seeds 8] [--lags 1,4,8] [--plot-only]
"""
import argparse
import dataclasses
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.configs import source_commit  # noqa: E402
from benchmarks.plot import smooth  # noqa: E402
from common.host.options import whole_number  # noqa: E402


def run(args):
    from benchmarks.learning import run_cell
    from common.host.logger import final_return

    cells = []
    for lag in map(int, args.lags.split(",")):
        for vt in (True, False):
            config, m, compile_s, train_s = run_cell(
                "impala", "CartPole-v1", args.seeds, args.total_timesteps, actor_lag=lag,
                vtrace=vt)
            final = final_return(m["episodic_return"])
            cell = dict(actor_lag=lag, vtrace=vt, final_return=np.round(final, 2).tolist(),
                        mean=float(final.mean()), min=float(final.min()),
                        collapsed=int((final < 100).sum()),
                        auc=float(np.nanmean(m["episodic_return"])),
                        global_step=m["global_step"][0].tolist(),
                        episodic_return=np.round(m["episodic_return"], 2).tolist(),
                        mean_clipped_rho=float(np.mean(m["mean_clipped_rho"])),
                        rho_clip_fraction=float(np.mean(m["rho_clip_fraction"])),
                        approx_kl=float(np.mean(m["approx_kl"])),
                        train_s=train_s, config=dataclasses.asdict(config))
            cells.append(cell)
            print(f"lag {lag} vtrace {vt!s:5}: final mean {final.mean():6.1f} min "
                  f"{final.min():6.1f} collapsed {cell['collapsed']}/{args.seeds} auc "
                  f"{cell['auc']:6.1f} | clipped rho {cell['mean_clipped_rho']:.3f} clip frac "
                  f"{cell['rho_clip_fraction']:.3f} kl {cell['approx_kl']:.1e} | {train_s:.0f}s",
                  flush=True)
    with open(os.path.join(args.out, "impala_ablation.json"), "w") as f:
        json.dump(dict(command=" ".join(sys.argv), commit=source_commit(), cells=cells), f)


def table(cells):
    print("| actor_lag | loss | final return mean | min | runs < 100 | mean return over training |")
    print("|---|---|---|---|---|---|")
    for c in cells:
        print(f"| {c['actor_lag']} | {'V-Trace' if c['vtrace'] else 'no correction'} | "
              f"{c['mean']:.1f} | {c['min']:.1f} | {c['collapsed']}/{len(c['final_return'])} | "
              f"{c['auc']:.1f} |")


def plot(cells, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({c["actor_lag"] for c in cells})
    fig, axes = plt.subplots(1, len(lags), figsize=(5 * len(lags), 3.6), sharey=True)
    for ax, lag in zip(np.atleast_1d(axes), lags):
        for c in (c for c in cells if c["actor_lag"] == lag):
            x = np.asarray(c["global_step"])
            r = smooth(np.asarray(c["episodic_return"], float), max(1, len(x) // 100))
            color = "C0" if c["vtrace"] else "C3"
            for one in r:
                ax.plot(x, one, color=color, alpha=0.25, lw=0.7)
            label = "V-Trace" if c["vtrace"] else "no correction"
            ax.plot(x, np.nanmean(r, 0), color=color, lw=2,
                    label=f"{label} (final {c['mean']:.0f})")
        ax.set_title(f"CartPole-v1, actor_lag = {lag}, {len(r)} seeds")
        ax.set_xlabel("environment steps")
        ax.legend(loc="lower right")
    np.atleast_1d(axes)[0].set_ylabel("episodic return (smoothed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("saved", path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--lags", default="1,4,8")
    parser.add_argument("--total-timesteps", type=whole_number, default=1_000_000)
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not args.plot_only:
        run(args)
    cells = json.load(open(os.path.join(args.out, "impala_ablation.json")))["cells"]
    table(cells)
    plot(cells, os.path.join(args.out, "impala_ablation.png"))
