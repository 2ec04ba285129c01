"""Population-based training (PBT): a population trained in one program, its worst members
replaced now and then by perturbed copies of its best.

Jaderberg, Dalibard, Osindero, Czarnecki, Donahue, Razavi, Vinyals, Green, Dunning, Simonyan,
Fernando, Kavukcuoglu (2017), "Population Based Training of Neural Networks",
arXiv:1711.09846: its `exploit` by truncation selection and its `explore` by perturbation
(or, with some probability, resampling from the prior), in the continuous form EvoRL runs
in JAX (Zheng, Cheng, Tan (2025), "EvoRL: A GPU-accelerated Framework for Evolutionary
Reinforcement Learning", arXiv:2501.15129; its PBT workflow). Every member trains for
`interval` updates, then, ranked by the mean episodic return of those updates,

    n        = max(1, floor(fraction * P))              (members replaced; fraction <= 1/2)
    bottom   = the n worst members,  top = the n best   (disjoint)
    source_i = a member of `top` drawn uniformly        (i in bottom; i itself otherwise)
    state_i  <- state_{source_i}, every field but `env` and `key`
    h_i      <- clip(h_{source_i} * (1 + U(-f, f)), low, high)    for each searched h
                (with probability `resample`: a fresh draw from [low, high] instead,
                 log-uniform for a log-scaled range)

Scores that are NaN (no episode ended in the interval) rank below every number; ties rank
the lower member index higher. A member not in `bottom` keeps everything bit for bit.

The paper perturbs by a factor of 0.8 or 1.2; EvoRL, and this, by 1 + U(-f, f), f = 0.2.
What differs from EvoRL: a member keeps its own environments and its own random stream when
it is replaced (EvoRL copies the whole workflow state), so copies do not replay their
source's episodes; the score is the training return of the interval, not a separate
evaluation; one `fraction` sizes both the bottom and the top, rounded down (EvoRL rounds two
ratios); each searched hyperparameter draws its own perturbation; and no step follows the
last interval (it would hand back, as the final population, copies trained by no one).

`make_pbt_train(train, num_updates, space)` runs it all in one compiled program: the
population's runs are `vmap(train.run_updates)`, and the exploit/explore step is array
operations over the population axis (a sort, gathers, `jnp.where`), so it jits and never
returns to the host. docs/pbt.md has the example and what is copied and why.
"""

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

FLOAT32_MAX = 3.4028234663852886e38

OWN_FIELDS = ("env", "key")
"""The `TrainState` fields a replaced member keeps as its own: its environments (their
episodes, and their reward-normalisation returns) and its random stream."""


