"""The command line's flags: the run options and an algorithm's `Config` as one flat list,
parsed with tyro, with bad input as one line.

`parse(algo, Config, argv)` is the first step of `common/host/cli.py`'s `main`. The
flags keep CleanRL's names; the named environment's preset (`common/presets.py`) or the
checkpoint given to `--resume` supplies the defaults (and is handed on, read once); tyro's
messages for a malformed command line are put in the command line's own words
(`in_plain_words`), and `--help` shows each field's docstring.
"""

import ast
import contextlib
import copy
import dataclasses
import difflib
import inspect
import math
import os
import re
import sys
import textwrap
import types
import typing
from typing import Annotated, Any, NamedTuple

from common import presets
from common.host import checkpoint
from common.host.devices import fail
from common.host.options import RunOptions, search_ranges, whole_number


class Command(NamedTuple):
    """The command line, read (`parse`)."""

    config: Any
    """The algorithm's `Config`."""
    run: RunOptions
    resumed: tuple[str, dict] | None = None
    """With `--resume`: `(path, record)`, the checkpoint file `checkpoint.resolve(run.resume)`
    and its record as `checkpoint.load` read it. Read once: its config and run options gave
    the defaults, and `cli.train_and_log` continues its training state (taking the
    `train_state` out of the record as it restores it). A Python caller that trains hands it
    on too: `config, run, resumed = parse(...)`, then `train_and_log(algo, config, run,
    make_train(config), resumed)`."""


def parse(algo: str, config_cls, argv=None) -> Command:
    """The command line, read with tyro; a bad value exits 2 with one line.

    The flags of `RunOptions` and of `config_cls` form one flat list (no prefixes). tyro parses
    into copies of both classes without `__post_init__`, so that their own validation message
    reaches the user as one line rather than inside tyro's error box. With `--resume PATH`,
    the saved run gives the defaults: flags not given continue the saved run, and a given flag
    that changes it is refused by `train_and_log`. Where the run goes (the processes and
    their coordinator) is never inherited: a run saved by two processes can be resumed by one.
    """
    import tyro

    unchecked = {RunOptions: _without_checks(RunOptions),
                 config_cls: _without_checks(config_cls,  # its group's heading: first sentence
                                             config_cls.__doc__.split(".")[0])}
    command = dataclasses.make_dataclass("Command", [
        ("run", Annotated[unchecked[RunOptions], tyro.conf.OmitArgPrefixes]),
        ("config", Annotated[unchecked[config_cls], tyro.conf.OmitArgPrefixes])])
    command.__doc__ = paragraphs(config_cls.__doc__)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        saved_run, saved_config, tuned, resumed = {"exp_name": algo}, {}, {}, None
        resume = _flag_value(argv, "--resume")
        if resume is not None:
            path = checkpoint.resolve(resume)
            record = checkpoint.load(path)
            resumed = path, record
            checkpoint.check_algo(record, algo, path)  # before its config meets ours
            saved_run, saved_config = dict(record["run"]), record["config"]
            # The runs' logs go on where the checkpoint is, from any working directory (a
            # relative --log-dir, the default `runs`, is the start's, not ours).
            run_dir = os.path.dirname(os.path.abspath(checkpoint.home(path)))
            # (a PBT run's names are its directory's members: `{run directory}/member0`)
            if os.path.basename(run_dir) == record["run_names"][0].split("/")[0]:
                saved_run["log_dir"] = os.path.dirname(run_dir)
        elif "--no-presets" not in argv:  # the named environment's tuned settings
            env_id = _flag_value(argv, "--env-id") or _default(config_cls, "env_id")
            saved_config = tuned = {"env_id": env_id, **presets.preset(algo, env_id)}
        default = command(_build(unchecked[RunOptions], RunOptions, saved_run,
                                 skip={"resume", *NOT_INHERITED}),
                          _build(unchecked[config_cls], config_cls, saved_config))
        known = {f.name for c in (RunOptions, config_cls) for f in dataclasses.fields(c)}
        parsed = tyro_cli(command, argv, known, default=default)
        config = config_cls(**dataclasses.asdict(parsed.config))
        run = RunOptions(**dataclasses.asdict(parsed.run))
        check_population(config, run)
    except ValueError as error:  # checkpoint.CheckpointError included
        fail(error)
    applied = {k: v for k, v in tuned.items() if k != "env_id" and getattr(config, k) == v
               and v != _default(config_cls, k)}
    if applied and run.process_id == 0:
        print(f"preset for {algo} on {config.env_id} (common/presets.py): "
              f"{', '.join(f'{k}={v}' for k, v in applied.items())}; flags given win, "
              "--no-presets for the file's defaults", flush=True)
    return Command(config, run, resumed)


