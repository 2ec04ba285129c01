"""The benchmark scripts' own logic (their figures are measured by running them, not here)."""

import glob
import importlib.util
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import sweep, table
from benchmarks.configs import summary_figures
from benchmarks.learning import cell_config
from common.host.output import final_return_text
from common.host.logger import seed_keys
from helpers import tiny_run


def test_a_sweep_runs_every_grid_point_with_the_same_seeds_in_order():
    """`run_grid`'s run i * seeds + j is grid point i trained alone with seed `seed + j` (as
    `TinyRun.alone` runs it: `init`, then the updates, programs `test_algorithms.py` compiles
    too)."""
    tiny = tiny_run("a2c")
    grid = {"learning_rate": [7e-4, 3e-3], "ent_coef": [0.0, 0.05]}
    points, metrics, _, _ = sweep.run_grid(tiny.module, tiny.config, grid, seeds=2, seed=5)
    assert points == [dict(learning_rate=a, ent_coef=b) for a in (7e-4, 3e-3) for b in (0, 0.05)]
    for i, point in enumerate(points):
        hp = tiny.hp._replace(**{k: jnp.float32(v) for k, v in point.items()})
        for j in range(2):
            _, alone = tiny.alone(jnp.asarray(seed_keys(5 + j, 1)[0]), hp)
            for name in ("value_loss", "entropy"):
                np.testing.assert_allclose(metrics[name][i * 2 + j], alone[name], rtol=1e-4,
                                           atol=1e-6, err_msg=f"point {point}, seed {5 + j}")
    assert not np.allclose(metrics["value_loss"][0], metrics["value_loss"][2])  # points differ


def test_a_sweep_refuses_a_field_that_is_not_a_float_hyperparameter():
    with pytest.raises(SystemExit, match="FIELD one of learning_rate.*got 'num_envs=4,8'"):
        sweep.parse_grid(["num_envs=4,8"], ("learning_rate", "gamma"))


GRID = ["--grid", "learning_rate=1e-3"]  # what sweep.py needs besides the overrides


@pytest.mark.parametrize("script, args, message", [
    ("learning", ["--set", "seed=3"], "--set seed is not a field of algos/ppo.py's Config"),
    ("learning", ["--set", "env_id=Pendulum-v1"], "--set env_id is not a field.*--env-id sets"),
    ("sweep", ["--set", "foo=1", *GRID], "--set foo is not a field of algos/ppo.py's Config"),
    ("sweep", ["--pbt", "learning_rate=1e-4:1e-2:log", "--perturb", "1.5", *GRID],
     r"SearchSpace.perturb must be in \[0, 1\)"),
    *[(script, ["--total-timesteps", budget, "--set", "total_timesteps=6", *extra],
       "--total-timesteps or --set")  # the budget parsed first, as the command line reads it
      for script, budget, extra in (("learning", "5e3", []), ("sweep", "5", GRID))],
])
def test_the_benchmark_scripts_refuse_overrides_they_cannot_apply(script, args, message,
                                                                   monkeypatch):
    """Refused before anything compiles, with one line (not a TypeError from `run_cell`, and
    not one of two budgets silently preferred)."""
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr("sys.argv", [f"benchmarks/{script}.py", *args])
    with pytest.raises(SystemExit, match=message):
        module.main()


def test_set_total_timesteps_is_the_step_budget():
    """`--set total_timesteps=N` leaves the overrides and becomes the budget, as
    `--total-timesteps N` does."""
    from algos.ppo import Config
    from benchmarks.configs import check_overrides

    overrides = {"total_timesteps": 512, "num_envs": 4}
    assert check_overrides("ppo", Config, overrides) == 512
    assert overrides == {"num_envs": 4}
    assert check_overrides("ppo", Config, {"num_envs": 4}, 1024) == 1024