# --------------------------------------------------------------------------------------------
# The search space (plain Python: building one starts no JAX backend)
# --------------------------------------------------------------------------------------------
class Range(NamedTuple):
    """One searched hyperparameter: `name`, a float field of the algorithm's `HParams`, drawn
    from [low, high], uniformly or, with `log`, log-uniformly (then low > 0)."""

    name: str
    low: float
    high: float
    log: bool = False


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """What PBT searches and how (the rule in the module docstring)."""

    ranges: tuple[Range, ...]
    """The searched hyperparameters; the others keep their base values (none: PBT only
    copies, a tournament of seeds)."""
    population: int
    """P, the members trained side by side (at least 2)."""
    interval: int
    """Updates between two PBT steps (it must divide the run's updates)."""
    fraction: float = 0.25
    """The share of the population replaced at each step, and the share copied from:
    n = max(1, floor(fraction * P)), in (0, 0.5]."""
    perturb: float = 0.2
    """f: a copied value is multiplied by 1 + U(-f, f), then clipped into its range; 0 copies
    values unchanged. In [0, 1)."""
    resample: float = 0.0
    """The probability that a copied value is redrawn from its range instead of perturbed
    (each hyperparameter on its own). In [0, 1]."""
    exploit: bool = True
    """False: no member is copied; the bottom members only perturb their own searched values
    (exploration alone, for ablations; with `perturb=0, resample=0` the population is P
    independent runs)."""

    def __post_init__(self):
        if not isinstance(self.ranges, tuple) or \
                not all(isinstance(r, Range) for r in self.ranges):
            raise ValueError("SearchSpace.ranges must be a tuple of pbt.Range(name, low, high, "
                             f"log=False), got {self.ranges!r}.")
        names = [r.name for r in self.ranges]
        for r in self.ranges:
            _check_range(r)
            if names.count(r.name) > 1:
                raise ValueError(f"SearchSpace.ranges names {r.name!r} {names.count(r.name)} "
                                 "times; give each hyperparameter one Range.")
        if not _int(self.population) or self.population < 2:
            raise ValueError(f"SearchSpace.population must be an integer >= 2 (PBT copies "
                             f"between members), got {self.population!r}.")
        if not _int(self.interval) or self.interval < 1:
            raise ValueError(f"SearchSpace.interval must be a positive integer (updates "
                             f"between PBT steps), got {self.interval!r}.")
        if not _real(self.fraction) or not 0.0 < self.fraction <= 0.5:
            raise ValueError(f"SearchSpace.fraction must be in (0, 0.5] (the bottom and top "
                             f"shares must not overlap), got {self.fraction!r}.")
        if not _real(self.perturb) or not 0.0 <= self.perturb < 1.0:
            raise ValueError(f"SearchSpace.perturb must be in [0, 1) (1 + U(-f, f) stays "
                             f"positive), got {self.perturb!r}.")
        if not _real(self.resample) or not 0.0 <= self.resample <= 1.0:
            raise ValueError(f"SearchSpace.resample must be a probability in [0, 1], got "
                             f"{self.resample!r}.")
        if not isinstance(self.exploit, bool):
            raise ValueError(f"SearchSpace.exploit must be True or False, got "
                             f"{self.exploit!r}.")

    @property
    def num_replaced(self) -> int:
        """n: the members replaced at each step, and the members they are copied from."""
        return max(1, math.floor(round(self.fraction * self.population, 9)))

    def check_names(self, valid) -> None:
        """Raise `ValueError` for a searched name that is not in `valid` (the fields of the
        algorithm's `HParams`), listing those."""
        for r in self.ranges:
            if r.name not in valid:
                raise ValueError(f"SearchSpace searches {r.name!r}, which is not a float "
                                 f"hyperparameter of this algorithm; use one of "
                                 f"{', '.join(valid)}.")


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_range(r: Range):
    if not isinstance(r.name, str):
        raise ValueError(f"pbt.Range needs a hyperparameter's name first, got {r.name!r}.")
    for end in ("low", "high"):
        if not _real(getattr(r, end)):
            raise ValueError(f"Range {r.name!r}: {end} must be a finite number, got "
                             f"{getattr(r, end)!r}.")
        if abs(getattr(r, end)) > FLOAT32_MAX:
            raise ValueError(f"Range {r.name!r}: {end} {getattr(r, end)!r} is beyond float32's "
                             f"range (about 3.4e38), the hyperparameters' type in the program.")
    if r.low > r.high:
        raise ValueError(f"Range {r.name!r}: low {r.low!r} > high {r.high!r}; give low <= high.")
    if not isinstance(r.log, bool):
        raise ValueError(f"Range {r.name!r}: log must be True or False, got {r.log!r}.")
    if r.log and r.low <= 0:
        raise ValueError(f"Range {r.name!r}: a log-scaled range needs low > 0, got low "
                         f"{r.low!r}; raise low or use log=False.")


# --------------------------------------------------------------------------------------------
# Drawing and perturbing values
# --------------------------------------------------------------------------------------------
def draw(key, r: Range, shape, dtype=jnp.float32):
    """Values from `r`'s range: U(low, high), or exp(U(log low, log high)) with `r.log`."""
    if r.log:
        u = jax.random.uniform(key, shape, dtype, math.log(r.low), math.log(r.high))
        return jnp.clip(jnp.exp(u), r.low, r.high).astype(dtype)
    return jnp.clip(jax.random.uniform(key, shape, dtype, r.low, r.high), r.low,
                    r.high).astype(dtype)


