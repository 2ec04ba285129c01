"""The accelerator pass (GPU or TPU): this project's dependencies carried to a machine without
network, installed there, and the speed, side-by-side and learning benchmarks run there into
one folder of raw results.

    python benchmarks/accelerator.py wheels                          # here, with network
    python benchmarks/accelerator.py install run speed learning      # there, in one command
    python benchmarks/accelerator.py run --dry                       # every pass, tiny budgets
    python benchmarks/accelerator.py run tests --test-files tests/test_gae.py ...  # the suite

Steps, run in the order given:

- `wheels` downloads the project's pinned wheels (`WHEELS`: its dependencies and the `brax`
  extra with theirs, at the versions tested here; about 40 MB) for CPython 3.11 on manylinux
  x86-64 into `--wheels` (default `.whl/`, ignored by git), to carry with the checkout. jax,
  jaxlib, numpy and scipy are left out: an accelerator machine has its own build of them.
  `--also NAME==VERSION ...` adds wheels (PureJaxRL, for the `vs` passes, imports all of
  gymnax, which needs matplotlib, pandas and seaborn; the first two, with their own needs,
  are 21 MB more: where the machine has a package index of its own, install them from it
  into a folder at the end of PYTHONPATH and carry seaborn alone).
- `install` installs them offline: `pip install --no-index --no-deps --target SITE` (`--site`,
  default `/tmp/onpolicy-site`). For commands of your own afterwards, put SITE at the end of
  PYTHONPATH, after this checkout, so that the machine's own jax stays first:
  `export PYTHONPATH=$PYTHONPATH:$PWD:/tmp/onpolicy-site`. `run` does that for its steps.
- `run [PASS ...]` (default: all eight, `tests` aside) runs each pass's steps in fresh processes, each under
  its own time limit (so that one slow step cannot eat the others' time), prints what they
  print and keeps it in `OUT/log.txt`, and has them write their raw files to `OUT/results/`
  (`--out`, default `benchmarks/out/`, ignored by git). Copy the files to keep into
  `benchmarks/results/gpu/` (or a folder named for the machine). Each pass fits in 10 minutes:

  - `speed`: `speed.py`, PPO on CartPole with 1, 8, 32 and 128 vmapped seeds, IMPALA with 1
    and 32;
  - `vs`: `vs_purejaxrl.py`, our PPO against PureJaxRL (`--purejaxrl DIR`, the folder that
    holds its `ppo.py`; skipped without it): CartPole with 1, 256 and 1,024 vmapped seeds
    (5e5, 5e4 and 2.5e4 steps each, the rows of docs/performance.md's TPU table);
  - `vs-brax`: the same script on Brax Ant (4 seeds x 2048 envs, 8.2e5 steps each), once
    with ours compiled first and once with PureJaxRL's (`--purejaxrl-first`: on the TPU the
    program compiled second compiled faster);
  - `vs-other`: recurrent PPO on `ppo_rnn.py`'s config, and Brax HalfCheetah as Ant above;
  - `cli`: `cli_overhead.py`, the command line against the program it compiles (1 and 32
    seeds), then the default command from start to exit, with an empty and a warm
    compilation cache;
  - `learning`: `learning.py`, MinAtar with the CNN, 8 seeds x 5e6 steps: PPO on Breakout and
    SpaceInvaders, A2C and IMPALA on Breakout;
  - `brax`: PPO from the command line on Brax Ant (its preset, `PPO_BRAX_ANT`), HalfCheetah and
    Hopper with PureJaxRL's accelerator settings (`PPO_BRAX_ACCELERATOR` in
    `common/presets.py`), 4 seeds vmapped in one program. Each run gets SIGINT at its share of
    `--brax-budget` seconds, which saves its last whole chunk of updates as Ctrl-C does, so a
    slower run still reports how far it got, and the pass goes on to the next task; each
    task's `OUT/results/ppo__brax-<task>.json` has `compile_s` (the command line's compile
    time), `train_s` (start to stop, compiling included), `steps` (the steps each seed
    trained) and `stopped` (null where it ran to its end, else how far it got: a run stopped
    before its first whole chunk of updates says so, and has no curves); with curves, it is a
    results file that `table.py` reads;
  - `playground`: the same for MuJoCo Playground's CheetahRun and WalkerWalk with
    Playground's own PPO settings (`PPO_PLAYGROUND_ACCELERATOR`), under
    `--playground-budget`;
  - `tests`, only when named: the test suite's in-process tests (`-m "not subprocess"`: one
    process at a time may hold a TPU) in one pytest process on the accelerator, of the files
    `--test-files` (default: all), stopped like Ctrl-C at `--tests-budget` seconds. Each test's
    verdict is in the log as it ends (`-v`), and pytest's JUnit XML in
    `OUT/results/tests.xml`. Every test compiles its own small programs, slowly on a TPU: give
    a 10-minute call a few files. pytest comes from the machine (the TPU machine has the
    pinned 9.0.3; pytest-xdist is not needed).

Set `SOURCE_COMMIT` to the commit of the copied tree: a copy without the git history records
"unknown". `--dry` runs every step with tiny budgets (Brax: the inverted pendulum at CPU
scale), a check of the plumbing on any machine in a few minutes, not a figure.
"""

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WHEELS = [
    # this project's dependencies (pyproject.toml) and theirs
    "flax==0.12.8", "optax==0.2.8", "distrax==0.1.9", "gymnax==1.0.1", "tyro==1.0.17",
    "tensorboardX==2.6.5", "crc32c==2.9.post0", "tfp-nightly==0.26.0.dev20261027",
    "chex==0.1.92", "msgpack==1.2.4", "absl-py==2.5.1", "etils==1.15.0", "toolz==1.2.0",
    "typing-extensions==4.15.0", "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2",
    "pygments==2.20.0", "pyyaml==6.0.3", "treescope==0.1.10", "dm-tree==0.1.10",
    "attrs==26.1.0", "wrapt==2.1.2", "gast==0.7.0", "decorator==5.2.1", "cloudpickle==2.1.0",
    "six==1.17.0", "gymnasium==1.3.0", "farama-notifications==0.0.6", "docstring-parser==0.18.0",
    "typeguard==4.6.1", "protobuf==7.36.2", "packaging==26.2",
    # the `brax` extra and theirs
    "brax==0.14.2", "mujoco==4.0.0", "mujoco-core==4.0.0", "mujoco-mjx==3.17.0", "jaxopt==0.8.5",
    "ml-collections==1.1.0", "trimesh==5.2.0", "pillow==13.0.0", "jinja2==3.1.6",
    "markupsafe==3.0.3", "flask==3.1.3", "flask-cors==6.0.2", "werkzeug==3.1.8",
    "itsdangerous==2.2.0", "blinker==1.9.0", "click==8.4.0",
    # the `playground` extra: Playground and what loading a Control Suite task imports (its
    # warp-lang, 149 MB, is left out: MJX imports it only if present, and runs without it;
    # mediapy and ipython too: no run here imports them)
    "playground==0.2.0", "tqdm==4.70.1", "lxml==6.2.0",
]
"""Every wheel a run needs beside jax, jaxlib, numpy and scipy (and ml_dtypes and opt_einsum,
which come with jax): pip installs them with `--no-deps`, so the list is complete. Left out,
though declared by the packages above, because no run here imports them: orbax-checkpoint and
tensorstore (flax, brax), matplotlib and seaborn (gymnax; `common.envs.make_env` imports only
the environment's own module) and MuJoCo's viewer (glfw, PyOpenGL, mujoco-studio). Checked:
with only jax, jaxlib, numpy and scipy beside them, every algorithm trains from the command
line on CartPole, MinAtar and Brax, and `run playground --dry` and the Playground tests pass
(a fresh virtual environment, on a CPU); on a TPU v5e machine (Python 3.11, glibc 2.36, its own jax
0.10.2) `install` took 8 s, and `run speed learning brax --dry` ran every step on the TPU."""
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64"]
"""pip matches a wheel's platform tag exactly: every manylinux tag a wheel above is built for."""

