"""The bad-input catalogue: every mistake on the command line that can be detected before
training gets one line on stderr, `error: ...`, and a non-zero exit (2), for every algorithm and
for the `evaluate` entry point: bad values and sizes, values that do not survive float32,
sizes that cannot fit in memory, paths that cannot be written, process options, corrupt
checkpoints, and malformed flags (tyro's boxed message, in the command line's words). Every case
here fails before the run's programs compile (reaching them is an error in the test). A config
built from Python refuses the same values.
Mistakes during training (a diverging loss, an interrupted run, a full disk) are tested in
`tests/test_checkpoint.py` and `tests/test_edges.py`.

Not in the catalogue: a continuous-only option on a discrete environment, or a discrete-only
option on a continuous one (a Brax task), because no option is either (every flag applies to
both kinds of action space). A part of Brax that is not installed: `tests/test_brax.py`.
"""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from flax import serialization

import algos.evaluate as evaluate_entry
from common.host import checkpoint, cli
from common.host import pbt as pbt_host
from common.host.flags import paragraphs
from helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
def shaped_state(algo: str, **overrides):
    """`(config, state)`: the vmapped initial TrainState of one run of `algos/<algo>.py`'s tiny
    config (`helpers.TINY`), every leaf zeros of its shape and type (`jax.eval_shape`:
    nothing compiles). Every file the catalogue refuses is refused before a number in it is
    read."""
    import jax

    from common.host import logger

    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(**{**TINY, **overrides})
    keys = logger.seed_keys(1, 1)
    shapes = jax.eval_shape(jax.vmap(module.make_train(config).init), keys,
                            jax.vmap(lambda _: config.hparams())(keys))
    return config, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)


def save_shaped(path, algo: str, state=None, **overrides) -> str:
    """A checkpoint as `helpers.save_initial` writes it, of `shaped_state(algo, **overrides)`
    (or of `state`)."""
    import dataclasses

    from common.host.options import RunOptions

    config, shaped = shaped_state(algo, **overrides)
    checkpoint.save(str(path), algo=algo, config=dataclasses.asdict(config),
                    run=dataclasses.asdict(RunOptions(exp_name=algo)),
                    run_names=[f"{algo}_run_0"], update=0, run_time=0,
                    train_state=shaped if state is None else state, metrics={})
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths for the `{name}` placeholders of the catalogue."""
    d = tmp_path_factory.mktemp("bad_input")
    good = save_shaped(d / "ppo.msgpack", "ppo")
    # PPO settings that IMPALA's Config refuses (it splits minibatches by environment)
    save_shaped(d / "ppo_mb3.msgpack", "ppo", num_steps=96, num_minibatches=3)
    data = open(good, "rb").read()
    (d / "truncated.msgpack").write_bytes(data[: len(data) // 2])
    (d / "corrupt.msgpack").write_bytes(np.random.default_rng(0).bytes(4096))
    (d / "empty.msgpack").write_bytes(b"")
    (d / "foreign.msgpack").write_bytes(serialization.msgpack_serialize({"weights": [1, 2]}))
    (d / "run_without_checkpoint").mkdir()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01  # one bit of a weight
    (d / "flipped.msgpack").write_bytes(bytes(flipped))
    (d / "old.msgpack").write_bytes(serialization.msgpack_serialize(
        {"format_version": 2, "algo": "a2c"}))
    (d / "a_file").write_text("")
    first, second = (d / "logs" / f"CartPole-v1__ppo__{i}__1700000000" for i in (1, 2))
    for run in (first, second):
        run.mkdir(parents=True)
    (first / "latest.msgpack").write_bytes(data)  # a command of two seeds: one checkpoint

    return {"impala_tree_opt": save_impala_with_its_optimiser_on_the_tree(d / "impala.msgpack"),
            "ckpt": good, "ppo_mb3": str(d / "ppo_mb3.msgpack"),
            "truncated": str(d / "truncated.msgpack"),
            "corrupt": str(d / "corrupt.msgpack"), "empty": str(d / "empty.msgpack"),
            "foreign": str(d / "foreign.msgpack"), "missing": str(d / "nowhere.msgpack"),
            "dir": str(d / "run_without_checkpoint"), "flipped": str(d / "flipped.msgpack"),
            "old_format": str(d / "old.msgpack"), "file": str(d / "a_file"),
            "logs": str(d / "logs"), "first_run": str(first), "second_run": str(second),
            "umbrella": save_shaped(d / "umbrella.msgpack", "ppo",
                                    env_id="UmbrellaChain-bsuite"),
            "gru": save_shaped(d / "gru.msgpack", "a2c", env_id="MaskedCartPole-v1",
                               network="gru", hidden_size=8)}


def save_impala_with_its_optimiser_on_the_tree(path) -> str:
    """A checkpoint of IMPALA as it was before its optimiser's state became one flat vector
    (d4e2695): the same run, its `opt_state` that of the optimiser it had then, clipping and
    RMSprop on the parameter tree (one array per parameter in RMSprop's `nu`)."""
    import jax
    import optax

    config, state = shaped_state("impala")
    hp = config.hparams()
    on_the_tree = optax.chain(optax.clip_by_global_norm(hp.max_grad_norm), optax.rmsprop(
        lambda count: hp.learning_rate, decay=hp.rms_decay, eps=hp.opt_eps, eps_in_sqrt=True))
    opt_state = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                             jax.eval_shape(jax.vmap(on_the_tree.init), state.params))
    return save_shaped(path, "impala", state._replace(opt_state=opt_state))