def test_a_saved_curve_keeps_at_most_max_points_block_means_at_each_blocks_last_step():
    """`thin_curves`: blocks of `every` updates, NaNs skipped (NaN where a whole block is NaN),
    a shorter last block, each point at its block's last global step; short curves unchanged."""
    from benchmarks.configs import thin_curves

    nan = np.nan
    curves = np.array([[1.0, 3.0, nan, nan, 5.0, nan, 7.0],
                       [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]])
    steps = [10, 20, 30, 40, 50, 60, 70]
    thinned_steps, thinned, every = thin_curves(steps, curves, max_points=3)
    assert every == 3 and thinned_steps == [30, 60, 70]
    np.testing.assert_array_equal(thinned, [[2.0, 5.0, 7.0], [2.0, 8.0, 12.0]])
    _, gaps, _ = thin_curves(steps, np.array([nan, nan, 1.0, 2.0]), max_points=2)
    np.testing.assert_array_equal(gaps, [nan, 1.5])
    same_steps, same, every = thin_curves(steps, curves, max_points=7)
    assert every == 1 and same_steps == steps
    np.testing.assert_array_equal(same, curves)


def test_the_accelerator_wheels_are_the_pins_but_what_the_machine_brings():
    """`accelerator.WHEELS`: every exact pin of pyproject.toml (its dependencies and the `brax`
    extra) at that version, one version of each package, and no jax, jaxlib, numpy or scipy,
    which the accelerator machine has (with ml_dtypes)."""
    import tomllib

    from benchmarks import accelerator

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    machine = {"jax", "jaxlib", "numpy", "scipy", "ml_dtypes"}
    pins = {r.lower() for r in project["dependencies"] + project["optional-dependencies"]["brax"]
            if "==" in r and r.split("==")[0].lower() not in machine}
    wheels = [w.lower() for w in accelerator.WHEELS]
    names = [w.split("==")[0] for w in wheels]
    assert pins <= set(wheels), pins - set(wheels)
    assert len(names) == len(set(names)) and not machine & set(names)
    # the `playground` extra, but what no run imports (warp-lang: 149 MB, optional for MJX)
    playground = {r.lower() for r in project["optional-dependencies"]["playground"]
                  if r.split("==")[0].lower() not in PLAYGROUND_LEFT_OUT}
    assert playground <= set(wheels), playground - set(wheels)


PLAYGROUND_LEFT_OUT = {"warp-lang": "warp", "mediapy": "mediapy", "ipython": "IPython"}
"""The `playground` extra's packages that `accelerator.WHEELS` leaves out: their modules."""