PASSES = ["speed", "vs", "vs-brax", "vs-other", "cli", "learning", "brax", "playground"]
"""What `run` runs by default; `tests` runs only when named."""
TESTS_DRY = ["tests/test_gae.py"]
BRAX_TASKS = [("brax/ant", [], 0.5),
              ("brax/halfcheetah", [], 0.25),
              ("brax/hopper", None, 0.25)]
"""(task, flags beside its preset, share of `--brax-budget`); None: the accelerator preset's
sizes as flags, for a task whose preset is sized for a CPU (Hopper)."""
BRAX_DRY = [("brax/inverted_pendulum", ["--num-envs", "8", "--num-steps", "8",
                                        "--num-minibatches", "2", "--total-timesteps",
                                        "1000000"], 1.0)]
"""The same plumbing at CPU scale, stopped by its limit long before its budget of steps."""
PLAYGROUND_TASKS = [("playground/CheetahRun", [], 0.5), ("playground/WalkerWalk", [], 0.5)]
"""(task, flags beside its preset, share of `--playground-budget`): Playground's own PPO
settings (`PPO_PLAYGROUND_ACCELERATOR`)."""
PLAYGROUND_DRY = [("playground/CartpoleBalance", ["--num-envs", "8", "--num-steps", "16",
                                                  "--num-minibatches", "2",
                                                  "--total-timesteps", "1000000"], 1.0)]


