"""Population-based training from the command line (`common/host/pbt.py`), through PPO's CLI
in this process.

One tiny run (PPO's `helpers.TINY_RUNS` config on CartPole: 16 updates of 128 steps, a
population of 4, a PBT step after every update, a checkpoint and an evaluation every 8: chunks
of two intervals, 8 chunks) is trained once uninterrupted; the run stopped by Ctrl-C after its
second chunk and resumed must end with the same bits, lineage included. The same population from the Python API
(`common/pbt.py`'s `init` and `run_intervals` over all intervals in one call) gives the
numbers the lineage file and TensorBoard must hold. The bad input: `tests/test_bad_input.py`'s
catalogue.
"""

import contextlib
import glob
import io
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from algos.ppo import Config, main, make_train
from common import pbt
from common.host import checkpoint, flags, logger
from common.host import pbt as population
from helpers import TINY_RUNS, record_progress
from test_checkpoint import tensorboard_files

ARGS = ["--env-id", "CartPole-v1", "--no-presets", *[
    a for k, v in TINY_RUNS["ppo"].items() for a in (flags.flag_of(k), str(v))],
    "--pbt-population", "4", "--pbt-interval", "1",
    "--pbt-search", "learning_rate=1e-4:1e-2:log", "ent_coef=0:0.02",
    "--checkpoint-every", "8", "--eval-every", "8", "--eval-episodes", "4",
    "--num-devices", "1"]  # bitwise comparisons need one layout
SEARCHED = ("learning_rate", "ent_coef")
STEPS = 128  # environment steps per update, and per interval


def run_cli(argv):
    """`main(argv)` with its stdout captured: `(metrics or SystemExit code, stdout)`."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            result = main(argv)
        except SystemExit as exit_:
            result = exit_.code
    return result, out.getvalue()


def run_files(log_dir) -> dict:
    """The run directory's checkpoint record and lineage JSON."""
    (path,) = glob.glob(os.path.join(str(log_dir), "*", checkpoint.LATEST))
    with open(os.path.join(os.path.dirname(path), population.LINEAGE)) as f:
        lineage = json.load(f)
    return dict(path=path, record=checkpoint.load(path), lineage=lineage)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, and the same population from the Python API."""
    log_dir = tmp_path_factory.mktemp("pbt")
    metrics, out = run_cli(ARGS + ["--log-dir", str(log_dir)])
    config, run, _ = flags.parse("ppo", Config, ARGS)
    pbt_train = pbt.make_pbt_train(make_train(config), config.num_updates,
                                   population.space_of(run))
    start = jax.jit(pbt_train.init)(jnp.asarray(logger.seed_keys(run.seed, 1)[0]))
    api = jax.device_get((start.hparams, *jax.jit(pbt_train.run_intervals)(
        start, jnp.arange(16))))
    return dict(metrics=metrics, out=out, log_dir=log_dir, api=api, **run_files(log_dir))


def test_interrupted_by_ctrl_c_and_resumed_ends_with_the_same_bits(reference, tmp_path,
                                                                   monkeypatch):
    record_progress(monkeypatch, interrupt_after=3)  # the step-0 report, then one per chunk
    code, out = run_cli(ARGS + ["--log-dir", str(tmp_path)])
    assert code == 130, out
    stopped = run_files(tmp_path)
    assert stopped["record"]["update"] == 4 and len(stopped["lineage"]["steps"]) == 4
    assert f"interrupted at update 4 of 16; checkpoint: {stopped['path']}" in out
    monkeypatch.undo()
    metrics, out = run_cli(["--resume", stopped["path"]])  # the rest from the checkpoint
    assert isinstance(metrics, dict), out
    resumed, ref = run_files(tmp_path), reference
    for name in ref["metrics"]:
        np.testing.assert_array_equal(metrics[name], ref["metrics"][name], err_msg=name)
        np.testing.assert_array_equal(resumed["record"]["metrics"][name],
                                      ref["metrics"][name], err_msg=name)
    ours = jax.tree_util.tree_flatten_with_path(resumed["record"]["train_state"])[0]
    theirs = jax.tree.leaves(ref["record"]["train_state"])
    assert len(ours) == len(theirs) and ours  # states, hparams and the PBT key
    for (where, a), b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(where))
    jax.tree.map(np.testing.assert_array_equal, resumed["record"]["pbt"],
                 ref["record"]["pbt"])
    for key in ("initial", "steps", "search", "fixed_hparams"):
        assert resumed["lineage"][key] == ref["lineage"][key], key


def test_the_lineage_file_holds_the_python_apis_lineage_and_metrics(reference):
    """The command line's population is the Python API's, bit for bit; the lineage file
    holds its `Lineage` arrays, and the metrics each member's hyperparameters per update."""
    initial, final, api_metrics, lineage = reference["api"]
    metrics, record, written = reference["metrics"], reference["record"], reference["lineage"]
    for name, column in api_metrics.items():
        np.testing.assert_array_equal(metrics[name], column, err_msg=name)
    saved = jax.tree.leaves(record["train_state"])  # a state dict: in the order of its keys
    assert len(saved) == len(jax.tree.leaves(final))
    for a, b in zip(saved, jax.tree.leaves(serialization.to_state_dict(final))):
        np.testing.assert_array_equal(a, b)
    assert written["population"] == 4 and written["interval"] == 1
    assert [r["name"] for r in written["search"]] == list(SEARCHED)
    assert written["fixed_hparams"]["vf_coef"] == 0.5 and "ent_coef" not in \
        written["fixed_hparams"]
    assert [m["hparams"] for m in written["initial"]] == [
        {n: float(getattr(initial, n)[m]) for n in SEARCHED} for m in range(4)]
    assert len(written["steps"]) == 16
    for k, step in enumerate(written["steps"]):
        assert (step["interval"], step["update"], step["global_step"]) == \
            (k, k + 1, (k + 1) * STEPS)
        assert [m["member"] for m in step["members"]] == [0, 1, 2, 3]
        assert [m["source"] for m in step["members"]] == lineage.source[k].tolist()
        assert [m["score"] for m in step["members"]] == [
            None if np.isnan(x) else float(x) for x in lineage.score[k]]
        for n in SEARCHED:
            assert [m["hparams"][n] for m in step["members"]] == \
                getattr(lineage.hparams, n)[k].tolist()
    assert (lineage.source[:15] != np.arange(4)).any(axis=1).all()  # a copy at every step
    assert np.isnan(lineage.score).any()  # an update in which no episode ended: null
    # each update's value: the initial one, then those after each step
    for n in SEARCHED:
        used = np.concatenate([getattr(initial, n)[None], getattr(lineage.hparams, n)[:-1]])
        np.testing.assert_array_equal(metrics[f"pbt/{n}"], used.T)