@pytest.mark.subprocess
def test_a_control_suite_task_loads_without_what_the_accelerator_wheels_leave_out():
    """A Playground task is made, and its reset and step traced and lowered to XLA's input
    (running the compiled programs imports nothing more), in a process where the modules of
    the packages that `accelerator.WHEELS` leaves out cannot be imported, as on an
    accelerator machine that has only those wheels. (Skipped where Playground is not installed or does not
    import for another reason, as `pytest.importorskip` would, but found out in that process
    rather than by importing Playground here too.)"""
    if importlib.util.find_spec("mujoco_playground") is None:
        pytest.skip("MuJoCo Playground is not installed")
    code = f"""
import sys
blocked = {sorted(PLAYGROUND_LEFT_OUT.values())!r}
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocked())
try:
    import mujoco_playground
except ImportError as error:  # for a module left out: fails; else skipped, as importorskip
    if (error.name or "").split(".")[0] in blocked:
        raise
    print("cannot import:", error)
    raise SystemExit(0)
import jax
from common.envs import make_env
env, params, _ = make_env("playground/CartpoleBalance")
obs, state = jax.jit(env.reset).lower(jax.random.PRNGKey(0), params).out_info
jax.jit(env.step).lower(jax.random.PRNGKey(1), state,
                        env.action_space(params).sample(jax.random.PRNGKey(2)), params)
print("stepped", obs.shape, sorted(set(blocked) & set(sys.modules)))
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    if run.stdout.startswith("cannot import:"):
        pytest.skip(f"MuJoCo Playground {run.stdout.strip()}")
    assert run.stdout.strip().endswith("[]"), run.stdout


@pytest.mark.subprocess
def test_an_accelerator_step_stops_at_its_limit_with_the_processes_it_started(tmp_path):
    """`accelerator.run_step`: at its limit the step and its children are ended, and what it
    printed is in the log."""
    from benchmarks import accelerator

    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
            "time.sleep(120)")
    log = accelerator.Log(str(tmp_path / "log.txt"))
    took = accelerator.run_step(log, dict(os.environ), 2.0, [sys.executable, "-c", code])
    assert took < 60
    text = (tmp_path / "log.txt").read_text()
    assert "started" in text and "stopped at its limit of 2 s" in text, text
    status = f"/proc/{int(pid_file.read_text())}/status"
    time.sleep(0.5)
    assert not os.path.exists(status) or "zombie" in open(status).read(), "child left running"


def test_an_accelerator_run_that_trained_no_whole_chunk_still_has_its_results_file(tmp_path):
    """`accelerator.brax_record`, of a run stopped before its first whole chunk (its checkpoint,
    at update 0, holds no metrics) and of one stopped while compiling (no checkpoint): a line
    that says so and a results file with the compile time the run printed, 0 steps and no
    curves, so the pass goes on to its next task; a run stopped after a chunk, its curves
    and where it stopped."""
    from benchmarks import accelerator
    from common.host import checkpoint

    env_id = "playground/CheetahRun"
    command = ["algos/ppo.py", "--env-id", env_id, "--num-seeds", "2"]
    config = {"env_id": env_id, "num_envs": 8, "num_steps": 4, "total_timesteps": 96}
    results = tmp_path / "results"
    printed = ["[ppo playground/CheetahRun] step 0/96 (0%) | return n/a\n",
               "compiled in 116.7s\n", "interrupted at update 0 of 3; checkpoint: x\n"]

    def record(update, metrics, output):
        run_dir = tmp_path / f"run{update}"
        if update is not None:
            checkpoint.save(str(run_dir / "x" / checkpoint.LATEST), algo="ppo", config=config,
                            run={}, run_names=["x"], update=update, run_time=0,
                            train_state={"w": np.zeros(2, np.float32)}, metrics=metrics)
        line = accelerator.brax_record(command, str(run_dir), 280.0, 281.5, str(results),
                                       output)
        return line, json.load(open(results / "ppo__playground-CheetahRun.json"))

    line, saved = record(0, {}, printed)
    assert "before its first whole chunk" in line and "116.7" in line, line
    assert (saved["compile_s"], saved["steps"], saved["stopped"]) == (
        116.7, 0, "before its first whole chunk of updates"), saved
    assert "episodic_return" not in saved and saved["config"] == config
    line, saved = record(None, {}, printed[:1])
    assert (saved["compile_s"], saved["steps"], saved["config"]) == (None, 0, None), saved
    assert saved["stopped"].startswith("while starting") and "while starting" in line, line
    metrics = {"episodic_return": np.array([[np.nan, 5.0], [3.0, 4.0]], np.float32),
               "global_step": np.array([[32, 64], [32, 64]])}
    line, saved = record(2, metrics, printed[:2])
    assert (saved["compile_s"], saved["steps"], saved["stopped"]) == (
        116.7, 64, "at update 2 of 3"), saved
    assert saved["final_return"] == [5.0, 4.0] and "64 steps per seed" in line, (saved, line)


def results_files() -> list:
    """Every committed results file of the table: `benchmarks/results/` and its `gpu/`."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "results")
    return glob.glob(os.path.join(root, "*__*.json")) + \
        glob.glob(os.path.join(root, "gpu", "*__*.json"))


