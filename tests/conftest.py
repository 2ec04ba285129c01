"""Set-up for the whole test session, run before any test module imports JAX.

The suite is compile-bound: it compiles a few hundred small programs and runs each for a
fraction of a second. `FAST_COMPILE`, for every test process and every process the tests
start (they inherit `XLA_FLAGS`), turns off the optimisation passes of XLA:CPU's LLVM back end
and compiles loops with its older emitters instead of the MLIR fusion emitters; together they
cut compile times about 4x (PPO's and IMPALA's tiny CartPole programs, jitted and vmapped:
20.4 s -> 4.7 s; the LLVM flags alone: 10.5 s). It also compiles each program's machine code
as one LLVM module rather than split into pieces for a thread pool, which the two test workers
keep busy anyway: about 10% less compile time (the whole suite, in one sitting: 538 -> 499
user CPU seconds, 307 -> 279 s). None of this changes a program's meaning, only how
its floats may round in the last bit, and each equality a test asserts compares programs
compiled the same way; where programs of different shapes must give the same bits (updates
one at a time against one call of `train`), both compile with the default emitters
(`helpers.EXACT`), as a user's run does. The learning tests compile with these flags too:
their programs run for seconds, but XLA's defaults would take about 8 s to compile each.
`tests/hang_probe.py`, the deadlock regression test's process, compiles with them too: the
deadlock is the runtime's, and shows under either. Set `ONPOLICY_TEST_DEFAULT_XLA=1` to run
the suite with the default back end.

Every test process, and every command-line run the tests start, shares one persistent
compilation cache (`ONPOLICY_JAX_CACHE`), new for every session: a local run starts as cold as CI's clean
clone, and nothing is read from, or written to, the user's cache (`~/.cache/onpolicy-jax`).
A test that checks the cache itself, or wants its own, sets another directory.
"""

import os
import shutil
import sys
import tempfile

import pytest

FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")

if os.environ.get("ONPOLICY_TEST_DEFAULT_XLA") != "1" and \
        FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

_MADE_HERE = "ONPOLICY_TEST_CACHE" not in os.environ  # the session's first process makes it
if _MADE_HERE:
    os.environ["ONPOLICY_TEST_CACHE"] = tempfile.mkdtemp(prefix="onpolicy-test-xla-cache-")
os.environ["ONPOLICY_JAX_CACHE"] = os.environ["ONPOLICY_TEST_CACHE"]