SMALL = ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "32"]
"""16 updates of 128 steps, for every algorithm."""
PBT = ["--pbt-population", "4", "--pbt-interval", "4"]

CATALOGUE = [
    # (entry point, arguments, expected part of the message)
    # --- environment ---
    ("ppo", ["--env-id", "CartPole-v9"], "unknown environment id 'CartPole-v9'"),
    ("a2c", ["--env-id", "Breakout"], "unknown environment id 'Breakout'"),
    ("impala", ["--env-id", "cartpole"], "unknown environment id 'cartpole'"),
    ("a2c", ["--env-id", "CartPole-v9"], "unknown environment id 'CartPole-v9'"),
    ("ppo", ["--env-id", "brax/antt"], "unknown environment id 'brax/antt'. Did you mean "
     "'brax/ant'"),
    ("impala", ["--env-id", "brax/ant", "--brax-backend", "bullet"],
     "--brax-backend: expected one of spring, positional, generalized, mjx, got 'bullet'"),
    ("a2c", ["--env-id", "brax/swimmer"], "brax/swimmer runs on Brax's generalized physics "
     "pipeline only, not positional: pass --brax-backend generalized."),
    # --- network ---
    ("ppo", ["--network", "cnn"], "--network cnn needs image observations"),
    ("a2c", ["--network", "cnn", "--env-id", "Pendulum-v1"], "--network cnn needs image"),
    ("impala", ["--network", "cnn", "--env-id", "Acrobot-v1"], "--network cnn needs image"),
    ("ppo", ["--network", "cnn-gru"], "--network cnn-gru needs image observations"),
    ("impala", ["--network", "cnn-gru", "--env-id", "MaskedPendulum-v1"],
     "--network cnn-gru needs image"),
    ("ppo", ["--network", "gru", "--num-envs", "6", "--num-steps", "8"],
     "--network gru splits minibatches by environment (whole sequences), but --num-envs 6 is "
     "not divisible by --num-minibatches 4"),
    ("a2c", ["--network", "cnn-lstm"], "--network cnn-lstm needs image observations"),
    ("a2c", ["--squash-mean"], "--squash-mean needs bounded continuous actions, but "
     "CartPole-v1's are discrete; leave it off."),
    # --- sizes ---
    ("ppo", ["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
    ("impala", ["--num-envs", "6", "--num-minibatches", "4"], "not divisible"),
    ("ppo", ["--num-envs", "1", "--num-steps", "4", "--num-minibatches", "4"],
     "--norm-adv normalises the advantages over each minibatch, but a minibatch holds one "
     "sample"),
    ("a2c", ["--num-envs", "1", "--num-steps", "1", "--norm-adv"],
     "--norm-adv normalises the advantages over each rollout, but a rollout holds one sample"),
    ("ppo", ["--num-envs", "0"], "--num-envs must be a positive integer"),
    ("a2c", ["--num-steps", "0"], "--num-steps must be a positive integer"),
    ("a2c", ["--num-envs", "0"], "--num-envs must be a positive integer"),
    ("ppo", ["--total-timesteps", "-5"], "--total-timesteps must be a positive integer"),
    ("a2c", ["--total-timesteps", "50"], "less than one rollout"),
    ("ppo", ["--total-timesteps", "100"], "less than one rollout"),
    ("impala", ["--total-timesteps", "100"], "less than one batch"),
    ("ppo", ["--eval-episodes", "0"], "--eval-episodes must be a positive integer"),
    ("a2c", ["--eval-episodes", "-3"], "--eval-episodes must be a positive integer"),
    ("impala", ["--eval-episodes", "0"], "--eval-episodes must be a positive integer"),
    ("ppo", ["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0"),
    ("a2c", ["--eval-every", "-2"], "--eval-every must be >= 0"),
    ("impala", ["--log-every", "-1"], "--log-every must be >= 0, got -1."),
    # --- rates and lags ---
    ("ppo", ["--learning-rate", "0"], "--learning-rate must be > 0"),
    ("ppo", ["--learning-rate", "-1e-3"], "--learning-rate must be > 0"),
    ("ppo", ["--gamma", "1.5"], "--gamma must be in [0, 1]"),
    ("a2c", ["--fresh-starts", "0"], "--fresh-starts must be in (0, 1] (or None), got 0.0."),
    ("impala", ["--fresh-starts", "1.5"], "--fresh-starts must be in (0, 1] (or None)"),
    ("a2c", ["--rms-decay", "1.0"], "--rms-decay must be in [0, 1)"),
    ("impala", ["--rms-decay", "0.99999999"], "which rounds to 1.0 in float32"),
    ("impala", ["--actor-lag", "-1"], "--actor-lag must be >= 0"),
    # --- values that are not what their type says (finite, float32-safe, integers) ---
    ("ppo", ["--opt-eps", "inf"], "--opt-eps must be a finite number, got inf"),
    ("a2c", ["--opt-eps", "inf"], "--opt-eps must be a finite number, got inf"),
    ("impala", ["--opt-eps", "nan"], "--opt-eps must be a finite number, got nan"),
    ("ppo", ["--learning-rate", "1e-50"], "rounds to 0 in float32"),
    ("a2c", ["--learning-rate", "1e-45"], "rounds to 0 in float32"),
    ("impala", ["--learning-rate", "1e-40"], "rounds to 0 in float32"),
    ("ppo", ["--vf-coef", "inf"], "--vf-coef must be a finite number"),
    ("a2c", ["--ent-coef", "1e39"], "beyond float32's range"),
    ("impala", ["--kl-coef", "inf"], "--kl-coef must be a finite number"),
    ("impala", ["--rms-decay", "1.0"], "--rms-decay must be in [0, 1)"),
    ("impala", ["--actor-lag", "1562"], "--actor-lag 1562 is not shorter than the run (1562 "
                                          "updates)"),
    ("ppo", ["--seed", "-1"], "--seed must be >= 0"),
    ("a2c", ["--seed", "18446744073709551615", "--num-seeds", "2"], "past the largest seed"),
    ("impala", ["--seed", "18446744073709551616"], "past the largest seed"),
    ("ppo", ["--total-timesteps", "1000000000000000"], "more than the 2**31 - 1 a run can"),
    ("a2c", ["--total-timesteps", "100000000000000"], "more than the 2**31 - 1 a run can"),
    ("impala", ["--total-timesteps", "100000000000000"], "more than the 2**31 - 1 a run can"),
    ("ppo", ["--hidden-size", "9" * 25], "--hidden-size must be below 2**31"),
    ("impala", ["--eval-episodes", "3000000000"], "--eval-episodes must be below 2**31"),
    # --- sizes that cannot fit ---
    ("ppo", ["--hidden-size", "60000"], "does not fit in memory"),
    ("a2c", ["--hidden-size", "60000"], "reduce --num-seeds, --num-envs, --num-steps, "
                                        "--hidden-size."),
    ("impala", ["--hidden-size", "60000"], "--hidden-size, --actor-lag."),
    # --- environments that would download ---
    ("a2c", ["--env-id", "MNISTBandit-bsuite"], "needs the MNIST files in"),
    # --- paths, checked before anything compiles ---
    ("ppo", ["--log-dir", "{file}"], "--log-dir '{file}' is a file, not a directory"),
    ("a2c", ["--log-dir", "/proc/onpolicy-jax-runs"], "cannot create the run directory"),
    ("impala", ["--exp-name", "x" * 300], "File name too long (shorten --exp-name)"),
    # --- process options, each by name ---
    ("ppo", ["--num-processes", "2"], "--num-processes > 1 needs --coordinator-address"),
    ("a2c", ["--num-processes", "2", "--process-id", "2"], "= [0, 2), got 2."),
    ("impala", ["--process-id", "1"], "--process-id must be in [0, num_processes)"),
    ("ppo", ["--num-processes", "0"], "--num-processes must be a positive integer"),
    ("ppo", ["--distributed-timeout", "0"], "--distributed-timeout must be a positive integer"),
    ("a2c", ["--num-devices", "99"], "--num-devices 99: only"),
    # --- malformed flags (tyro's message in the command line's words, one line) ---
    ("ppo", ["--num-envs", "abc"], "error: --num-envs: expected an integer, such as 500000 or "
                                   "5e5, got 'abc'"),
    ("a2c", ["--total-timesteps", "2.5"], "error: --total-timesteps: expected a whole number, "
                                          "such as 500000 or 5e5, got '2.5'"),
    ("impala", ["--num-steps", "inf"], "expected a whole number, such as 500000 or 5e5, got "
                                       "'inf'"),
    ("ppo", ["--total-timesteps", "1e-3"], "expected a whole number"),
    ("a2c", ["--seed", "1e400"], "error: --seed: '1e400' is too large"),
    ("a2c", ["--gamma", "high"], "error: --gamma: expected a number, got 'high'"),
    ("ppo", ["--target-kl", "abc"], "error: --target-kl: expected a number or None, got 'abc'"),
    ("impala", ["--num-env", "3"], "error: unknown flag --num-env; did you mean --num-envs?"),
    ("ppo", ["--foo", "1", "--bar"], "error: unknown flags --foo, --bar (see --help)."),
    ("ppo", ["--no-preset"], "error: unknown flag --no-preset; did you mean --no-presets? (see "
                             "--help)."),
    ("ppo", ["--preset"], "error: unknown flag --preset; did you mean --presets? (see --help)."),
    ("ppo", ["--exp-name", "a/b"], "error: --exp-name is part of the run directory's name, so it "
                                   "must be non-empty and hold no '/', got 'a/b'."),
    ("a2c", ["--exp-name", ""], "must be non-empty and hold no '/', got ''."),
    # ... named as another library names it: ours, not tyro's nearest spelling (--anneal-lr)
    ("ppo", ["--lr", "1e-3"], "error: unknown flag --lr; did you mean --learning-rate? (see "
                              "--help)."),
    ("ppo", ["--lr=1e-3", "--foo"], "error: unknown flags --lr, --foo; did you mean "
                                    "--learning-rate for --lr? (see --help)."),
    ("a2c", ["--entropy-cost", "0.01", "--discounting", "0.9"], "did you mean --ent-coef for "
                                                                "--entropy-cost, --gamma for "
                                                                "--discounting?"),
    ("ppo", ["--lambda", "0.9"], "did you mean --gae-lambda?"),
    ("impala", ["--lambda", "0.9"], "did you mean --vtrace-lambda?"),
    # ... and where their value means something else here, says so (RMSprop's epsilon)
    ("impala", ["--epsilon", "0.01"], "did you mean --opt-eps? (TorchBeast adds its epsilon "
                                      "outside RMSprop's square root, as PyTorch; IMPALA's "
                                      "--opt-eps goes inside it"),
    ("a2c", ["--epsilon", "0.01"], "error: unknown flag --epsilon; did you mean --opt-eps? (see "
                                   "--help)."),
    ("a2c", ["--anneal-lr", "maybe"], "error: --anneal-lr takes no value, got 'maybe': write "
                                      "--anneal-lr or --no-anneal-lr"),
    ("ppo", ["--no-norm-adv", "0"], "--no-norm-adv takes no value, got '0': write --norm-adv "
                                    "or --no-norm-adv"),
    ("ppo", ["--network", "rnn"], "error: --network: expected one of auto, mlp, cnn, gru, "
                                  "mlp-gru, cnn-gru, lstm, mlp-lstm, cnn-lstm, got 'rnn'"),
    ("a2c", ["--num-envs"], "error: --num-envs needs a value (see --help)."),
    # --- checkpoints ---
    ("ppo", ["--resume", "{flipped}"], "'{flipped}' is corrupt: its contents do not match"),
    ("a2c", ["--resume", "{old_format}"], "has checkpoint format 2; this code reads formats 3, 4"),
    ("ppo", ["--resume", "{missing}"], "no checkpoint file at '{missing}'"),
    ("ppo", ["--resume", "{dir}"], "no checkpoint file at '{dir}/latest.msgpack'"),
    ("ppo", ["--resume", "{truncated}"], "'{truncated}' is not a readable checkpoint (corrupt"),
    ("a2c", ["--resume", "{corrupt}"], "'{corrupt}' is not a readable checkpoint (corrupt"),
    ("impala", ["--resume", "{empty}"], "'{empty}' is empty, not a checkpoint"),
    ("ppo", ["--resume", "{foreign}"], "'{foreign}' is not a checkpoint of this project"),
    ("ppo", ["--resume", "{ckpt}", "--learning-rate", "0.1", "--num-envs", "8"],
     "cannot resume '{ckpt}' with a different config (saved -> now): num_envs: 4 -> 8; "
     "learning_rate: 0.00025 -> 0.1. Resume with the saved values (leave those flags out), or "
     "start a new run without --resume."),
    ("ppo", ["--num-seeds", "100000000"], "does not fit in memory: the training state of "
                                          "100000000 run(s) is"),  # found before any is made
    ("ppo", ["--resume", "{logs}"], "no checkpoint file at '{logs}/latest.msgpack'. Run "
                                    "directories in it hold checkpoints: '{first_run}'."),
    ("a2c", ["--resume", "{ckpt}"], "'{ckpt}' holds a ppo run; resume it with algos/ppo.py"),
    ("ppo", ["--resume", "{ckpt}", "--log-dir", "{file}"], "cannot write the run directory "
     "'{file}/ppo_run_0': Not a directory; choose a writable --log-dir."),
    ("impala", ["--resume", "{ppo_mb3}"],  # the algorithm named before its config is read
     "'{ppo_mb3}' holds a ppo run; resume it with algos/ppo.py"),
    ("ppo", ["--resume", "{ckpt}", "--normalize-reward"], "normalize_reward: False -> True"),
    ("a2c", ["--resume", "{gru}", "--network", "mlp"], "network: 'gru' -> 'mlp'"),
    ("a2c", ["--resume", "{gru}", "--network", "lstm"], "network: 'gru' -> 'lstm'"),
    ("ppo", ["--resume", "{ckpt}", "--network", "gru"], "network: 'auto' -> 'gru'"),
    ("impala", ["--resume", "{impala_tree_opt}"], "'{impala_tree_opt}': its optimiser state is "
     "kept on the parameter tree (one array per parameter), as it was before this code kept it "
     "as one flat vector (common/minibatch.flat_optimizer); this version cannot continue it. "
     "Use the version of the code that wrote it, or start a new run."),
    # --- population-based training (common/host/pbt.py; 16 updates with SMALL) ---
    ("ppo", ["--pbt-interval", "4"], "--pbt-interval is a PBT option, given without "
     "--pbt-population; add --pbt-population N (N >= 2) to train a population"),
    ("a2c", ["--pbt-search", "learning_rate=1e-4:1e-2"], "--pbt-search is a PBT option, given "
     "without --pbt-population"),
    ("impala", ["--pbt-fraction", "0.5"], "--pbt-fraction is a PBT option, given without"),
    ("ppo", ["--pbt-perturb", "0.1"], "--pbt-perturb is a PBT option, given without"),
    ("a2c", ["--pbt-resample", "0.1"], "--pbt-resample is a PBT option, given without"),
    ("ppo", ["--pbt-population", "1", "--pbt-interval", "4"], "--pbt-population must be at "
     "least 2 (PBT copies between members; 0: no PBT), got 1."),
    ("impala", ["--pbt-population", "-2"], "--pbt-population must be >= 0, got -2."),
    ("ppo", ["--pbt-population", "4"], "--pbt-population needs --pbt-interval UPDATES"),
    ("a2c", [*PBT, "--pbt-interval", "0"], "--pbt-interval must be a positive integer, got 0."),
    ("ppo", [*SMALL, *PBT, "--pbt-interval", "5"], "--pbt-interval 5 does not divide them (the "
     "run's 16 updates: --total-timesteps 2048 at 128 steps per update); PBT runs whole "
     "intervals, each followed by a PBT step but the last: use a divisor of 16 below it, such "
     "as 2, 4, 8."),
    ("impala", [*SMALL, *PBT, "--pbt-interval", "16"], "--pbt-interval 16 is the whole run: no "
     "PBT step would follow it"),
    ("ppo", [*SMALL, *PBT, "--pbt-search", "lr=1e-4:1e-2"], "--pbt-search 'lr=1e-4:1e-2': "
     "unknown hyperparameter 'lr'; did you mean learning_rate? PPO's float hyperparameters: "
     "learning_rate, opt_eps, gamma, gae_lambda, clip_coef, ent_coef, vf_coef, max_grad_norm."),
    ("impala", [*SMALL, *PBT, "--pbt-search", "rho=0.5:2"], "unknown hyperparameter 'rho'; "
     "did you mean rho_bar?"),
    ("a2c", [*SMALL, *PBT, "--pbt-search", "num_envs=4:8"], "--pbt-search 'num_envs=4:8': "
     "num_envs is not a float hyperparameter A2C can change while it trains (it is fixed when "
     "the program is built); search one of learning_rate, gamma,"),
    ("ppo", [*SMALL, *PBT, "--pbt-search", "target_kl=0.01:0.1"], "target_kl is not a float "
     "hyperparameter PPO can change"),
    ("ppo", [*PBT, "--pbt-search", "learning_rate=1e-2:1e-4:log"], "--pbt-search "
     "'learning_rate=1e-2:1e-4:log': low 1e-2 > high 1e-4; write "
     "learning_rate=1e-4:1e-2:log."),
    ("a2c", [*PBT, "--pbt-search", "ent_coef=0:0.1:log"], "a log-scaled range needs low > 0, "
     "got 0; raise low or drop ':log'."),
    ("impala", [*PBT, "--pbt-search", "learning_rate"], "--pbt-search 'learning_rate' is not a "
     "range; write name=low:high (uniform) or name=low:high:log (log-uniform)"),
    ("ppo", [*PBT, "--pbt-search", "learning_rate=1e-4:1e-2:lin"], "is not a range; write "
     "name=low:high"),
    ("ppo", [*PBT, "--pbt-search", "learning_rate=1e-4:big"], "--pbt-search "
     "'learning_rate=1e-4:big': its high end 'big' is not a number."),
    ("a2c", [*PBT, "--pbt-search", "gamma=0:inf"], "its high end 'inf' must be a finite number"),
    ("ppo", [*PBT, "--pbt-search", "gamma=0.9:0.99", "gamma=0.8:0.9"], "--pbt-search names "
     "'gamma' twice; give each hyperparameter one range."),
    ("ppo", [*SMALL, *PBT, "--pbt-search", "gamma=0.9:1.1"], "--pbt-search 'gamma=0.9:1.1': "
     "its high end is not a value --gamma takes (--gamma must be in [0, 1], got 1.1); keep the "
     "range inside it."),
    ("impala", [*SMALL, *PBT, "--pbt-search", "rms_decay=0.9:1"], "its high end is not a value "
     "--rms-decay takes (--rms-decay must be in [0, 1), got 1.0)"),
    ("ppo", [*PBT, "--pbt-fraction", "0.6"], "--pbt-fraction must be in (0, 0.5] (the replaced "
     "and the copied shares must not overlap), got 0.6."),
    ("a2c", [*PBT, "--pbt-perturb", "1"], "--pbt-perturb must be in [0, 1), got 1.0."),
    ("impala", [*PBT, "--pbt-resample", "1.5"], "--pbt-resample must be in [0, 1], got 1.5."),
    ("ppo", [*PBT, "--pbt-fraction", "half"], "--pbt-fraction: expected a number or None, got "
     "'half'"),
    ("ppo", [*PBT, "--num-seeds", "2"], "--num-seeds 2 with --pbt-population: the population's "
     "members take the place of seeds"),
    ("a2c", [*PBT, "--parallel", "data"], "--parallel data with --pbt-population: PBT splits "
     "its members across the devices"),
    ("impala", [*PBT, "--num-processes", "2", "--coordinator-address", "localhost:1"],
     "--num-processes with --pbt-population: PBT runs in one process"),
    ("ppo", [*SMALL, *PBT, "--checkpoint-every", "6"], "--checkpoint-every 6 is not a multiple "
     "of --pbt-interval 4: the command line runs PBT in chunks of whole intervals"),
    ("a2c", [*SMALL, *PBT, "--eval-every", "2"], "--eval-every 2 is not a multiple of "
     "--pbt-interval 4"),
    ("ppo", [*SMALL, "--pbt-population", "3", "--pbt-interval", "4", "--num-devices", "2"],
     "--pbt-population 3 does not divide among 2 devices; pick a multiple (or --num-devices "
     "that divides it)."),
    ("ppo", ["--resume", "{ckpt}", *PBT], "cannot resume '{ckpt}' with a different config "
     "(saved -> now): pbt_population: 0 -> 4; pbt_interval: None -> 4."),
    # --- the evaluate entry point ---
    ("evaluate", ["{missing}"], "no checkpoint file at '{missing}'"),
    ("evaluate", ["{truncated}"], "'{truncated}' is not a readable checkpoint"),
    ("evaluate", ["{ckpt}", "--episodes", "0"], "--episodes must be a positive integer"),
    ("evaluate", ["{umbrella}", "--capture-video", "x.gif"],
     "gymnax has no renderer for 'UmbrellaChain-bsuite'"),
    ("evaluate", ["{ckpt}", "--seed", "-1"], "--seed must be in [0, 2**32)"),
    ("evaluate", ["{ckpt}", "--capture-video", "{dir}"], "is a directory; give a file name"),
    ("evaluate", ["{ckpt}", "--capture-video", "{file}/x.gif"], "cannot write the video to"),
    ("evaluate", ["{ckpt}", "--capture-video", "x.html"],
     "--capture-video for CartPole-v1 writes a GIF (gymnax's renderer); name it *.gif, not "
     "'x.html'."),
    ("evaluate", ["{second_run}"], "no checkpoint file at '{second_run}/latest.msgpack'. The "
     "runs of one command keep one checkpoint, in the first run's directory: '{first_run}'."),
    ("evaluate", ["{flipped}"], "is corrupt: its contents do not match their checksum"),
    ("evaluate", ["{impala_tree_opt}"], "its optimiser state is kept on the parameter tree"),
    ("evaluate", ["{ckpt}", "--episodes", "many"], "error: --episodes: expected an integer"),
    ("evaluate", [], "error: missing PATH: A checkpoint file, or a run directory holding"),
    # an unknown flag before the path takes the path as its value: still the unknown flag
    ("evaluate", ["--lr", "{ckpt}"], "error: unknown flag --lr (see --help)."),
    ("evaluate", ["--epsiodes", "3", "{ckpt}"],
     "error: unknown flag --epsiodes; did you mean --episodes? (see --help)."),
    ("ppo", ["--lr", "--num-seeds", "2"],
     "error: unknown flag --lr; did you mean --learning-rate?"),
]


def entry_point(name):
    module = f"algos.{name}"
    return importlib.import_module(module).main


@pytest.mark.parametrize("name,argv,message", CATALOGUE,
                         ids=[f"{n}:{' '.join(a)}" for n, a, _ in CATALOGUE])
def test_bad_input_is_one_clear_line_and_exit_2(name, argv, message, files, capsys,
                                                monkeypatch):
    argv = [a.format(**files) for a in argv]

    def compiled(*args, **kwargs):  # the programs a run compiles: none is reached
        raise AssertionError(f"{name} {' '.join(argv)} went on to compile before refusing")

    monkeypatch.setattr(cli, "compile_programs", compiled)  # the training chunks
    monkeypatch.setattr(pbt_host, "compile_programs", compiled)  # a population's
    monkeypatch.setattr(evaluate_entry, "evaluate", compiled)  # `evaluate`'s episodes
    monkeypatch.setattr(evaluate_entry, "record_episode", compiled)
    with pytest.raises(SystemExit) as exit_info:
        entry_point(name)(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message.format(**files) in err, err
    assert len(err.splitlines()) == 1, err


@pytest.mark.subprocess
@pytest.mark.parametrize("command,message", [
    (["algos/ppo.py", "--env-id", "Pong"], "unknown environment id 'Pong'. Did you mean"),
    (["algos/a2c.py", "--num-envs", "0"], "--num-envs must be a positive integer, got 0."),
    (["algos/ppo.py", "--resume", "{flipped}"], "'{flipped}' is corrupt: its contents do not"),
    (["algos/impala.py", "--hidden-size", "60000"], "does not fit in memory"),
    (["algos/ppo.py", "--num-envs", "abc"], "error: --num-envs: expected an integer"),
    (["-m", "algos.evaluate", "{missing}"], "no checkpoint file at '{missing}'"),
], ids=["env-id", "num-envs", "flipped", "memory", "abc", "missing"])
def test_bad_input_from_a_real_process_is_one_line_without_traceback(command, message, files):
    """The catalogue's refusals as a user meets them: a fresh process of each entry point,
    exit 2, one `error:` line on stderr that says what is wrong, and no traceback. One case
    for each place a command refuses (the flags as tyro reads them, the environment id, a
    config's own check, the checkpoint resumed, the memory check once JAX runs, `evaluate`'s
    path); the catalogue above gives every message and its exit status in-process."""
    result = subprocess.run([sys.executable, *[a.format(**files) for a in command]], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert message.format(**files) in lines[0], lines[0]


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
@pytest.mark.parametrize("field,value,message", [
    ("total_timesteps", 1e5, "--total-timesteps must be an integer, got 100000.0 (float)"),
    ("num_envs", True, "--num-envs must be an integer, got True (bool)"),
    ("learning_rate", float("inf"), "--learning-rate must be a finite number, got inf"),
    ("gamma", "0.99", "--gamma must be a number, got '0.99' (str)"),
])
def test_a_config_from_python_refuses_values_of_the_wrong_type(algo, field, value, message):
    config_cls = importlib.import_module(f"algos.{algo}").Config
    with pytest.raises(ValueError, match=re.escape(message)):
        config_cls(**{field: value})


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala"])
def test_integer_flags_take_whole_numbers_written_as_researchers_write_them(algo):
    """`--total-timesteps 1e6` is 1,000,000 on the command line (a Config from Python still
    refuses the float 1e6: above)."""
    from common.host import flags
    from common.host.options import whole_number

    config_cls = importlib.import_module(f"algos.{algo}").Config
    config, run, _ = flags.parse(algo, config_cls, ["--total-timesteps", "2.5e6", "--num-envs",
                                                    "8.0", "--seed", "1_000", "--num-seeds",
                                                    "2E0", "--no-presets"])
    assert (config.total_timesteps, config.num_envs, run.seed, run.num_seeds) == \
        (2_500_000, 8, 1000, 2)
    assert all(type(v) is int for v in (config.total_timesteps, config.num_envs, run.seed))
    assert whole_number("123456789012345678901234567e3") == \
        123456789012345678901234567000  # exact: no detour through a float


def test_run_options_from_python_refuse_a_float_seed():
    from common.host.options import RunOptions

    with pytest.raises(ValueError, match=re.escape("--seed must be an integer, got 1.5")):
        RunOptions(seed=1.5)


def test_every_other_name_points_at_a_field_that_exists():
    """`OTHER_NAMES` may name a field only some algorithms have (`--clip-param`: PPO's
    `clip_coef`), never one that none has (a typo would go unnoticed: no suggestion)."""
    import dataclasses

    from common.host.flags import OTHER_NAMES
    from common.host.options import RunOptions

    fields = {f.name for c in [RunOptions] + [importlib.import_module(f"algos.{a}").Config
                                              for a in ("ppo", "a2c", "impala")]
              for f in dataclasses.fields(c)}
    for other, ours in OTHER_NAMES.items():
        assert set(ours) <= fields, (other, set(ours) - fields)
        assert other not in fields, other  # a name we have is never another's


def test_mnist_bandit_runs_once_its_files_are_there(tmp_path, monkeypatch):
    from common import gymnaxenv
    from common.envs import check_env_id

    monkeypatch.setattr(gymnaxenv, "MNIST_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="missing: train-images-idx3-ubyte.gz"):
        check_env_id("MNISTBandit-bsuite")
    for name in gymnaxenv.MNIST_FILES:
        (tmp_path / name).write_bytes(b"")
    check_env_id("MNISTBandit-bsuite")  # nothing missing: no refusal


@pytest.mark.parametrize("name", ["ppo", "a2c", "impala"])
def test_help_shows_each_docstring_as_written_not_broken_where_the_source_breaks(
        name, capsys, monkeypatch):
    """`--help` gives every field's docstring as one paragraph (tyro alone breaks the line
    wherever the source does), the file's description once in full and, over the
    hyperparameters, its first sentence."""
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping by the terminal's width
    with pytest.raises(SystemExit) as exit_info:
        entry_point(name)(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Apply the tuned settings of the named environment (`common/presets.py`) when it " \
           "has one; any flag given wins." in out
    module = importlib.import_module(f"algos.{name}")
    first = module.Config.__doc__.split(".")[0]
    assert out.count(paragraphs(module.Config.__doc__)) == 1 and out.count(first) == 2