def test_every_results_row_has_a_command_that_trains_the_config_it_recorded():
    """The results table's command of every committed learning result, read back by
    `learning.py`'s parser, builds the config the file records (under today's field names),
    however the presets have been retuned since; and it writes to the same file name. At least
    one file ran settings that today's presets no longer give, so the `--set` is exercised."""
    files = results_files()

    def config_of(words):
        args, overrides, budget = table.read_command(words)
        return args, table.as_json(cell_config(args.algo, args.env_id, budget, args.variant,
                                               **overrides))

    def same(config, ran):
        return all(ran[k] == v for k, v in config.items() if k in ran)

    retuned = checked = 0
    for path in files:
        record = json.load(open(path))
        if "episodic_return" not in record or \
                not record["command"].startswith("benchmarks/learning.py"):
            continue  # not a learning result, or a command-line run (`accelerator.py`)
        checked += 1
        command = table.describe(path)["command"]
        words = command.split()
        assert words[:2] == ["python", "benchmarks/learning.py"], command
        args, config = config_of(words[2:])
        ran = table.ran_config(record)
        assert same(config, ran), (path, command)
        tag = args.tag or args.variant
        name = f"{args.algo}__{args.env_id.replace('/', '-')}{'__' + tag if tag else ''}.json"
        assert os.path.basename(path) == name, command
        retuned += not same(config_of(record["command"].split()[1:])[1], ran)
    assert retuned > 0 and checked > 50, (retuned, checked)


def test_every_command_line_result_has_a_command_that_builds_its_config():
    """The results written from command-line runs (`accelerator.py run brax`): the table's
    command of each, parsed as the command line parses it (the presets of today included),
    builds the config the file records, and its seed count is the file's; where a preset
    was retuned since (Ant's), the recorded command alone does not, and the table's adds
    the flags that make up the difference."""
    from common.host import flags

    def built(words, ran):
        algo = os.path.basename(words[0])[:-len(".py")]
        config, run, _ = flags.parse(algo, importlib.import_module(f"algos.{algo}").Config,
                                     words[1:])
        return {k: v for k, v in table.as_json(config).items() if k in ran}, run

    checked = retuned = 0
    for path in results_files():
        record = json.load(open(path))
        if not record.get("command", "").startswith("algos/"):
            continue
        ran = table.ran_config(record)
        command = table.describe(path)["command"].split()
        assert command[0] == "python", command
        config, run = built(command[1:], ran)
        assert config == {k: ran[k] for k in config}, (path, command)
        assert run.num_seeds == len(record["episodic_return"]), path
        config, _ = built(record["command"].split(), ran)
        retuned += config != {k: ran[k] for k in config}
        checked += 1
    assert checked >= 4 and retuned >= 1, (checked, retuned)


def test_the_recheck_s_dry_run_lists_the_commands_of_the_rows_it_selects(monkeypatch, capsys):
    """`table.py --recheck --rows REGEX --dry-run`: one line per selected row, its table
    command with `--out-dir` (a command-line run: `--log-dir`) into the recheck folder, in the
    table's order; no other row, nothing run, no record written."""
    recheck_dir = os.path.join("benchmarks", "out", "recheck")
    monkeypatch.setattr(sys, "argv", ["table.py", "--recheck", "--dry-run", "--rows",
                                      r"^(ppo|impala)__MaskedCartPole-v1__(gru|mlp)$|brax-ant$",
                                      "--out", "/nonexistent/recheck.json"])
    assert table.main() == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = ["ppo__MaskedCartPole-v1__gru", "ppo__MaskedCartPole-v1__mlp", "gpu/ppo__brax-ant",
             "impala__MaskedCartPole-v1__gru", "impala__MaskedCartPole-v1__mlp"]
    assert [line.rsplit("  # ", 1)[1] for line in lines] == names, lines
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks", "results")
    for line, name in zip(lines, names):
        command = table.describe(os.path.join(results, name + ".json"))["command"]
        flag = "--log-dir" if "brax-ant" in name else "--out-dir"
        out = os.path.join(recheck_dir, name) if "brax-ant" in name else recheck_dir
        assert line.split("  # ")[0] == f"{command} {flag} {out}", line