_STOPPED = []  # the session ended by Ctrl-C (SIGINT)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        _STOPPED.append(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The process that made the session's cache removes it at the end. A session stopped by
    Ctrl-C then leaves at once, its report and JUnit XML written: on a TPU v5e, Python's
    teardown while XLA still compiled on its worker threads ended in SIGSEGV."""
    if _MADE_HERE:
        shutil.rmtree(os.environ["ONPOLICY_TEST_CACHE"], ignore_errors=True)
    if _STOPPED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.INTERRUPTED))


def pytest_configure(config):
    """Every test process compiles through the session's persistent cache: a program that
    several test files build (the tiny CartPole runs, say) compiles once per session.

    On an accelerator the in-process tests compare with their NumPy references at full float32
    matrix-product precision (a TPU's default multiplies float32 matrices in bfloat16 passes),
    and every test that starts a Python process carries the `subprocess` marker, so that the
    suite can run there in one process without them (only one process may hold a TPU):
    `python -m pytest -o addopts="" -m "not subprocess"`. A test that starts one unmarked fails
    here, on any backend."""
    from common.host.logger import enable_compilation_cache
    enable_compilation_cache()
    import jax
    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")
    _guard_python_children()
    if PROFILE:
        jax.monitoring.register_event_duration_secs_listener(_count_compile)


# ------------------------------------------------------------------ the suite's own profile
PROFILE = os.environ.get("ONPOLICY_TEST_PROFILE")
"""A file: each test appends one JSON line, its wall and CPU seconds (its own process's and
the Python processes it started), and the seconds and number of the programs it traced,
lowered and compiled in-process (JAX's monitoring events). At the end pytest prints the
costliest files and tests. `ONPOLICY_TEST_PROFILE=/tmp/p.jsonl python -m pytest -q`:
CPU seconds, unlike wall seconds, hardly change when the machine is busy (docs/testing.md)."""
_COMPILE = {"trace": 0.0, "lower": 0.0, "compile": 0.0, "programs": 0}
_STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}


def _count_compile(event, seconds, **_):
    stage = _STAGES.get(event)
    if stage:
        _COMPILE[stage] += seconds
        _COMPILE["programs"] += stage == "compile"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not PROFILE:
        yield
        return
    import json
    import time
    before, start, compiled = os.times(), time.perf_counter(), dict(_COMPILE)
    yield
    after = os.times()
    row = {"test": item.nodeid, "wall": time.perf_counter() - start,
           "cpu": after.user + after.system - before.user - before.system,
           "children": after.children_user + after.children_system
           - before.children_user - before.children_system,
           **{k: _COMPILE[k] - compiled[k] for k in _COMPILE}}
    with open(PROFILE, "a") as f:
        f.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter):
    """With `ONPOLICY_TEST_PROFILE`: the files and the 25 tests that cost most CPU time."""
    if not PROFILE or not os.path.exists(PROFILE) or hasattr(terminalreporter.config,
                                                             "workerinput"):
        return
    import collections
    import json
    rows = [json.loads(line) for line in open(PROFILE)]
    files = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        files[r["test"].split("::")[0]].update(
            {k: r[k] for k in ("wall", "cpu", "children", "compile", "programs")})
    write = terminalreporter.write_line
    write(f"{'CPU s':>8} {'children':>8} {'compile':>8} {'programs':>8} {'wall s':>8}  file")
    for name, c in sorted(files.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["children"])):
        write(f"{c['cpu']:8.1f} {c['children']:8.1f} {c['compile']:8.1f} {c['programs']:8d} "
              f"{c['wall']:8.1f}  {name}")
    write(f"{sum(c['cpu'] + c['children'] for c in files.values()):8.1f} CPU s in all")
    for r in sorted(rows, key=lambda r: -(r["cpu"] + r["children"]))[:25]:
        write(f"{r['cpu']:8.1f} {r['children']:8.1f} {r['compile']:8.1f} {r['programs']:8d} "
              f"{r['wall']:8.1f}  {r['test']}")


# ------------------------------------------------------------------ the order of the files
COSTLIEST_FIRST = ("test_scaling.py", "test_algorithms.py", "test_playground.py",
                   "test_processes.py", "test_brax.py", "test_playground_train.py",
                   "test_checkpoint.py", "test_edges.py", "test_ppo_minimal.py")
"""The files that cost most (tens of CPU seconds each, `ONPOLICY_TEST_PROFILE`), collected
first in this order, the others after them in their own order. The two workers take whole
files (`--dist loadfile`) in collection order (`--no-loadscope-reorder`; xdist's default
orders files by their number of tests, which put some of these last): the long files start
at once and the many short ones fill in at the end, so the two workers end close together.
(Replaying one profiled run's per-file CPU seconds through the two workers: the busier one
carries 50% of the suite in this order, 52% in xdist's.)"""


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep


_TEST = {}  # the test being set up, run or torn down in this process


def pytest_runtest_setup(item):
    _TEST["item"] = item


def pytest_runtest_teardown(item):
    _TEST.pop("item", None)


def _importing(frame) -> bool:
    """Whether `frame` runs inside an `import` (a library's own probe as it loads, such as
    glfw's, which MuJoCo's renderer imports: not the test's doing)."""
    while frame is not None:
        if frame.f_code.co_filename == "<frozen importlib._bootstrap>":
            return True
        frame = frame.f_back
    return False


def _guard_python_children():
    """Fail a test that starts a Python process (`sys.executable` in its command, also behind
    `timeout`) without `@pytest.mark.subprocess`, including in the fixtures it sets up; a
    process a library starts while it is imported is its own."""
    import subprocess
    import sys
    start = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        item = _TEST.get("item")
        command = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if item is not None and sys.executable in command and \
                item.get_closest_marker("subprocess") is None and \
                not _importing(sys._getframe(1)):
            raise AssertionError(f"{item.nodeid} starts a Python process: mark it "
                                 "@pytest.mark.subprocess (deselected on an accelerator).")
        start(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded
