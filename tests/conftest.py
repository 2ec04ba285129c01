"""Set-up for the whole test session, run before any test module imports JAX.

The suite is compile-bound: it compiles a few hundred small programs and runs each for a
fraction of a second. `FAST_COMPILE` turns off the optimisation passes of XLA:CPU's LLVM back
end for every test process and every process the tests start (they inherit `XLA_FLAGS`),
which about halves compile times (PPO's tiny CartPole program: 6.1 s -> 3.2 s) and changes no
program's meaning: each equality a test asserts compares programs compiled the same way.
`tests/hang_probe.py` sets its own flags, so the deadlock regression test runs with XLA's
defaults. Set `ONPOLICY_TEST_DEFAULT_XLA=1` to run the suite with the default back end.
"""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

if os.environ.get("ONPOLICY_TEST_DEFAULT_XLA") != "1" and \
        FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
