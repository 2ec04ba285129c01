"""How a command-line run is driven, declared once for every algorithm: `RunOptions`.

These options say how many runs to train, where to log and checkpoint them and on which
devices and processes; they change no number a run computes (except `seed` and `num_seeds`,
which choose the runs, and the `pbt_` options, which train a population instead:
`common/host/pbt.py`). The algorithm's own `Config` holds everything else. The command line
shows both as one flat list of CleanRL-style flags (`--seed`, `--exp-name`, `--num-seeds`, ...).
"""

import dataclasses
import math
import os
from typing import Literal

from common.validate import check_fields, flag, require

MAX_SEED = 2**64 - 1
"""Seeds are 64-bit: seed s is the key `[s >> 32, s & 0xFFFFFFFF]` (`logger.seed_keys`)."""

PBT_FLAGS = ("pbt_interval", "pbt_search", "pbt_fraction", "pbt_perturb", "pbt_resample")
"""The options that only mean something with `pbt_population` (each None or empty without)."""

RESUME_MUST_MATCH = ("seed", "num_seeds", "pbt_population", *PBT_FLAGS)
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
    pbt_population: int = 0
    """Population-based training (docs/pbt.md): train N members side by side in one program
    (at least 2; 0: no PBT); every `--pbt-interval` updates the worst quarter take the state
    of members of the best quarter, with their searched hyperparameters perturbed. The
    members take the place of seeds: one TensorBoard run each, in one run directory."""
    pbt_interval: int | None = None
    """Updates between two PBT steps; it must divide the run's updates (needed with
    --pbt-population)."""
    pbt_search: tuple[str, ...] = ()
    """The hyperparameters PBT searches, each `name=low:high` (uniform) or
    `name=low:high:log` (log-uniform, low > 0), e.g. `--pbt-search learning_rate=1e-4:1e-2:log
    ent_coef=0:0.05`; the names are the float hyperparameters of the algorithm's `HParams`
    (none: members are only copied, a tournament)."""
    pbt_fraction: float | None = None
    """The share of the population replaced at each PBT step, and the share copied from:
    max(1, floor(fraction x N)) members, in (0, 0.5] (default 0.25)."""
    pbt_perturb: float | None = None
    """f: a copied hyperparameter is multiplied by 1 + U(-f, f), then clipped into its range,
    in [0, 1) (default 0.2)."""
    pbt_resample: float | None = None
    """The probability that a copied hyperparameter is redrawn from its range instead of
    perturbed, in [0, 1] (default 0)."""

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
        self._check_pbt()

    def _check_pbt(self):
        """The PBT options on their own (what needs the algorithm's config, the names and the
        interval, is `common/host/pbt.py`'s `check`)."""
        given = [f for f in PBT_FLAGS if getattr(self, f) not in (None, ())]
        require(self, "nonnegative_int", "pbt_population")
        if not self.pbt_population:
            if given:
                raise ValueError(f"{flag(given[0])} is a PBT option, given without "
                                 "--pbt-population; add --pbt-population N (N >= 2) to train a "
                                 "population, or leave the PBT options out.")
            return
        if self.pbt_population < 2:
            raise ValueError(f"--pbt-population must be at least 2 (PBT copies between "
                             f"members; 0: no PBT), got {self.pbt_population}.")
        if self.pbt_interval is None:
            raise ValueError("--pbt-population needs --pbt-interval UPDATES, the updates "
                             "between PBT steps (a divisor of the run's updates).")
        require(self, "positive_int", "pbt_interval")
        search_ranges(self.pbt_search)
        if self.pbt_fraction is not None and not 0 < self.pbt_fraction <= 0.5:
            raise ValueError(f"--pbt-fraction must be in (0, 0.5] (the replaced and the copied "
                             f"shares must not overlap), got {self.pbt_fraction!r}.")
        for name, rule in (("pbt_perturb", "unit_open"), ("pbt_resample", "unit")):
            if getattr(self, name) is not None:
                require(self, rule, name)
        if self.num_seeds > 1:
            raise ValueError(f"--num-seeds {self.num_seeds} with --pbt-population: the "
                             "population's members take the place of seeds (one TensorBoard "
                             "run each); leave --num-seeds out, and start one command per "
                             "--seed for several PBT runs.")
        if self.parallel == "data":
            raise ValueError("--parallel data with --pbt-population: PBT splits its members "
                             "across the devices (the default, --parallel seeds); leave "
                             "--parallel out.")
        if self.num_processes > 1:
            raise ValueError("--num-processes with --pbt-population: PBT runs in one process "
                             "(on one or several of its devices, --num-devices).")


def search_ranges(texts) -> list:
    """`[(name, low, high, log), ...]` from `--pbt-search`'s `name=low:high[:log]` texts;
    `ValueError` naming the text and the fix for anything else (malformed, low > high, a log
    range with low <= 0, a name given twice). The names are checked against the algorithm's
    hyperparameters by `common/host/pbt.py`."""
    ranges = []
    for text in texts:
        what = f"--pbt-search {text!r}"
        name, equals, bounds = str(text).partition("=")
        parts = bounds.split(":")
        if not equals or not name.strip() or len(parts) not in (2, 3) or \
                (len(parts) == 3 and parts[2] != "log"):
            raise ValueError(f"{what} is not a range; write name=low:high (uniform) or "
                             "name=low:high:log (log-uniform), e.g. "
                             "learning_rate=1e-4:1e-2:log.")
        ends = []
        for end, part in zip(("low", "high"), parts):
            try:
                value = float(part)
            except ValueError:
                raise ValueError(f"{what}: its {end} end {part!r} is not a number.") from None
            if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                raise ValueError(f"{what}: its {end} end {part!r} must be a finite number "
                                 "within float32's range (about 3.4e38).")
            ends.append(value)
        (low, high), log = ends, len(parts) == 3
        name = name.strip()
        if low > high:
            raise ValueError(f"{what}: low {parts[0]} > high {parts[1]}; write "
                             f"{name}={parts[1]}:{parts[0]}{':log' * log}.")
        if log and low <= 0:
            raise ValueError(f"{what}: a log-scaled range needs low > 0, got {parts[0]}; "
                             f"raise low or drop ':log'.")
        if name in [r[0] for r in ranges]:
            raise ValueError(f"--pbt-search names {name!r} twice; give each hyperparameter "
                             "one range.")
        ranges.append((name, low, high, log))
    return ranges


FLOAT32_MAX = 3.4028234663852886e38


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