def _default(cls, name: str):
    """The default value of dataclass field `name`."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


NOT_INHERITED = ("coordinator_address", "num_processes", "process_id")
"""Run options a resumed run does not take from its checkpoint: where it runs now."""


def tyro_cli(cls, argv, known=(), **kwargs):
    """`tyro.cli(cls, args=argv)`, with tyro's boxed error message (a mistyped value, an
    unknown flag) turned into one line, `error: ...`, and exit status 2 (`one_line`, given the
    field names `known`). `--help` is tyro's."""
    import io

    import tyro

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls, args=argv, registry=_whole_numbers_registry(), **kwargs)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            raise
        fail(one_line(captured.getvalue(), sys.argv[1:] if argv is None else argv, known))


def _whole_numbers_registry():
    """tyro's parsing with one rule added: every `int` flag reads its value with
    `whole_number`, so `--total-timesteps 1e7` means 10,000,000."""
    import tyro

    registry = tyro.constructors.ConstructorRegistry()

    @registry.primitive_rule
    def _(type_info):
        if type_info.type is not int:
            return None
        return tyro.constructors.PrimitiveConstructorSpec(
            nargs=1, metavar="INT", instance_from_str=lambda args: whole_number(args[0]),
            is_instance=lambda x: isinstance(x, int) and not isinstance(x, bool),
            str_from_instance=lambda x: [str(x)])

    return registry


OTHER_NAMES = {
    # PureJaxRL's config keys
    "lr": ("learning_rate",), "clip_eps": ("clip_coef",), "env_name": ("env_id",),
    # Stable-Baselines3
    "n_steps": ("num_steps",), "n_envs": ("num_envs",), "n_epochs": ("update_epochs",),
    "clip_range": ("clip_coef",), "normalize_advantage": ("norm_adv",),
    "rms_prop_eps": ("opt_eps",),
    # RLlib
    "lambda": ("gae_lambda", "vtrace_lambda"), "entropy_coeff": ("ent_coef",),
    "vf_loss_coeff": ("vf_coef",), "clip_param": ("clip_coef",),
    "grad_clip": ("max_grad_norm",), "num_sgd_iter": ("update_epochs",),
    "num_epochs": ("update_epochs",), "kl_target": ("target_kl",),
    "rollout_fragment_length": ("num_steps",), "vtrace_clip_rho_threshold": ("rho_bar",),
    "vtrace_clip_pg_rho_threshold": ("pg_rho_bar",),
    # TorchBeast's IMPALA (and the IMPALA paper's names)
    "entropy_cost": ("ent_coef",), "baseline_cost": ("vf_coef",), "discounting": ("gamma",),
    "unroll_length": ("num_steps",), "grad_norm_clipping": ("max_grad_norm",),
    "total_steps": ("total_timesteps",), "epsilon": ("opt_eps",), "alpha": ("rms_decay",),
    "env": ("env_id",),
    # shorthands
    "eps": ("opt_eps",), "rms_eps": ("opt_eps",), "rmsprop_alpha": ("rms_decay",),
    "seeds": ("num_seeds",), "timesteps": ("total_timesteps",), "epochs": ("update_epochs",),
    "minibatches": ("num_minibatches",), "norm_obs": ("normalize_obs",),
    "norm_reward": ("normalize_reward",), "logdir": ("log_dir",), "devices": ("num_devices",),
}
"""What other libraries (and common shorthands) call a field, with the field (or fields, in
order of preference) it is here: `--lr` is `--learning-rate`, not tyro's closest spelling
`--anneal-lr`."""