def test_the_recheck_flags_a_row_that_moved_beyond_its_spread_and_passes_one_that_did_not():
    """`table.compare`: Welch's t-test on per-seed final returns (p as SciPy's `ttest_ind`
    without equal variances); moved at p < alpha; a rerun that gave the same seeds passes;
    runs without spread compare their means; a run of one seed is not judged."""
    from scipy import stats

    old = np.array([380.0, 395, 400, 405, 410, 420, 390, 400])  # 400 +- 11.5
    unchanged = np.array([385.0, 398, 402, 399, 415, 412, 388, 404])  # other seeds, same code
    moved = old - 30  # the same spread, 30 lower: p 2e-4
    for new in (unchanged, moved):
        result = table.compare(old, new)
        np.testing.assert_allclose(result["p"], stats.ttest_ind(new, old, equal_var=False).pvalue)
        np.testing.assert_allclose(result["diff"], new.mean() - old.mean())
    assert table.compare(old, unchanged)["verdict"] == "within spread"
    assert table.compare(old, moved)["verdict"] == "moved"
    assert table.compare(old, old - 5)["verdict"] == "within spread"  # p 0.43
    assert table.compare(old, old)["p"] == 1.0  # a rerun that reproduced every seed
    assert table.compare(old, moved, alpha=1e-30)["verdict"] == "within spread"
    solved = np.full(8, 500.0)
    assert table.compare(solved, solved + 1e-4)["verdict"] == "within spread"
    assert table.compare(solved, np.full(8, 499.0))["verdict"] == "moved"
    assert table.compare(solved, [500.0, np.nan])["verdict"] == "too few seeds"


def test_the_benchmarks_read_a_summary_line_without_a_final_return():
    """A run in which no episode ended, or only in some runs, still gives its speed."""
    nan = float("nan")
    for finals, mean in (([nan, nan], nan), ([10.0, nan, 30.0], 20.0), ([5.0], 5.0)):
        line = (f"done: PPO on brax/hopper, 1 run(s) x 2,048 steps | final return (last 10% "
                f"of updates) {final_return_text(np.array(finals))} | compile 1.5s, train 0.1s "
                f"(31,883 SPS) on 1 device(s), parallel seeds | logs: runs/x | checkpoint: y")
        figures = summary_figures(line)
        assert figures["sps"] == 31883 and figures["train"] == 0.1, figures
        np.testing.assert_equal(figures["mean"], mean)


def test_the_profile_reads_only_the_devices_xla_ops_from_a_trace(tmp_path):
    import gzip

    from benchmarks.vs_purejaxrl import device_ops

    meta = lambda pid, name, tid=None: {  # noqa: E731
        "ph": "M", "pid": pid, "name": "thread_name" if tid else "process_name",
        **({"tid": tid} if tid else {}), "args": {"name": name}}
    op = lambda pid, tid, name, dur: {  # noqa: E731
        "ph": "X", "pid": pid, "tid": tid, "ts": 0, "dur": dur, "name": name,
        "args": {"long_name": f"%{name} = f32[4]"}}
    events = [meta(1, "/host:CPU"), meta(1, "python", 5), meta(3, "/device:TPU:0"),
              meta(3, "XLA Ops", 3), meta(3, "XLA Modules", 2),
              op(3, 3, "gather", 10.0), op(3, 3, "fusion", 4.0), op(3, 3, "gather", 5.0),
              op(3, 2, "jit_train", 100.0), op(1, 5, "host_work", 50.0)]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    ops = device_ops(str(path), top=5)
    assert [(o["op"], o["us"], o["n"]) for o in ops] == [("gather", 15.0, 2), ("fusion", 4.0, 1)]
    assert ops[0]["hlo"] == "%gather = f32[4]"