def test_tensorboard_has_each_members_hyperparameters_beside_its_returns(reference):
    metrics = reference["metrics"]
    run_dir = os.path.dirname(reference["path"])
    assert reference["lineage"]["tensorboard_runs"] == [
        f"{os.path.basename(run_dir)}/member{i}" for i in range(4)]
    for member in range(4):
        (events,) = tensorboard_files(os.path.join(run_dir, f"member{member}"))
        logged = {}
        for e in events:
            for v in e.summary.value:
                logged.setdefault(v.tag, []).append((e.step, v.simple_value))
        assert {"charts/episodic_return", "losses/policy_loss", "pbt/learning_rate",
                "pbt/ent_coef"} <= logged.keys(), sorted(logged)
        for n in SEARCHED:
            np.testing.assert_array_equal(
                [x for _, x in logged[f"pbt/{n}"]], metrics[f"pbt/{n}"][member])
            assert [s for s, _ in logged[f"pbt/{n}"]] == list(STEPS * np.arange(1, 17))
        evaluated = np.flatnonzero(np.isfinite(metrics["eval_return"][member]))
        assert [s for s, _ in logged.get("eval/episodic_return", [])] == \
            list(STEPS * (evaluated + 1))


def test_the_best_member_is_evaluated_and_named_in_the_last_line(reference):
    _, _, _, lineage = reference["api"]
    out, metrics = reference["out"], reference["metrics"]
    assert "PBT: 4 members, a step every 1 updates (16 intervals; the 1 worst take the state " \
           "of the 1 best, perturb 0.2, resample 0), searching learning_rate in [0.0001, " \
           "0.01] (log), ent_coef in [0, 0.02]; chunks of 2 interval(s)" in out, out
    best = []
    for k, update in ((7, 8), (15, 16)):  # the member ranked first by the interval's score
        score = lineage.score[k]  # NaN last, then higher first, ties the lower index
        first = sorted(range(4), key=lambda i: (np.isnan(score[i]), -score[i], i))[0]
        best.append(first)
        assert f"eval at update {update}: the best member, {first} (return " \
               f"{lineage.score[k][first]:.2f} over the last interval; learning_rate=" in out
    evaluated = np.isfinite(metrics["eval_return"])
    assert evaluated.sum() == 2 and evaluated[best[0], 7] and evaluated[best[1], 15]
    hp = {n: getattr(lineage.hparams, n)[15][best[1]] for n in SEARCHED}
    assert f"done: PPO on CartPole-v1, PBT of 4 members x 2,048 steps | best member " \
           f"{best[1]}: learning_rate={hp['learning_rate']:.4g}, ent_coef=" \
           f"{hp['ent_coef']:.4g} (return" in out, out
    assert f"lineage: {os.path.dirname(reference['path'])}/pbt_lineage.json" in out


def test_a_resumed_population_keeps_its_search(reference, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--resume", reference["path"], "--pbt-interval", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot resume") and "pbt_interval: 1 -> 2" in err, err


def test_the_plot_and_the_evaluation_read_the_run_directory(reference):
    """`benchmarks/plot.py --pbt`'s curves (no drawing) and `algos/evaluate.py`'s restore of
    the members (nothing compiled): what they read is the run's."""
    from algos.evaluate import restore_run
    from benchmarks.plot import pbt_curves

    _, final, _, lineage = reference["api"]
    run_dir = os.path.dirname(reference["path"])
    curves = pbt_curves(run_dir)
    np.testing.assert_array_equal(curves["returns"], reference["metrics"]["episodic_return"])
    np.testing.assert_array_equal(curves["steps"], STEPS * np.arange(1, 17))
    assert curves["copies"] == [(m, STEPS * (k + 1)) for k in range(16) for m in range(4)
                                if lineage.source[k][m] != m]
    steps, values, log = curves["hparams"]["learning_rate"]
    assert log and list(steps) == list(STEPS * np.repeat(np.arange(17), 2)[1:-1])
    np.testing.assert_array_equal(values[:, ::2], reference["metrics"]["pbt/learning_rate"])
    _, members, _, state = restore_run(reference["record"], reference["path"])
    assert members == [0, 1, 2, 3]
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(final.states)):
        np.testing.assert_array_equal(a, b)