CAVEATS = {
    name: ("rho_bar", f"{who} adds its epsilon outside RMSprop's square root, as PyTorch; "
                      f"IMPALA's --opt-eps goes inside it, as the paper's TensorFlow")
    for name, who in (("epsilon", "TorchBeast"), ("rms_prop_eps", "Stable-Baselines3"))
}
"""Other names whose value means something else in the algorithm that has the field given
(IMPALA: `rho_bar`): said beside the suggestion. A2C's `--opt-eps` is PyTorch's."""


def field_of(flag: str) -> str:
    """The field a flag names: `clip_coef` for `--clip-coef` (or `--clip-coef=0.2`)."""
    return flag.split("=")[0].lstrip("-").replace("-", "_")


def flag_of(field: str) -> str:
    """The flag of a field: `--clip-coef` for `clip_coef`."""
    return "--" + field.replace("_", "-")


def our_flag(flag: str, known) -> str | None:
    """The flag this command line has for `flag` as `OTHER_NAMES` knows it (`known`: this
    command's field names), or None."""
    name = field_of(flag).lower()
    return next((flag_of(n) for n in OTHER_NAMES.get(name, ()) if n in known), None)


def one_line(box: str, argv=(), known=()) -> str:
    """tyro's error box as one line: its message (`in_plain_words`; `argv`: the command line
    it is about), and the flag it suggests if it has one: for an unknown flag that another
    library uses, ours (`OTHER_NAMES`; `known`: this command's field names), else tyro's. An
    unknown flag in `argv` is what the line names, whatever tyro tripped on (`--lr PATH`
    reads PATH as the value of `--lr`, and tyro reports the path as missing)."""
    sections, current = [], []  # the box's title, then its sections between rules
    for raw in box.splitlines() + [""]:
        line = raw.strip(" \u2502\u256d\u256e\u2570\u256f\u2500")
        if set(line) <= set("-"):  # a rule (or the border around it)
            sections += [current] if current else []
            current = []
        elif raw.lstrip().startswith("\u256d"):  # the top border, with the title in it
            sections.append([line])
        else:
            current.append(line)
    if not sections:
        return "could not parse the command line; see --help."
    title, rest = " ".join(sections[0]), sections[1:]
    body = [" ".join(sec) for sec in rest if not sec[0].startswith(("For full helptext",
                                                                  "Argument helptext",
                                                                  "Perhaps you meant"))]
    message = in_plain_words(body[0] if body else title, list(argv))
    negated = any(f.startswith("--no-") for f in re.findall(r"--[\w-]+", message))
    suggested = [pick_variant([w.rstrip(",") for w in line.split() if w.startswith("--")],
                              negated)
                 for sec in rest if sec[0].startswith("Perhaps you meant")
                 for line in sec[1:] if line.startswith("--")]
    strays = unknown_flags(argv, known)
    if strays and not message.startswith("unknown flag"):  # tyro took a path as its value
        message = f"unknown flag{'s' if len(strays) > 1 else ''} {', '.join(strays)}"
        suggested = [flag_of(n) for n in difflib.get_close_matches(field_of(strays[0]),
                                                                   list(known), 1)]
    unknown = re.findall(r"--[\w-]+", message) if message.startswith("unknown flag") else []
    ours = {flag: our for flag in unknown if (our := our_flag(flag, known))}
    if ours:
        caveats = [CAVEATS[n][1] for n in dict.fromkeys(field_of(f).lower() for f in ours)
                   if n in CAVEATS and CAVEATS[n][0] in known]
        return message + "; did you mean " + (
            next(iter(ours.values())) if len(unknown) == 1 else
            ", ".join(f"{our} for {flag}" for flag, our in ours.items())) + "? (" + "".join(
            f"{c}; " for c in caveats) + "see --help)."
    if suggested:
        message += f"; did you mean {' or '.join(dict.fromkeys(suggested))}?"
    return message.rstrip(".") + " (see --help)."


def pick_variant(variants: list, negated: bool) -> str:
    """Of the spellings tyro lists for one suggested flag (`--presets, --no-presets`), the
    one the typed flag meant: the `--no-` one for a typed `--no-...`."""
    return next((v for v in variants if v.startswith("--no-") == negated), variants[0])


def unknown_flags(argv, known) -> list:
    """The `--flags` in `argv` that name none of the fields `known` (none when `known` is
    empty): `--lr PATH` is an unknown flag, though tyro reports the path as missing."""
    if not known:
        return []
    names = {*known, "help"}
    flags = dict.fromkeys(a.split("=")[0] for a in argv if a.startswith("--"))
    return [f for f in flags if field_of(f) not in names
            and not (f.startswith("--no-") and field_of(f[5:]) in names)]


def in_plain_words(message: str, argv: list) -> str:
    """tyro's message in the words of the command line: an unknown flag without the value
    typed after it, a value given to a switch, a number that is not one."""
    unknown = re.fullmatch(r"Unrecognized options?: (.*)", message)
    if unknown:
        tokens = [t.strip() for t in unknown.group(1).split(",")]
        flags = [t.split("=")[0] for t in tokens if t.startswith("-")]  # not `--lr=1e-3`
        if flags:
            return f"unknown flag{'s' if len(flags) > 1 else ''} {', '.join(flags)}"
        before = argv[argv.index(tokens[0]) - 1] if tokens[0] in argv[1:] else ""
        if before.startswith("--"):
            on = f"--{before[5:]}" if before.startswith("--no-") else before
            return (f"{before} takes no value, got {tokens[0]!r}: write {on} or "
                    f"--no-{on[2:]}")
        return f"unexpected value {tokens[0]!r}"
    missing = re.fullmatch(r"Missing from [^:]*: (\S+) (.*?)\.? \(required\)", message)
    if missing:  # a positional argument
        return f"missing {missing.group(1)}: {missing.group(2)}"
    choice = re.fullmatch(r"invalid choice '(.*)' for argument '(--[\w-]+)'\. Expected one of "
                          r"\((.*)\)\.?", message)
    if choice:
        value, flag, choices = choice.groups()
        return f"{flag}: expected one of {choices.replace(chr(39), '')}, got {value!r}"
    no_value = re.fullmatch(r"Missing value for argument '(--[\w-]+)'.*", message)
    if no_value:
        return f"{no_value.group(1)} needs a value"
    parsing = re.fullmatch(r"Error parsing (--[\w-]+): (.*)", message)
    if parsing:
        flag, detail = parsing.groups()
        number = re.search(r"(?:to float: |from \[)'(.*?)'", detail)
        if number:  # float's or tyro's own wording for a value that is not a number
            wanted = "a number or None" if "{None}" in detail else "a number"
            detail = f"expected {wanted}, got {number.group(1)!r}"
        return f"{flag}: {detail}"
    return message


def _without_checks(cls, doc=None):
    """A copy of dataclass `cls` whose `__post_init__` checks nothing, described by `doc`, with
    each field's docstring as its `--help` text in one paragraph (tyro keeps the line breaks
    of a docstring where they fall in the source)."""
    docs = field_docs(cls)
    fields = {}
    for name, field in cls.__dataclass_fields__.items():
        field = copy.copy(field)
        if name in docs:
            field.metadata = types.MappingProxyType({**field.metadata, "help": docs[name]})
        fields[name] = field
    return type(cls.__name__, (cls,), {"__post_init__": lambda self: None,
                                       "__dataclass_fields__": fields,
                                       "__doc__": doc or cls.__doc__,
                                       "__module__": cls.__module__})


