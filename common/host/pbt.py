"""Population-based training from the command line: `--pbt-population N --pbt-interval U
--pbt-search name=low:high[:log] ...` (docs/pbt.md).

The population takes the place of the seeds: `common/pbt.py`'s `make_pbt_train` runs it, and
this module drives it through `common/host/cli.py`'s loop, chunks of whole intervals, each
one compiled call of `pbt_train.run_intervals`. What differs from a run of seeds:

- the state is the `PBTState` (the members' TrainState [N], their hyperparameters [N], the
  PBT key), checkpointed whole with the lineage so far (the record's `pbt` field), so an
  interrupted run resumes bitwise;
- the run has one directory, `{log_dir}/{env_id}__{exp_name}__{seed}__{unix_time}/`, which
  holds the checkpoint and `pbt_lineage.json`; each member is a TensorBoard run inside it
  (`member0`, `member1`, ...), its hyperparameters logged per update beside its returns
  (`pbt/learning_rate`, ...);
- the lineage, per PBT step each member's score, source and hyperparameters, is rewritten
  to `pbt_lineage.json` after every chunk, atomically as checkpoints are;
- `--eval-every` evaluates the best-scoring member of the latest interval (a line per
  evaluation names it), logged to that member's TensorBoard run;
- the closing line names the best member and its hyperparameters.

The members are split across the devices (`--num-devices`) in one program over the mesh,
their axis sharded: the PBT step gathers across members, which the per-device programs of a
run of seeds (`Layout.compile`) cannot.
"""

import concurrent.futures
import dataclasses
import json
import math
import os
import time
import types
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from common import pbt
from common.evaluate import evaluate
from common.host import checkpoint, contract, logger
from common.host.devices import Layout, fail, fetch
from common.host.flags import check_population, hparam_names
from common.host.options import RunOptions, search_ranges
from common.host.output import eval_keys, first_non_finite, recent_returns, write_boards
from common.host.preflight import check_fits_in_memory, claim_run_dirs, resume_into
from common.host.session import Session, last_checkpoint

LINEAGE = "pbt_lineage.json"
"""The lineage's file name, in the run directory beside the checkpoint."""


def space_of(run: RunOptions) -> pbt.SearchSpace:
    """The `SearchSpace` of the PBT options (unset ones: `SearchSpace`'s defaults)."""
    given = {k: getattr(run, f"pbt_{k}") for k in ("fraction", "perturb", "resample")}
    return pbt.SearchSpace(tuple(pbt.Range(*r) for r in search_ranges(run.pbt_search)),
                           population=run.pbt_population, interval=run.pbt_interval,
                           **{k: v for k, v in given.items() if v is not None})


def member_names(run_dir: str, population: int) -> list[str]:
    """The members' TensorBoard runs, inside the run directory: `member0`, ... (zero-padded
    to sort in order)."""
    width = len(str(population - 1))
    return [f"{run_dir}/member{i:0{width}d}" for i in range(population)]


@dataclasses.dataclass
class Population:
    """A PBT run's host side, the `Session`'s `pbt`: the search and the lineage so far."""

    space: pbt.SearchSpace
    pbt_train: object
    fixed: dict
    """The hyperparameters not searched, name -> the config's value (every member's)."""
    initial: dict | None = None
    """The members' first searched hyperparameters, name -> [N] (NumPy); None until a fresh
    run's first chunk gives them (`log_chunk`)."""
    lineage: list = dataclasses.field(default_factory=list)
    """Per chunk, `{"source": [k, N], "score": [k, N], "hparams": {name: [k, N]}}` (NumPy)."""

    def joined(self) -> dict:
        """The lineage so far, the chunks joined: one row per PBT step."""
        empty = {"source": np.zeros((0, self.space.population), np.int32),
                 "score": np.zeros((0, self.space.population), np.float32),
                 "hparams": {r.name: np.zeros((0, self.space.population), np.float32)
                             for r in self.space.ranges}}
        return jax.tree.map(lambda *rows: np.concatenate(rows), empty, *self.lineage)

    def record(self) -> dict:
        """The checkpoint's `pbt` field: the first hyperparameters (none yet: {}) and the
        lineage."""
        return {"initial": dict(self.initial or {}), **self.joined()}

    def best(self) -> int:
        """The member ranked first by the latest interval's score (`pbt.rank`'s rule: NaN
        last, ties the lower index)."""
        score = self.joined()["score"][-1]
        return sorted(range(len(score)), key=lambda i: (np.isnan(score[i]), -score[i], i))[0]

    def searched(self, member: int, hparams: dict) -> str:
        """`name=value, ...` of the searched hyperparameters of `member` in `hparams`."""
        return ", ".join(f"{r.name}={float(hparams[r.name][member]):.4g}"
                         for r in self.space.ranges) or "nothing searched"


# --------------------------------------------------------------------------------------------
# The run: set up, compile, train in chunks (cli's loop), summarise
# --------------------------------------------------------------------------------------------
class PopulationLayout(Layout):
    """`Layout` for a population: the members split across the devices like seeds, the
    `PBTState` laid out as `state` (the members' axis split, the PBT key on every device),
    and each program compiled as one over the mesh (`compile`)."""

    def __init__(self, run: RunOptions, num_envs: int, template):
        population = run.pbt_population
        if run.num_devices and population % run.num_devices:
            fail(f"--pbt-population {population} does not divide among {run.num_devices} "
                 "devices; pick a multiple (or --num-devices that divides it).")
        super().__init__(types.SimpleNamespace(num_devices=run.num_devices, parallel="seeds",
                                               num_seeds=population), num_envs,
                         template.states)
        self.state = pbt.PBTState(self.state, jax.tree.map(lambda _: self.seeds,
                                                           template.hparams), P())

    def compile(self, fn, in_specs, out_specs, *shapes):
        """`jit(fn)` compiled for `shapes` (which carry their shardings) as one program over
        the mesh, its outputs laid out by `out_specs`; XLA partitions the members' axis and
        the PBT step's gathers across it."""
        return jax.jit(fn, out_shardings=self.shardings(out_specs)).lower(*shapes).compile()


def start_or_resume(algo: str, config, run: RunOptions, train, resumed=None) -> Session:
    """`cli.start_or_resume` for a population: `make_pbt_train(train, ...)` laid out on the
    devices with its first state, fresh from `pbt_train.init` (compiled on a thread of its own
    while the chunks are traced), or with `--resume` the checkpoint's, its lineage included.
    Checked first, as a run of seeds: the PBT options (`flags.check_population`, for a Python
    caller too), the state fits, the run directory is claimed, the checkpoint writable."""
    try:
        check_population(config, run)
        pbt_train = pbt.make_pbt_train(train, config.num_updates, space_of(run))
    except ValueError as error:
        fail(error)
    key = logger.seed_keys(run.seed, 1)[0]  # one key: the members' keys come from it
    template = jax.eval_shape(pbt_train.init, jax.ShapeDtypeStruct(key.shape, key.dtype))
    contract.check(algo, template.states, contract.TrainState,
                   "the state its train.init returns")
    layout = PopulationLayout(run, config.num_envs, template)
    check_fits_in_memory(config, template, layout)
    s = Session(algo, config, run, train, layout, template, layout.put(key, P()), None)
    names = {r.name for r in pbt_train.space.ranges}
    s.pbt = Population(pbt_train.space, pbt_train, {
        n: getattr(config, n) for n in hparam_names(config) or type(config.hparams())._fields
        if n not in names})
    if run.resume:
        record = resume_into(s, resumed)
        saved = record.get("pbt")
        if saved is None or len(saved["source"]) != s.first // run.pbt_interval:
            fail(f"{run.resume!r} holds no PBT lineage for its {s.first} updates; resume it "
                 "with the code that wrote it.")
        s.pbt.initial = {k: np.asarray(v) for k, v in saved["initial"].items()} or None
        s.pbt.lineage = [{"source": np.asarray(saved["source"], np.int32),
                          "score": np.asarray(saved["score"], np.float32),
                          "hparams": {k: np.asarray(v, np.float32)
                                      for k, v in saved["hparams"].items()}}]
        return s
    s.run_time = int(time.time())
    run_dir = claim_run_dirs(config, run, s.run_time, s.writer)[0]  # one: no seeds
    s.names = member_names(run_dir, run.pbt_population)
    s.path = os.path.join(run.log_dir, run_dir, checkpoint.LATEST)
    if s.writer:
        try:
            checkpoint.check_writable(s.path)
        except checkpoint.CheckpointError as error:
            fail(error)
    lowered = jax.jit(pbt_train.init, out_shardings=layout.shardings(layout.state)).lower(
        s.keys, None)
    compiling = concurrent.futures.ThreadPoolExecutor(1)  # as cli.start_or_resume
    s.initial = compiling.submit(lambda: partial(lowered.compile(), s.keys, None))
    compiling.shutdown(wait=False)
    return s


def compile_programs(s: Session, chunk: int):
    """`(run_chunk, run_eval, chunk)` as `cli.compile_programs` gives them, for chunks of
    `chunk` updates, whole intervals (`cli.chunk_of`). `run_chunk(pbt_state, _, updates)`
    returns `(pbt_state, metrics, finite, lineage)`: `metrics` [N, updates] with
    `pbt/<name>`, the value each member used in each update, `finite` [N], `lineage` the
    chunk's `Lineage` [intervals, N]. `run_eval(states, member, key)`: the member's mean
    return over `--eval-episodes`. Prints the run's PBT line (`describe`)."""
    run, layout, space = s.run, s.layout, s.pbt.space
    interval = space.interval
    state_shapes = layout.shapes(s.template, layout.state)

    def run_intervals(pbt_state, updates):  # the name the compilation cache files carry
        before = pbt_state.hparams
        pbt_state, metrics, lineage = s.pbt.pbt_train.run_intervals(
            pbt_state, updates[::interval] // interval)
        for r in space.ranges:  # the values used: those before each interval's step
            used = jnp.concatenate([getattr(before, r.name)[None],
                                    getattr(lineage.hparams, r.name)[:-1]])
            metrics[f"pbt/{r.name}"] = jnp.repeat(used.T, interval, axis=1)
        finite = jax.vmap(lambda params: jnp.stack(
            [jnp.isfinite(p).all() for p in jax.tree.leaves(params)]).all())(
            pbt_state.states.params)
        return pbt_state, metrics, finite, lineage

    def compile_chunk(length: int):
        return layout.compile(run_intervals, None, (layout.state, layout.seeds, layout.seeds,
                                                    P()),
                              state_shapes, layout.shapes(jnp.arange(length), P()))

    left = s.config.num_updates - s.first
    programs = {n: compile_chunk(n) for n in sorted({min(chunk, left), left % chunk}) if n}

    def run_chunk(pbt_state, _hparams, updates):
        return programs[updates.shape[0]](pbt_state, updates)

    run_eval = None
    if run.eval_every:
        env, env_params, spec = s.train.env

        def evaluate_member(states, member, key):
            one = jax.tree.map(lambda x: x[member], states)
            return evaluate(lambda *a: s.train.act(one, *a), env, env_params, spec, key,
                            run.eval_episodes,
                            hidden=s.train.initial_hidden(run.eval_episodes))[0].mean()

        key = eval_keys(run, 0)[0]
        run_eval = layout.compile(evaluate_member, None, P(), state_shapes.states,
                                  layout.shapes(jnp.int32(0), P()),
                                  layout.shapes(key, P()))
    if s.writer:
        print(describe(s, chunk), flush=True)
    return run_chunk, run_eval, chunk


def describe(s: Session, chunk: int) -> str:
    """The line a PBT run starts with: the population, the step and the search."""
    space = s.pbt.space
    ranges = ", ".join(f"{r.name} in [{r.low:g}, {r.high:g}]{' (log)' * r.log}"
                       for r in space.ranges) or "nothing (copies only)"
    return (f"PBT: {space.population} members, a step every {space.interval} updates "
            f"({s.config.num_updates // space.interval} intervals; the {space.num_replaced} "
            f"worst take the state of the {space.num_replaced} best, perturb "
            f"{space.perturb:g}, resample {space.resample:g}), searching {ranges}; chunks of "
            f"{chunk // space.interval} interval(s)")


# --------------------------------------------------------------------------------------------
# Each chunk on the host: the NaN guard, the lineage, evaluation, progress, TensorBoard
# --------------------------------------------------------------------------------------------
def hparams_dict(hparams, space: pbt.SearchSpace) -> dict:
    """`{name: [..., N]}` of the searched fields of `HParams` arrays."""
    return {r.name: np.asarray(getattr(hparams, r.name)) for r in space.ranges}


def log_chunk(s: Session, metrics: dict, finite, lineage, begin: int, end: int, run_eval,
              progress, boards):
    """`output.log_chunk` for a population, for the chunk [begin, end): the NaN guard, the
    lineage kept and written (`pbt_lineage.json`), the best member evaluated when due, the
    progress line, the TensorBoard writes (queued)."""
    run, config, population = s.run, s.config, s.pbt.space.population
    steps = (np.arange(begin, end, dtype=np.int64) + 1) * config.batch_size
    metrics["global_step"] = np.broadcast_to(steps, (population, end - begin)).copy()
    stop_if_not_finite(s, metrics, finite, begin)
    if s.pbt.initial is None:  # a fresh run's first chunk: the values of its first update
        s.pbt.initial = {r.name: metrics[f"pbt/{r.name}"][:, 0] for r in s.pbt.space.ranges}
    s.pbt.lineage.append({"source": np.asarray(lineage.source),
                          "score": np.asarray(lineage.score),
                          "hparams": hparams_dict(lineage.hparams, s.pbt.space)})
    if run_eval is not None:  # NaN but after an evaluation: every chunk has the same columns
        metrics["eval_return"] = np.full((population, end - begin), np.nan, np.float32)
    if run_eval is not None and (end % run.eval_every == 0 or end == config.num_updates):
        best = s.pbt.best()
        value = float(fetch(run_eval(s.state.states, s.layout.put(np.int32(best), P()),
                                     s.layout.put(eval_keys(run, end)[0], P()))))
        metrics["eval_return"][best, -1] = value
        if s.writer:
            score = s.pbt.joined()["score"][-1, best]
            print(f"eval at update {end}: the best member, {best} (return {score:.2f} over "
                  f"the last interval; {s.pbt.searched(best, current(s))}): {value:.2f}, "
                  f"mean of {run.eval_episodes} episodes of its deterministic policy",
                  flush=True)
    s.rows.append(metrics)
    s.recent = recent_returns(s.rows if s.recent is None else [metrics], s.recent)
    progress.report(end * config.batch_size, s.recent, final=end == config.num_updates)
    sps = logger.sps_points(progress.timeline[-2:], population)
    if s.writer:
        if boards:
            s.files.put(write_boards, boards, metrics, sps)
        s.files.put(write_json, lineage_path(s), lineage_json(s, end),
                    s.checkpoints.temp_files)


def write_json(path: str, contents: dict, temp_files):
    """On the writer thread: `contents` as JSON to `path`, atomically; nothing once a second
    signal abandoned the writes (`temp_files`, the checkpoints')."""
    try:
        checkpoint.write_atomically(path, json.dumps(contents, indent=1).encode(), temp_files)
    except Exception:
        if not temp_files.abandoned:  # stopped at once: not an error of its own
            raise


def current(s: Session) -> dict:
    """The searched hyperparameters the members train with from now on, name -> [N]."""
    return {k: v[-1] for k, v in s.pbt.joined()["hparams"].items()}


def stop_if_not_finite(s: Session, metrics: dict, finite, begin: int):
    """Exit 1, naming the quantity, the update and the member, if the chunk from `begin` went
    NaN/inf (`output.stop_if_not_finite`'s rule)."""
    params = None if np.all(finite) else fetch(s.state.states.params)
    bad = first_non_finite(metrics, params, begin)
    if bad is not None:
        s.files.flush()
        quantity, update, member = bad
        fail(f"non-finite {quantity} in update {update + 1} (global step "
             f"{(update + 1) * s.config.batch_size:,}, PBT member {member}); training "
             f"stopped. Last good checkpoint: {last_checkpoint(s)}.", code=1)


def lineage_path(s: Session) -> str:
    return os.path.join(os.path.dirname(s.path), LINEAGE)


def lineage_json(s: Session, update: int) -> dict:
    """The lineage file's contents after `update`: the search, the members' first
    hyperparameters, then per PBT step (one per interval, the last without a step) its update
    and each member's score over the interval, source (whose state it holds after the step,
    itself if kept) and searched hyperparameters from then on. A NaN score (no episode ended
    in the interval) is null."""
    space, rows, config = s.pbt.space, s.pbt.joined(), s.config

    def members(hparams, i, **more):
        return [{"member": m, **{k: v[m] for k, v in more.items()},
                 "hparams": {r.name: float(hparams[r.name][m] if i is None else
                                           hparams[r.name][i][m]) for r in space.ranges}}
                for m in range(space.population)]

    steps = []
    for k in range(len(rows["source"])):
        score = [None if math.isnan(x) else float(x) for x in rows["score"][k]]
        steps.append({"interval": k, "update": (k + 1) * space.interval,
                      "global_step": (k + 1) * space.interval * config.batch_size,
                      "members": members(rows["hparams"], k, score=score,
                                         source=[int(x) for x in rows["source"][k]])})
    return {"algo": s.algo, "env_id": config.env_id, "update": update,
            "num_updates": config.num_updates, "batch_size": config.batch_size,
            "population": space.population, "interval": space.interval,
            "search": [r._asdict() for r in space.ranges], "fraction": space.fraction,
            "perturb": space.perturb, "resample": space.resample,
            "replaced_per_step": space.num_replaced, "tensorboard_runs": s.names,
            "fixed_hparams": s.pbt.fixed, "initial": members(s.pbt.initial, None),
            "steps": steps}


# --------------------------------------------------------------------------------------------
# The last line
# --------------------------------------------------------------------------------------------
def summarise(s: Session, compile_time: float, train_time: float) -> dict:
    """Print the closing line, naming the best member and its hyperparameters; return the
    metrics [N, num_updates]."""
    config, run, space = s.config, s.run, s.pbt.space
    metrics = checkpoint.concat_rows(s.rows)
    best = s.pbt.best()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        final = logger.final_return(metrics["episodic_return"])
    steps = config.num_updates * config.batch_size
    trained = (config.num_updates - s.first) * config.batch_size * space.population
    score = s.pbt.joined()["score"][-1, best]
    if s.writer:
        print(f"done: {s.algo.upper()} on {config.env_id}, PBT of {space.population} members x "
              f"{steps:,} steps | best member {best}: {s.pbt.searched(best, current(s))} "
              f"(return {score:.2f} over the last interval, {final[best]:.2f} over the last "
              f"10% of updates) | population final return "
              f"{'n/a' if np.isnan(final).all() else f'mean {np.nanmean(final):.2f}'} "
              f"| compile {compile_time:.1f}s, train {train_time:.1f}s "
              f"({trained / max(train_time, 1e-9):,.0f} SPS) on {s.layout.num_devices} "
              f"device(s) | logs: {os.path.dirname(s.path)} (one run per member) | lineage: "
              f"{lineage_path(s)} | checkpoint: {s.path}", flush=True)
    return metrics