def explore(key, values, r: Range, perturb: float, resample: float):
    """Each of `values` [P] explored once: clip(x * (1 + U(-f, f)), low, high), or with
    probability `resample` a fresh `draw` from the range. Returns [P], the dtype of
    `values`."""
    values = jnp.asarray(values)
    key_u, key_coin, key_draw = jax.random.split(key, 3)
    u = jax.random.uniform(key_u, values.shape, values.dtype, -1.0, 1.0)
    perturbed = jnp.clip(values * (1 + perturb * u), r.low, r.high).astype(values.dtype)
    redraw = jax.random.uniform(key_coin, values.shape) < resample
    return jnp.where(redraw, draw(key_draw, r, values.shape, values.dtype), perturbed)


def initial_hparams(key, base_hparams, space: SearchSpace, population: int | None = None):
    """The population's hyperparameters, every field [P]: each searched field drawn from its
    range (`draw`: uniform, log-uniform when log), the others `base_hparams`' value for all.

    Args:
      key: a PRNG key.
      base_hparams: the algorithm's `HParams`, scalar fields (`config.hparams()`).
      space: the `SearchSpace`; its names must be fields of `base_hparams`.
      population: P (default `space.population`).
    """
    population = space.population if population is None else population
    space.check_names(type(base_hparams)._fields)
    _check_scalars("initial_hparams", base_hparams)
    keys = dict(zip([r.name for r in space.ranges], jax.random.split(key, len(space.ranges))))
    ranges = {r.name: r for r in space.ranges}

    def field(name, x):
        x = jnp.asarray(x)
        if name in ranges:
            return draw(keys[name], ranges[name], (population,), _float_dtype(x))
        return jnp.broadcast_to(x, (population,))

    return type(base_hparams)(*(field(n, x) for n, x in zip(base_hparams._fields,
                                                             base_hparams)))


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


# --------------------------------------------------------------------------------------------
# The PBT step: exploit (truncation selection, copy) and explore (perturb)
# --------------------------------------------------------------------------------------------
def rank(scores):
    """`order` [P]: the members best first (NaN below every number, ties the lower index
    first), and `place` [P]: each member's position in it (0: the best)."""
    scores = jnp.asarray(scores)
    nan = jnp.isnan(scores)
    # sorted by NaN first (numbers before NaN), then by -score (best first); stable
    order = jnp.lexsort((jnp.where(nan, 0, -scores), nan))
    place = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return order, place


def exploit_and_explore(key, states, hparams, scores, space: SearchSpace):
    """One PBT step over a population (the rule in the module docstring).

    Args:
      key: a PRNG key for the step.
      states: the algorithm's `TrainState` with a leading population axis [P] on every leaf,
        a NamedTuple with fields `env` and `key` (kept per member, `OWN_FIELDS`).
      hparams: the population's `HParams`, every field [P].
      scores: [P], each member's score (higher is better; NaN ranks lowest).
      space: the `SearchSpace` (P = `space.population`).

    Returns:
      `(states, hparams, source)`: a replaced member i holds the state of member `source[i]`
      (but its own `env` and `key`) and its explored hyperparameters; every other member
      keeps its own bit for bit, `source[i] = i`. `source` is int32 [P].
    """
    P, n = space.population, space.num_replaced
    _check_population("exploit_and_explore", P, states=states, hparams=hparams, scores=scores)
    space.check_names(type(hparams)._fields)
    key_pick, key_explore = jax.random.split(key)

    # EXPLOIT: the n worst members copy members drawn uniformly from the n best
    order, place = rank(scores)
    replaced = place >= P - n
    members = jnp.arange(P, dtype=jnp.int32)
    source = members
    if space.exploit:
        pick = order[jax.random.randint(key_pick, (P,), 0, n)].astype(jnp.int32)
        source = jnp.where(replaced, pick, members)
    take = lambda tree: jax.tree.map(lambda x: jnp.asarray(x)[source], tree)  # noqa: E731
    states = states._replace(**{f: take(getattr(states, f)) for f in states._fields
                                if f not in OWN_FIELDS})
    hparams = take(hparams)

    # EXPLORE: the replaced members' searched values, perturbed (or redrawn)
    keys = jax.random.split(key_explore, max(1, len(space.ranges)))
    hparams = hparams._replace(**{
        r.name: jnp.where(replaced, explore(k, getattr(hparams, r.name), r, space.perturb,
                                            space.resample), getattr(hparams, r.name))
        for r, k in zip(space.ranges, keys)})
    return states, hparams, source