def download(folder: str, python_version: str, also: list):
    """`wheels`: the wheels of `WHEELS` and `also` into `folder`, emptied of older wheels first
    (two versions of one package stop the whole install)."""
    os.makedirs(folder, exist_ok=True)
    for old in glob.glob(os.path.join(folder, "*.whl")):
        os.remove(old)
    platforms = [flag for tag in PLATFORMS for flag in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms,
                    "-d", folder, *WHEELS, *also], check=True)
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.whl")))
    print(f"{len(WHEELS) + len(also)} wheels, {size / 2**20:.0f} MiB in {folder}")


def install(folder: str, site: str):
    """`install`: every wheel in `folder` into `site`, offline, without resolving
    dependencies."""
    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if not wheels:
        raise SystemExit(f"error: no wheels in {folder}: run `python benchmarks/accelerator.py "
                         f"wheels` on a machine with network and bring the folder along.")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "-q", "--no-index",
                    "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target", site,
                    *wheels], check=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    print(f"installed {len(wheels)} wheels into {site} in {time.perf_counter() - start:.0f} s; "
          f"for other commands: export PYTHONPATH=$PYTHONPATH:{ROOT}:{site}")


class Log:
    """Prints a step's output as it comes and keeps it in `OUT/log.txt`."""

    def __init__(self, path: str):
        self.file = open(path, "a")

    def write(self, line: str):
        print(line, end="", flush=True)
        self.file.write(line)
        self.file.flush()


def run_step(log: Log, env: dict, limit_s: float, argv: list, stop=signal.SIGTERM,
             lines: list | None = None) -> float:
    """Run `argv` from the checkout under a wall-clock limit: at `limit_s` it and the processes
    it started get `stop`, and a minute later whatever of them is left is killed. Returns the
    seconds it ran; what it printed is appended to `lines` as well, where given."""
    log.write(f"=== {' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in argv)}"
              f" (limit {limit_s:.0f} s)\n")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    def read():
        for line in proc.stdout:
            log.write(line)
            if lines is not None:
                lines.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        log.write(f"=== stopped at its limit of {limit_s:.0f} s\n")
        os.killpg(proc.pid, stop)  # its own session: it and the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of them is left
        except ProcessLookupError:
            pass
        proc.wait()
    reader.join()
    return time.perf_counter() - start


