"""Set-up for the whole test session, run before any test module imports JAX.

The suite is compile-bound: it compiles a few hundred small programs and runs each for a
fraction of a second. `FAST_COMPILE` turns off the optimisation passes of XLA:CPU's LLVM back
end for every test process and every process the tests start (they inherit `XLA_FLAGS`),
which about halves compile times (PPO's tiny CartPole program: 6.1 s -> 3.2 s) and changes no
program's meaning: each equality a test asserts compares programs compiled the same way.
`tests/hang_probe.py` sets its own flags, so the deadlock regression test runs with XLA's
defaults. Set `ONPOLICY_TEST_DEFAULT_XLA=1` to run the suite with the default back end.

The command-line runs the tests start share one persistent compilation cache
(`ONPOLICY_JAX_CACHE`), new for every session: a local run starts as cold as CI's clean
clone, and nothing is read from, or written to, the user's cache (`~/.cache/onpolicy-jax`).
A test that checks the cache itself, or wants its own, sets another directory.
"""

import os
import shutil
import tempfile

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

if os.environ.get("ONPOLICY_TEST_DEFAULT_XLA") != "1" and \
        FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

_MADE_HERE = "ONPOLICY_TEST_CACHE" not in os.environ  # the session's first process makes it
if _MADE_HERE:
    os.environ["ONPOLICY_TEST_CACHE"] = tempfile.mkdtemp(prefix="onpolicy-test-xla-cache-")
os.environ["ONPOLICY_JAX_CACHE"] = os.environ["ONPOLICY_TEST_CACHE"]


def pytest_unconfigure(config):
    """The process that made the session's cache removes it at the end."""
    if _MADE_HERE:
        shutil.rmtree(os.environ["ONPOLICY_TEST_CACHE"], ignore_errors=True)