def _check_scalars(fn: str, hparams):
    for name, x in zip(hparams._fields, hparams):
        if jnp.ndim(x) != 0:
            raise ValueError(f"{fn}: base hparams field `{name}` has shape {jnp.shape(x)}, "
                             "expected a scalar (one run's `config.hparams()`).")


def _check_population(fn: str, population: int, **trees):
    """Raise `ValueError` naming the first leaf whose leading axis is not `population`."""
    for name, tree in trees.items():
        if name == "states" and not all(hasattr(tree, f) for f in OWN_FIELDS + ("_replace",)):
            raise ValueError(f"{fn}: `states` must be the algorithm's TrainState NamedTuple "
                             f"(with fields {', '.join(OWN_FIELDS)}), got {type(tree).__name__}.")
        for path, x in jax.tree_util.tree_leaves_with_path(tree):
            shape = jnp.shape(x)
            if not shape or shape[0] != population or (name != "states" and len(shape) != 1):
                want = f"[{population}, ...]" if name == "states" else f"[{population}]"
                raise ValueError(f"{fn}: `{name}{jax.tree_util.keystr(path)}` has shape "
                                 f"{shape}, expected {want} (one row per member of the "
                                 f"population of {population}).")


# --------------------------------------------------------------------------------------------
# The whole population's run, in one program
# --------------------------------------------------------------------------------------------
class PBTState(NamedTuple):
    """Everything a PBT run carries between intervals (checkpoint it between chunks)."""

    states: Any
    """The algorithm's `TrainState`, leading axis [P]."""
    hparams: Any
    """The population's `HParams`, every field [P]."""
    key: jax.Array
    """The PBT's own key: the step after interval k draws from `fold_in(key, k)`."""


class Lineage(NamedTuple):
    """One row per interval [I, P], what a host writes as the population's family tree."""

    source: jax.Array
    """int32: whose state each member holds after the interval's step (itself if kept)."""
    hparams: Any
    """The `HParams` after the step: those of the next interval's updates."""
    score: jax.Array
    """The score the step ranked: the member's mean episodic return over the interval."""


def population_keys(key, population: int):
    """`(member_keys [P], hparams_key, pbt_key)` from a PBT run's key: member i's run is
    `train(member_keys[i], hparams[i])` until its first copy."""
    key_members, key_hparams, key_pbt = jax.random.split(key, 3)
    return jax.random.split(key_members, population), key_hparams, key_pbt