def python_steps(name: str, args, results: str) -> list:
    """`(limit_s, argv)` of each step of one pass but `brax`."""
    py = [sys.executable]
    bench = lambda script: [*py, os.path.join(ROOT, "benchmarks", script)]  # noqa: E731
    if name == "speed":
        budget = ["--total-timesteps", "20000", "--repeats", "1"] if args.dry else \
            ["--repeats", "2"]
        return [(300, [*bench("speed.py"), "--algo", "ppo", "--env-id", "CartPole-v1",
                       "--seeds", *(["1", "2"] if args.dry else ["1", "8", "32", "128"]),
                       *budget, "--out-dir", results]),
                (200, [*bench("speed.py"), "--algo", "impala", "--env-id", "CartPole-v1",
                       "--seeds", *(["1", "2"] if args.dry else ["1", "32"]), *budget,
                       "--out-dir", results])]
    if name in ("vs", "vs-brax", "vs-other"):
        if not args.purejaxrl:
            return []
        # dry, on a CPU: one XLA:CPU thread, or PureJaxRL's vmapped orthogonal initialiser can
        # deadlock jaxlib 0.10.x (docs/performance.md, "Known hazard")
        vs = [*bench("vs_purejaxrl.py"), "--reference", args.purejaxrl,
              *(["--repeats", "1", "--threads", "1"] if args.dry else ["--repeats", "3"])]
        def out(label):
            return ["--out", os.path.join(results, f"vs_purejaxrl__{label}.json")]

        if name == "vs":  # (limit s, seeds, steps per seed); dry: 1, 2, 4 seeds, tiny runs
            rows = [(120, 1, 500000), (130, 2, 20000), (150, 4, 20000)] if args.dry else \
                [(120, 1, 500000), (130, 256, 50000), (150, 1024, 25000)]
            return [(limit, [*vs, "--seeds", str(seeds), "--total-timesteps",
                             "20000" if args.dry else str(steps), *out(f"seeds{seeds}")])
                    for limit, seeds, steps in rows]
        def brax(task, *first):  # dry: the inverted pendulum, 2 seeds x 4096 steps
            task = "inverted_pendulum" if args.dry else task
            label = f"brax-{task}" + ("__purejaxrl-first" if first else "")
            return (260, [*vs, "--brax", task, "--seeds", "2" if args.dry else "4",
                          "--total-timesteps", "4096" if args.dry else "819200", *first,
                          *out(label)])

        if name == "vs-brax":
            return [brax("ant"), brax("ant", "--purejaxrl-first")]
        return [(150, [*vs, "--recurrent", *(["--total-timesteps", "20000"] if args.dry else []),
                       *out("rnn")]), brax("halfcheetah")]
    if name == "cli":
        steps = "20000" if args.dry else "500000"
        return [(300, [*bench("cli_overhead.py"), "--seeds", "1", "2" if args.dry else "32",
                       "--repeats", "1", "--no-start", "--total-timesteps", steps,
                       "--out", os.path.join(results, "cli_overhead.json")]),
                (150, [*bench("cli_overhead.py"), "--start-only", "--repeats", "1",
                       "--out", os.path.join(results, "cli_overhead_start.json")])]
    if name == "learning":
        budget = ["--seeds", "2", "--total-timesteps", "20000"] if args.dry else \
            ["--seeds", "8", "--total-timesteps", "5000000"]
        return [(limit, [*bench("learning.py"), "--algo", algo, "--env-id", env_id, *budget,
                         "--out-dir", results])
                for limit, algo, env_id in ((150, "ppo", "Breakout-MinAtar"),
                                            (150, "ppo", "SpaceInvaders-MinAtar"),
                                            (120, "a2c", "Breakout-MinAtar"),
                                            (120, "impala", "Breakout-MinAtar"))]
    raise ValueError(name)


def tests_step(args, results: str) -> tuple:
    """`(limit_s, argv)` of the `tests` pass: pytest in one process, the files of
    `--test-files` without the tests that start Python processes, each verdict printed as
    it ends, JUnit XML into `results`."""
    files = args.test_files or (TESTS_DRY if args.dry else ["tests"])
    return (args.tests_budget, [sys.executable, "-m", "pytest", "-o", "addopts=", "-p",
                                "no:hypothesispytest", "-p", "no:cacheprovider", "-m",
                                "not subprocess", "-v", "-rfE", "--junitxml",
                                os.path.join(results, "tests.xml"), *files])


def brax_pass(log: Log, env: dict, args, results: str, playground: bool = False):
    """`brax` (`playground`): each task from the command line under its share of the budget,
    then its curves as a results file."""
    from common.presets import PPO_BRAX_ACCELERATOR

    accelerator = [word for name in ("num_envs", "num_steps", "num_minibatches",
                                     "total_timesteps")
                   for word in (f"--{name.replace('_', '-')}", str(PPO_BRAX_ACCELERATOR[name]))]
    tasks = (PLAYGROUND_DRY if args.dry else PLAYGROUND_TASKS) if playground else \
        (BRAX_DRY if args.dry else BRAX_TASKS)
    budget = args.playground_budget if playground else args.brax_budget
    for env_id, flags, share in tasks:
        log_dir = tempfile.mkdtemp(prefix="accelerator-brax-")
        command = ["algos/ppo.py", "--env-id", env_id, "--num-seeds", str(args.brax_seeds),
                   *(accelerator if flags is None else flags)]
        limit_s = share * budget
        output = []
        wall = run_step(log, env, limit_s, [sys.executable, *command, "--log-dir", log_dir],
                        stop=signal.SIGINT, lines=output)
        try:
            line = brax_record(command, log_dir, limit_s, wall, results, output)
        except Exception as error:  # noqa: BLE001  (the next task still runs)
            line = f"{env_id}: no results file ({type(error).__name__}: {error})"
        log.write(line + "\n")


COMPILED = re.compile(r"^compiled in ([0-9.]+)s$")
"""The line the command line prints once its programs are compiled, before training."""


def brax_record(command: list, log_dir: str, limit_s: float, wall: float, results: str,
                output=()) -> str:
    """Save a command-line run's results file from its last checkpoint in `log_dir` and the
    lines it printed (`output`); returns a line that says what was saved.

    Every run's file has `compile_s` (the command line's compile time; None: it never finished
    compiling), `steps` (each seed's steps in its last checkpoint; 0 without one) and
    `stopped` (None: it trained to its end; else how far it got). A run that saved a whole
    chunk of updates has its curves and final returns too; one without them has no
    `episodic_return`, so `table.py` lists no row for it."""
    import numpy as np

    from benchmarks.configs import library_versions, save_record, source_commit, thin_curves
    from common.host import checkpoint
    from common.host.logger import final_return

    compiled = [float(m.group(1)) for line in output if (m := COMPILED.match(line.strip()))]
    paths = [os.path.join(d, checkpoint.LATEST) for d, _, files in os.walk(log_dir)
             if checkpoint.LATEST in files]
    env_id = command[2]
    saved = checkpoint.load(paths[0]) if paths else None
    record = {
        "command": " ".join(command),
        "commit": source_commit(),
        "versions": library_versions(),
        "config": saved and saved["config"],
        "limit_s": round(limit_s, 1), "train_s": round(wall, 2),
        "compile_s": compiled[-1] if compiled else None,
        "steps": 0, "stopped": None,
    }
    metrics = saved["metrics"] if saved else {}
    if not metrics:  # nothing trained: stopped while compiling, or before a whole chunk
        record["stopped"] = ("before its first whole chunk of updates" if compiled or saved
                             else "while starting, before its programs were compiled")
        path = save_record(record, results, f"ppo__{env_id}")
        compile_text = f"compile {compiled[-1]:.1f} s" if compiled else "compile unknown"
        return (f"{env_id}: stopped {record['stopped']} ({compile_text}, stopped at "
                f"{wall:.0f} s): no curves -> {path}")
    config = saved["config"]
    num_updates = config["total_timesteps"] // (config["num_envs"] * config["num_steps"])
    if saved["update"] < num_updates:
        record["stopped"] = f"at update {saved['update']} of {num_updates}"
    returns = np.asarray(metrics["episodic_return"], np.float64)
    global_step, curves, every = thin_curves(metrics["global_step"][0].tolist(), returns)
    record.update({
        "steps": int(metrics["global_step"][0, -1]),
        "updates_per_point": every,
        "global_step": global_step,
        "episodic_return": np.round(curves, 2).tolist(),
        "final_return": np.round(final_return(returns), 4).tolist(),  # from every update
    })
    path = save_record(record, results, f"ppo__{env_id}")
    stopped = f", stopped {record['stopped']}" if record["stopped"] else ""
    return (f"{env_id}: {record['steps']:,} steps per seed in {wall:.0f} s (compile "
            f"{record['compile_s']} s{stopped}), final return per seed "
            f"{np.round(record['final_return'], 1).tolist()} -> {path}")