def test_the_brax_comparison_runs_purejaxrl_s_settings_whatever_our_preset():
    """`vs_purejaxrl.py --brax NAME`: both programs get PureJaxRL's `ppo_continuous_action.py`
    settings (256-unit layers, gamma 0.99, constant learning rate, no entropy bonus), with
    PureJaxRL's own batch for a task whose preset is sized for an accelerator, Ant's included
    (its preset has 4096 envs and other settings), and the CPU preset's batch for Hopper."""
    from benchmarks.vs_purejaxrl import configs
    from common.presets import PPO_BRAX_ACCELERATOR

    for task, envs in (("ant", 2048), ("halfcheetah", 2048), ("hopper", 64)):
        config, file, ref = configs(10**6, False, task)
        assert file == "ppo_continuous_action.py"
        assert (config.num_envs, config.hidden_size, config.gamma, config.anneal_lr,
                config.ent_coef) == (envs, 256, 0.99, False, 0.0), task
        assert (ref["NUM_ENVS"], ref["NUM_STEPS"], ref["NUM_MINIBATCHES"], ref["GAMMA"],
                ref["ANNEAL_LR"]) == (config.num_envs, config.num_steps, config.num_minibatches,
                                      0.99, False), task
    config, _, _ = configs(10**6, False, "ant")
    assert (config.num_steps, config.num_minibatches, config.update_epochs) == tuple(
        PPO_BRAX_ACCELERATOR[k] for k in ("num_steps", "num_minibatches", "update_epochs"))


def test_the_playground_comparison_gives_brax_s_ppo_and_ours_the_same_run(monkeypatch):
    """`vs_purejaxrl.py --playground`: Playground's settings (with `--set` sizes) give both the
    same transitions per update and per minibatch, epochs, learning rate, discount, entropy
    cost, GAE lambda and clipping (Brax's defaults), steps (whole updates; Brax's loop runs one
    training step per update) and networks' hidden layers; Brax's PPO runs on jax 0.10 through
    the script's stand-in for `jax.device_put_replicated` (a leading axis of one per device)."""
    pytest.importorskip("mujoco_playground")
    import inspect

    from benchmarks.vs_purejaxrl import brax_ppo_train, playground_configs

    monkeypatch.setattr(jax, "device_put_replicated", None, raising=False)
    monkeypatch.delattr(jax, "device_put_replicated")  # absent again after the test
    ppo_train = brax_ppo_train()
    sizes = {"num_envs": 16, "batch_size": 32, "num_minibatches": 8}
    config, brax, settings = playground_configs("CartpoleBalance", 10**5, sizes, "brax")
    default = {k: v.default for k, v in inspect.signature(ppo_train.train).parameters.items()}
    per_update = brax["batch_size"] * brax["num_minibatches"] * brax["unroll_length"]
    assert config.batch_size == per_update == 16 * 480 and config.num_steps == 480
    assert config.minibatch_size == brax["batch_size"] * brax["unroll_length"]
    assert brax["num_timesteps"] == config.total_timesteps == 13 * per_update  # 1e5 rounded
    assert (brax["num_evals"] - 1) * brax["num_resets_per_eval"] == config.num_updates
    assert (config.update_epochs, config.learning_rate, config.gamma, config.ent_coef) == (
        settings["num_updates_per_batch"], settings["learning_rate"], settings["discounting"],
        settings["entropy_cost"]) == (16, 1e-3, 0.995, 1e-2)
    assert (config.gae_lambda, config.clip_coef, config.anneal_lr, config.normalize_obs) == (
        default["gae_lambda"], default["clipping_epsilon"], False, True)
    networks = brax["network_factory"](5, 1)
    shapes = lambda net: [k.shape for k in jax.tree.leaves(jax.eval_shape(  # noqa: E731
        net.init, jax.random.PRNGKey(0))) if k.ndim == 2]
    assert shapes(networks.policy_network)[:-1] == [(5, 32)] + [(32, 32)] * 3
    assert shapes(networks.value_network)[:-1] == [(5, 256)] + [(256, 256)] * 4
    assert (config.hidden_size, config.hidden_layers, config.critic_hidden_size,
            config.critic_hidden_layers, config.activation) == (32, 4, 256, 5, "swish")
    replicated = jax.device_put_replicated({"x": np.arange(3.0)}, jax.local_devices()[:1])
    assert replicated["x"].shape == (1, 3)


