"""How a command-line run is driven, declared once for every algorithm: `RunOptions`.

These options say how many runs to train, where to log and checkpoint them and on which
devices and processes; they change no number a run computes (except `seed` and `num_seeds`,
which choose the runs). The algorithm's own `Config` holds everything else. The command line
shows both as one flat list of CleanRL-style flags (`--seed`, `--exp-name`, `--num-seeds`, ...).
"""

import dataclasses
import os
from typing import Literal

from common.validate import check_fields, require

MAX_SEED = 2**64 - 1
"""Seeds are 64-bit: seed s is the key `[s >> 32, s & 0xFFFFFFFF]` (`logger.seed_keys`)."""

RESUME_MUST_MATCH = ("seed", "num_seeds")
"""Run options a resumed run must keep (they choose the runs); it may change the others."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Run options: seeds, logging, checkpoints, evaluation, devices and processes."""

    presets: bool = True
    """Apply the tuned settings of the named environment (`common/presets.py`) when it has
    one; any flag given wins. `--no-presets`: the algorithm file's defaults."""
    seed: int = 1
    """Seed of the first run; run i of `num_seeds` uses seed `seed + i`."""
    num_seeds: int = 1
    """Independent runs trained together in one vmapped call, each logged as its own run."""
    exp_name: str = ""
    """Experiment name, part of the run directory name (the command line's default: the
    algorithm's name)."""
    log_dir: str = "runs"
    """TensorBoard runs go to `{log_dir}/{env_id}__{exp_name}__{seed}__{unix_time}` (a `/` in
    the id, as in `brax/hopper`, becomes `-`)."""
    log_every: int = 0
    """Each TensorBoard point is the mean of N consecutive updates (0: the fewest that keep a
    run within 1000 points per chart, which is what TensorBoard shows by default);
    evaluations are points at their own steps."""
    checkpoint_every: int = 0
    """Checkpoint every N updates (0: only at the end and on Ctrl-C), to `latest.msgpack` in
    the first run's log directory (or the file given to `--resume`)."""
    resume: str | None = None
    """Continue the run saved in this checkpoint file (or directory), exactly where it
    stopped; flags not given take the saved run's values."""
    eval_every: int = 0
    """Evaluate the deterministic policy (mode of pi) every N updates and at the end
    (0: never), logged as `eval/episodic_return`."""
    eval_episodes: int = 10
    """Episodes per evaluation, each in its own environment."""
    num_devices: int = 0
    """Devices to spread the runs over (0: all; for `--parallel seeds`, the most that divide
    `num_seeds`). On a CPU-only machine the command line makes one XLA device per core."""
    parallel: Literal["seeds", "data"] = "seeds"
    """`seeds`: split the `num_seeds` independent runs across the devices (no communication).
    `data`: train each run on every device, its `num_envs` environments split across them and
    its gradients averaged (`common/distributed.py`)."""
    coordinator_address: str | None = None
    """Several processes or hosts: `HOST:PORT` of process 0, for `jax.distributed.initialize`
    (default: `JAX_COORDINATOR_ADDRESS`). Each process drives its own devices."""
    num_processes: int = 1
    """Number of processes (default: `JAX_NUM_PROCESSES`, else 1)."""
    process_id: int = 0
    """This process's index, 0 to num_processes - 1 (default: `JAX_PROCESS_ID`); process 0
    logs and writes checkpoints."""
    distributed_timeout: int = 60
    """Seconds to wait for the other processes to start, and after which a silent (dead)
    process is declared dead so the others stop with an error."""

    def __post_init__(self):
        check_fields(self, wide=("seed",))
        require(self, "nonnegative_int", "seed")
        if self.seed + self.num_seeds - 1 > MAX_SEED:
            raise ValueError(f"--seed {self.seed} with --num-seeds {self.num_seeds} goes past "
                             f"the largest seed, 2**64 - 1; pick a smaller --seed.")
        require(self, "positive_int", "num_seeds", "eval_episodes", "num_processes",
                "distributed_timeout")
        require(self, "count", "checkpoint_every", "eval_every")
        require(self, "nonnegative_int", "log_every", "num_devices", "process_id")
        if not self.exp_name or "/" in self.exp_name or os.sep in self.exp_name:
            raise ValueError(f"--exp-name is part of the run directory's name, so it must be "
                             f"non-empty and hold no '/', got {self.exp_name!r}.")
        if self.process_id >= self.num_processes:
            raise ValueError(f"--process-id must be in [0, num_processes) = "
                             f"[0, {self.num_processes}), got {self.process_id}.")


def whole_number(text: str) -> int:
    """An integer flag's value: an integer (`500000`, `500_000`) or a whole number in
    scientific or decimal notation (`5e5`, `2.5e6`, `1000.0`), as step budgets are often
    written. `ValueError` for anything else (`1.5`, `1e-3`, `inf`)."""
    from decimal import Decimal, InvalidOperation

    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"expected an integer, such as 500000 or 5e5, got {text!r}") from None
    if number.is_finite() and number.adjusted() > 30:
        raise ValueError(f"{text!r} is too large")
    if not number.is_finite() or number != number.to_integral_value():
        raise ValueError(f"expected a whole number, such as 500000 or 5e5, got {text!r}")
    return int(number)