def run(args, passes: list):
    """`run`: the passes, with SITE (where it exists) and the checkout on PYTHONPATH."""
    results = os.path.join(args.out, "results")
    os.makedirs(results, exist_ok=True)
    extra = [ROOT] + ([args.site] if os.path.isdir(args.site) else [])
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), *extra]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    # This process reads the Brax checkpoints and never computes: keep its JAX off the chip,
    # which one process at a time may hold.
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path[1:1] = [ROOT]
    sys.path += extra[1:]
    log = Log(os.path.join(args.out, "log.txt"))
    run_step(log, env, 120, [sys.executable, "-c", "import jax; print('jax', jax.__version__, "
                             "jax.devices())"])
    for name in passes:
        log.write(f"=== pass {name}{' (dry)' if args.dry else ''}\n")
        if name in ("brax", "playground"):
            brax_pass(log, env, args, results, playground=name == "playground")
            continue
        if name == "tests":  # stopped like Ctrl-C: pytest still reports and writes its XML
            run_step(log, env, *tests_step(args, results), stop=signal.SIGINT)
            continue
        steps = python_steps(name, args, results)
        if not steps:
            log.write(f"=== {name}: skipped (give --purejaxrl, the folder that holds "
                      f"PureJaxRL's ppo.py)\n")
        for limit_s, argv in steps:
            run_step(log, env, limit_s, argv)
    log.write(f"=== done: raw files in {results}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="+", metavar="STEP",
                        help="wheels, install, run [PASS ...], in that order; passes: "
                             + ", ".join(PASSES) + " (default: all), and tests")
    parser.add_argument("--wheels", default=os.path.join(ROOT, ".whl"),
                        help="the wheels' folder (default: .whl in the checkout)")
    parser.add_argument("--python-version", default="3.11", help="the machine's Python")
    parser.add_argument("--also", nargs="*", default=[], metavar="NAME==VERSION",
                        help="more wheels to download")
    parser.add_argument("--site", default="/tmp/onpolicy-site",
                        help="where `install` puts the packages, and `run` finds them")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out"),
                        help="the log and results/ of `run`")
    parser.add_argument("--purejaxrl", default=os.environ.get("PUREJAXRL"),
                        help="the folder holding PureJaxRL's ppo.py (the `vs` passes); "
                             "default: $PUREJAXRL")
    parser.add_argument("--brax-budget", type=float, default=None,
                        help="seconds for the three Brax tasks together, compiling included "
                             "(default 540; 60 with --dry)")
    parser.add_argument("--brax-seeds", type=int, default=4,
                        help="seeds of each Brax and Playground task")
    parser.add_argument("--playground-budget", type=float, default=None,
                        help="seconds for the two Playground tasks together, compiling "
                             "included (default 540; 60 with --dry)")
    parser.add_argument("--test-files", nargs="*", default=None, metavar="PATH",
                        help="the `tests` pass's test files (default: all; "
                             f"{' '.join(TESTS_DRY)} with --dry)")
    parser.add_argument("--tests-budget", type=float, default=540.0,
                        help="seconds for the `tests` pass (default 540)")
    parser.add_argument("--dry", action="store_true", help="every step with tiny budgets")
    args = parser.parse_args()
    if args.brax_budget is None:
        args.brax_budget = 60.0 if args.dry else 540.0
    if args.playground_budget is None:
        args.playground_budget = 60.0 if args.dry else 540.0

    steps, passes = args.steps, []
    if "run" in steps:
        passes = steps[steps.index("run") + 1:] or list(PASSES)
        steps = steps[:steps.index("run") + 1]
    unknown = [s for s in steps if s not in ("wheels", "install", "run")] + \
        [p for p in passes if p not in PASSES + ["tests"]]
    if unknown:
        parser.error(f"unknown step or pass {unknown[0]!r}: steps are wheels, install, run; "
                     f"passes (after run) {', '.join(PASSES + ['tests'])}.")
    if "wheels" in steps:
        download(args.wheels, args.python_version, args.also)
    if "install" in steps:
        install(args.wheels, args.site)
    if "run" in steps:
        run(args, passes)


if __name__ == "__main__":
    main()