@pytest.mark.parametrize("script, mode", [("vs_purejaxrl", []), ("vs_purejaxrl", ["--profile"]),
                                          ("cli_overhead", [])])
def test_a_results_path_that_cannot_be_written_is_one_line_and_exit_2_before_running(
        script, mode, tmp_path, monkeypatch, capsys):
    """`--out` naming a folder, or a file under a file, stops the script at once with a line
    that says why, not with a traceback after the whole run."""
    module = importlib.import_module(f"benchmarks.{script}")
    reference = [] if script == "cli_overhead" else ["--reference", str(tmp_path / "none")]
    (tmp_path / "a-file").write_text("")
    for out, why in [(tmp_path, "is a folder"),
                     (tmp_path / "a-file" / "result.json", "cannot make its folder")]:
        monkeypatch.setattr(sys, "argv", [script, *reference, *mode, "--out", str(out)])
        with pytest.raises(SystemExit) as stop:
            module.main()
        assert stop.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith(f"{script}: error: --out {out}") and why in error, error


REFERENCE = ["--reference", "none"]


@pytest.mark.parametrize("script, args, message", [
    ("vs_purejaxrl", [*REFERENCE, "--profile", "--total-timesteps", "5000"],
     "--total-timesteps applies only without --profile"),
    ("vs_purejaxrl", [*REFERENCE, "--profile", "--purejaxrl-first"],
     "--purejaxrl-first applies only without --profile"),
    ("vs_purejaxrl", [*REFERENCE, "--updates", "3"], "--updates applies only with --profile"),
    ("vs_purejaxrl", [*REFERENCE, "--lowering-profile"],
     "--lowering-profile applies only with --profile"),
    ("vs_purejaxrl", ["--playground", "CartpoleBalance", "--recurrent"],
     "--recurrent applies only without --playground"),
    ("vs_purejaxrl", [*REFERENCE, "--networks", "ours"], "--networks applies only with --playground"),
    ("vs_purejaxrl", [], "--reference DIR"),
    ("learning", ["--suite", "playground", "--seeds", "3"], "--seeds applies only without --suite"),
    ("learning", ["--tasks", "CartpoleBalance"], "--tasks applies only with --suite"),
    ("table", ["--rows", "gru"], "--rows applies only with --recheck"),
    ("table", ["--dry-run"], "--dry-run applies only with --recheck")])
def test_a_flag_of_a_scripts_other_mode_is_refused(script, args, message, monkeypatch, capsys):
    """`vs_purejaxrl.py` (side by side or `--profile`), `learning.py` (one cell or `--suite`)
    and `table.py` (the tables or `--recheck`): a flag that only the other mode reads is
    refused with one line before anything runs, not silently ignored."""
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.subprocess
def test_a_test_session_stopped_by_ctrl_c_writes_its_report_then_leaves_at_once(tmp_path):
    """`accelerator.py run tests` stops pytest with SIGINT at its budget, maybe mid-compile:
    the session (this suite's conftest) writes its JUnit XML and summary, then exits with
    pytest's status 2 without Python's teardown (no `atexit` handler runs)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "test_stop.py").write_text(
        "import atexit\n\n\ndef test_stop():\n"
        "    atexit.register(lambda: print('teardown ran', flush=True))\n"
        "    raise KeyboardInterrupt\n")
    xml = tmp_path / "report.xml"
    path = os.pathsep.join([os.path.join(root, "tests"), root, os.environ.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p",
                          "no:cacheprovider", "--junitxml", str(xml), "test_stop.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path})
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "KeyboardInterrupt" in run.stdout and xml.exists(), run.stdout[-2000:]
    assert "teardown ran" not in run.stdout + run.stderr