def make_pbt_train(train, num_updates: int, space: SearchSpace):
    """Build `pbt_train(key, hparams=None) -> (states, metrics, lineage)`, jittable.

    Args:
      train: an algorithm's `make_train(config)` (its `init` and `run_updates`).
      num_updates: the run's updates, `config.num_updates` (the learning-rate schedules count
        them); `space.interval` must divide it.
      space: the `SearchSpace`.

    `pbt_train(key, hparams)`: `hparams` is the base `HParams` (scalars; None: the config's,
    `train.hparams()`), whose searched fields `initial_hparams` draws per member, or a
    population's `HParams` [P], used as given. Returns the final `TrainState` [P], the metrics
    as `vmap(train)` gives them ([P, num_updates, ...]) and the `Lineage` [I, P] of the
    I = num_updates / interval intervals. Every member runs the same update numbers, so an
    annealed learning rate follows its schedule across copies (a copy carries on with its
    source's optimiser state, at its own, explored, base learning rate).

    The pieces, for a driver that runs whole intervals in chunks and checkpoints between
    them: `pbt_train.init(key, hparams=None) -> PBTState` and
    `pbt_train.run_intervals(pbt_state, intervals) -> (PBTState, metrics, Lineage)` for the
    intervals numbered `intervals` (a 1-D int array, in order); `pbt_train(key, hparams)` is
    `init`, then `run_intervals` over all of them.
    Raises `ValueError` before anything compiles for a bad space or interval.
    """
    if not _int(num_updates) or num_updates < 1:
        raise ValueError(f"make_pbt_train: num_updates must be a positive integer, got "
                         f"{num_updates!r}.")
    if num_updates % space.interval:
        raise ValueError(f"SearchSpace.interval {space.interval} does not divide the run's "
                         f"{num_updates} updates; pick an interval that divides it.")
    if hasattr(train, "hparams"):
        space.check_names(type(train.hparams())._fields)
    P, interval = space.population, space.interval
    num_intervals = num_updates // interval

    def population_hparams(key, hparams):
        if hparams is None:
            if not hasattr(train, "hparams"):
                raise ValueError("pbt_train: this `train` has no `hparams()`; pass the base "
                                 "HParams (`config.hparams()`).")
            hparams = train.hparams()
        if all(jnp.ndim(x) == 0 for x in hparams):
            return initial_hparams(key, hparams, space)
        _check_population("pbt_train", P, hparams=hparams)
        space.check_names(type(hparams)._fields)
        return hparams

    def init(key, hparams=None) -> PBTState:
        """The population: member i is `train.init(member_keys[i], hparams[i])`."""
        member_keys, key_hparams, key_pbt = population_keys(key, P)
        hparams = population_hparams(key_hparams, hparams)
        return PBTState(jax.vmap(train.init)(member_keys, hparams), hparams, key_pbt)

    def run_interval(pbt: PBTState, k):
        """Interval k: updates k * interval, ..., then the PBT step (none after the last)."""
        updates = k * interval + jnp.arange(interval)
        states, metrics = jax.vmap(train.run_updates, in_axes=(0, 0, None))(
            pbt.states, pbt.hparams, updates)
        score = jnp.nanmean(metrics["episodic_return"], axis=1)
        states, hparams, source = lax.cond(
            k == num_intervals - 1,
            lambda: (states, pbt.hparams, jnp.arange(P, dtype=jnp.int32)),
            lambda: exploit_and_explore(jax.random.fold_in(pbt.key, k), states, pbt.hparams,
                                        score, space))
        return PBTState(states, hparams, pbt.key), (metrics, Lineage(source, hparams, score))

    def run_intervals(pbt: PBTState, intervals):
        """Continue `pbt` through the intervals numbered `intervals` (a 1-D int array)."""
        pbt, (metrics, lineage) = lax.scan(run_interval, pbt, jnp.asarray(intervals))
        # [chunk, P, interval, ...] -> [P, chunk * interval, ...], as one vmapped run's rows
        metrics = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1).reshape(
            (P, -1) + x.shape[3:]), metrics)
        return pbt, metrics, lineage

    def pbt_train(key, hparams=None):
        """The whole PBT run in one call: `(final TrainState [P], metrics, Lineage)`."""
        pbt, metrics, lineage = run_intervals(init(key, hparams), jnp.arange(num_intervals))
        return pbt.states, metrics, lineage

    pbt_train.init, pbt_train.run_intervals = init, run_intervals
    pbt_train.num_intervals, pbt_train.space = num_intervals, space
    return pbt_train