def field_docs(cls) -> dict:
    """`{field: its docstring as one line}` for the fields of dataclass `cls` and its bases
    (the string literal under a field, read from the source)."""
    docs = {}
    for klass in reversed(cls.__mro__):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, AttributeError):  # no source: no docstrings
            continue
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and \
                    isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def paragraphs(doc: str) -> str:
    """A docstring with each paragraph on one line, for `--help` (see `_without_checks`)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc or "").split("\n\n"))


def _build(unchecked, cls, values: dict, skip=()):
    """`unchecked(**values)` keeping only the fields of `cls` (and none in `skip`)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    return unchecked(**{k: tuple(v) if isinstance(v, list) else v  # msgpack's lists: tuples
                        for k, v in values.items() if k in names})


def _flag_value(argv, flag: str):
    """The value of `--flag VALUE` or `--flag=VALUE` in `argv` (given twice: the last, as tyro
    reads it), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def hparam_names(config) -> tuple | None:
    """The fields of the `HParams` that `config.hparams()` returns, read from its annotation
    (nothing is built: JAX may not have started yet); None where it has none."""
    try:
        return tuple(typing.get_type_hints(type(config).hparams)["return"]._fields)
    except (AttributeError, KeyError, NameError, TypeError):
        return None


def check_population(config, run: RunOptions):
    """The PBT options against the algorithm's `config`: the searched names are float
    hyperparameters of its `HParams`, each range inside what the `Config` takes, and the
    interval divides the run's updates, as `--checkpoint-every` and `--eval-every` (those
    shorter than the run) are whole intervals: the command line runs PBT in chunks of whole
    intervals (`common/host/pbt.py`). `ValueError` naming the flag and the fix."""
    if not run.pbt_population:
        return
    names, algo = hparam_names(config), type(config).__module__.split(".")[-1].upper()
    fields = {f.name for f in dataclasses.fields(config)}
    for text, (name, low, high, _) in zip(run.pbt_search, search_ranges(run.pbt_search)):
        what = f"--pbt-search {text!r}"
        if names is not None and name not in names:
            valid = ", ".join(names)
            if name in fields:
                raise ValueError(f"{what}: {name} is not a float hyperparameter {algo} can "
                                 f"change while it trains (it is fixed when the program is "
                                 f"built); search one of {valid}.")
            ours = our_flag(flag_of(name), names)
            near = difflib.get_close_matches(name, names, 1)
            hint = f"; did you mean {field_of(ours) if ours else near[0]}?" \
                if ours or near else ""
            raise ValueError(f"{what}: unknown hyperparameter {name!r}{hint} {algo}'s float "
                             f"hyperparameters: {valid}.")
        for end, value in (("low", low), ("high", high)):
            try:
                dataclasses.replace(config, **{name: value})
            except ValueError as error:
                raise ValueError(f"{what}: its {end} end is not a value {flag_of(name)} takes "
                                 f"({str(error).rstrip('.')}); keep the range inside it.") \
                    from None
    n, interval = config.num_updates, run.pbt_interval
    if n % interval or interval == n:
        below = {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}
        near = sorted(sorted(below - {n}, key=lambda d: (abs(d - interval), d))[:3])
        why = "is the whole run: no PBT step would follow it" if interval == n else \
            "does not divide them"
        fix = f"use a divisor of {n} below it, such as {', '.join(map(str, near))}" if near \
            else "raise --total-timesteps"
        raise ValueError(f"--pbt-interval {interval} {why} (the run's {n} updates: "
                         f"--total-timesteps {config.total_timesteps} at {config.batch_size} "
                         f"steps per update); PBT runs whole intervals, each followed by a "
                         f"PBT step but the last: {fix}.")
    for name in ("checkpoint_every", "eval_every"):
        every = getattr(run, name)
        if 0 < every < n and every % interval:
            raise ValueError(f"{flag_of(name)} {every} is not a multiple of --pbt-interval "
                             f"{interval}: the command line runs PBT in chunks of whole "
                             f"intervals, so checkpoints and evaluations fall at their ends; "
                             f"use a multiple of {interval}.")
