"""IMPALA: an actor-critic that learns from lagged actors with the V-Trace correction, in one file.

Espeholt, Soyer, Munos, Simonyan, Mnih, Ward, Doron, Firoiu, Harley, Dunning, Legg, Kavukcuoglu
(2018), "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", arXiv:1802.01561. Actors act with a *behaviour* policy mu, a copy of the
learner's parameters that lags behind it; the learner corrects for the lag with V-Trace
(Sec. 4.1, `common/vtrace.py`) and takes the V-Trace actor-critic step of Sec. 4.2: a policy
gradient weighted by the clipped importance ratio and the V-Trace advantage, a baseline loss
towards the V-Trace targets `vs`, and an entropy bonus.

What differs from the paper:
- actors and learner run in lockstep inside one compiled `train(key)`, and the policy lag is
  exact rather than random: the actors of update k act with the learner's parameters of
  update `k - actor_lag`, kept in a small queue of past parameters in the carry
  (`TrainState.past_params`; `actor_lag = 0` is synchronous: with one epoch of one minibatch
  it is A2C with V-Trace targets, and later minibatches or epochs learn off-policy, from
  parameters the earlier ones already changed);
- the losses are means over the batch, not sums (so `vf_coef` = the paper's baseline cost 0.5
  with the same `0.5 * (vs - V)^2` baseline loss, and the learning rate does not depend on the
  batch size); optionally several epochs of minibatches over each batch of trajectories
  (minibatches split the environments, never the time axis, which V-Trace runs along);
- RMSprop's average of squared gradients starts at 0, not at TensorFlow 1's 1 (which slowed
  early learning on CartPole);
- optional penalty on KL(mu || pi) (`kl_coef`, default 0), estimated from the behaviour's own
  samples with Schulman's k3 estimator, http://joschu.net/blog/kl-approx.html;
- the networks of `algos/ppo.py` (separate 64x64 tanh actor and critic MLPs, or the small MinAtar
  CNN), feed-forward or with a GRU or LSTM core (`--network gru`, `lstm`; the paper's agent has an
  LSTM): the actors carry their own recurrent state, the learner recomputes each trajectory from
  the state the actor had at its start with its current parameters; no reward clipping; optional
  observation normalisation (the actors use the learner's current statistics: only the network
  parameters lag);
- a time-limit truncation bootstraps from the final observation (Pardo et al. 2018,
  arXiv:1712.00378), as in `common/gae.py`.
`vtrace = False` keeps everything else and drops the correction (`log_rhos = 0`: the
"no-correction" baseline of the paper's Sec. 5.3), for ablations.

From Python (needs only `common/` modules `envs`, `envapi`, `gymnaxenv`, `rollout`, `scan`,
`threefry`, `vtrace`, `normalize`, `distributed`, `nn`, `minibatch` and `validate`;
`docs/copying.md`):

    train = make_train(Config(env_id="CartPole-v1"))
    state, metrics = jax.jit(train)(jax.random.PRNGKey(0))
    states, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 16))   # 16 seeds

From the command line (`common/host/`: seeds, logging, checkpoints, devices; README):
`python algos/impala.py --env-id CartPole-v1 --num-seeds 4`.
"""

if __name__ == "__main__":  # the command line: Ctrl-C while it loads is one line, exit 130
    from common.host.starting import STARTING

    STARTING.watch()

import dataclasses
from typing import Literal, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from common import distributed, normalize
from common.distributed import pmean
from common.envapi import EnvSpec
from common.envs import check_env_id, make_env
from common.minibatch import flat_optimizer, sgd_scan, shuffled_minibatches, stepping_form
from common.nn import CORES, Conv, Dense, orthogonal
from common.rollout import EnvState, finished_episode_stats, reset, rollout, steps_done
from common.validate import check_fields, require
from common.vtrace import vtrace


@dataclasses.dataclass(frozen=True)
class Config:
    """IMPALA hyperparameters. Defaults: the paper's Atari settings (Espeholt et al. 2018,
    appendix) and DeepMind's `scalable_agent/experiment.py`, except where a field says why."""

    # --- environment ---
    env_id: str = "CartPole-v1"
    """A gymnax id, `brax/<name>` (`.[brax]`; name one of ant, halfcheetah, hopper, humanoid,
    humanoidstandup, inverted_pendulum, inverted_double_pendulum, pusher, reacher, swimmer,
    walker2d), `playground/<Task>` (the Control Suite, `.[playground]`) or a masked task."""
    brax_backend: Literal["spring", "positional", "generalized", "mjx"] = "positional"
    """Brax's physics pipeline for a `brax/...` id (docs/environments.md says why this one)."""
    total_timesteps: int = 1_000_000
    """Environment steps per run (rounded down to whole updates); 1e6: the CartPole target."""
    num_envs: int = 32
    """Parallel environments per run: trajectories per batch (paper: batch size 32)."""
    num_steps: int = 20
    """Steps per environment per batch: the unroll length (paper, Atari: 20)."""
    fresh_starts: float | None = None
    """Fresh random starts drawn per rollout for the episodes that end in it: each environment
    gets one for every segment of about 1 / fresh_starts of its num_steps, the first
    segment's also its first state (`common/rollout.py`); an episode shorter than a segment
    may reuse one. 1: every environment draws one at every step. None: 1 for gymnax, 1/4 for
    Brax, one per episode length for the Control Suite: their resets cost physics."""
    normalize_obs: bool = False
    """Normalise observations with running mean and variance (`common/normalize.py`)."""
    normalize_reward: bool = False
    """Divide rewards by the running standard deviation of the discounted return
    (`common/normalize.py`; CleanRL's continuous PPO, PureJaxRL's `NormalizeVecReward`)."""

    # --- algorithm ---
    actor_lag: int = 1
    """Policy lag: the actors of update k act with the learner's parameters of update
    `k - actor_lag` (0: synchronous, on-policy for the first minibatch of the first epoch)."""
    vtrace: bool = True
    """Correct for the lag with V-Trace; False uses the uncorrected on-policy actor-critic
    targets on the same data (`log_rhos = 0`), for ablations."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """RMSProp (paper: decay 0.99, momentum 0) or Adam."""
    learning_rate: float = 5e-3
    """Learning rate (the start value when annealed). Tuned on CartPole-v1 (the paper's 6e-4
    is for Atari with summed losses): 1e-3 learns too slowly for 1e6 steps, 2e-2 collapsed
    one run in 16, 5e-3 and 1e-2 reached ~499."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly toward 0: update k of N (k = 0, ..., N-1) uses
    lr * (1 - k / N), as CleanRL (paper: yes)."""
    rms_decay: float = 0.99
    """RMSProp decay of the squared-gradient average (paper: 0.99)."""
    opt_eps: float = 0.01
    """Epsilon of the optimiser. RMSProp: added inside the square root as in TensorFlow's
    RMSProp, which the paper used (paper, Atari: 0.01; `scalable_agent` defaults to 0.1).
    Adam: added outside it (optax), usually 1e-5; the default stays 0.01 with
    `--optimizer adam`, so set it yourself."""
    gamma: float = 0.99
    """Discount factor (paper: 0.99)."""
    vtrace_lambda: float = 1.0
    """V-Trace lambda (Remark 2 of Sec. 4.1; paper: 1)."""
    rho_bar: float = 1.0
    """Truncation of the importance weight in the V-Trace targets (paper: 1)."""
    c_bar: float = 1.0
    """Truncation of the V-Trace trace coefficients (paper: 1; its analysis assumes
    rho_bar >= c_bar)."""
    pg_rho_bar: float = 1.0
    """Truncation of the importance weight of the policy gradient (paper: 1)."""
    num_minibatches: int = 1
    """Minibatches per epoch; they split the environments (paper: 1)."""
    update_epochs: int = 1
    """Epochs over each batch of trajectories (paper: 1)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient (paper, Atari: 0.01). MinAtar wants more: 0.2
    (`common/presets.py`; Breakout, 5e6 steps, lr 4e-3: 0.05 reached 23, 0.2 reached 29)."""
    vf_coef: float = 0.5
    """Baseline (value) loss coefficient (paper: baseline cost 0.5)."""
    kl_coef: float = 0.0
    """Coefficient of the KL(behaviour || learner) penalty (0: off)."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip (paper: 40)."""

    # --- network ---
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the MLPs (the CNN torso always uses ReLU)."""
    log_std_init: float = 0.0
    """Continuous actions: the Gaussian policy's initial log standard deviation (a learned
    parameter per action dimension; SB3's `log_std_init`)."""
    network: Literal["auto", "mlp", "cnn", "gru", "mlp-gru", "cnn-gru", "lstm", "mlp-lstm",
                     "cnn-lstm"] = "auto"
    """Torso: `auto` picks the CNN for image observations (MinAtar) and the MLPs otherwise;
    `mlp` flattens images into the MLPs (PureJaxRL's MinAtar baseline, much cheaper on a CPU).
    `gru` adds a recurrent core of `hidden_size` units between a torso and one actor and one
    critic layer (the torso: one Dense layer for vectors, as `mlp-gru`, or the CNN for images,
    as `cnn-gru`): a policy with memory, for partially observed tasks; `lstm` (`mlp-lstm`,
    `cnn-lstm`) an LSTM core instead (`common/nn.py`)."""

    def __post_init__(self):  # plain Python: building a Config starts no JAX backend
        check_fields(self, wide=("total_timesteps",))  # types first: ints, finite float32s
        require(self, "positive_int", "total_timesteps", "num_envs", "num_steps",
                "num_minibatches", "update_epochs", "hidden_size")
        require(self, "nonnegative_int", "actor_lag")
        require(self, "positive", "learning_rate", "max_grad_norm", "opt_eps", "rho_bar",
                "c_bar", "pg_rho_bar")
        require(self, "fraction", "fresh_starts")
        require(self, "unit", "gamma", "vtrace_lambda")
        require(self, "unit_open", "rms_decay")
        require(self, "nonnegative", "ent_coef", "vf_coef", "kl_coef")
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"--num-envs {self.num_envs} is not divisible by --num-minibatches "
                f"{self.num_minibatches} (minibatches split the environments); pick sizes "
                "that divide.")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"--total-timesteps {self.total_timesteps} is less than one "
                             f"batch (num_envs * num_steps = {self.batch_size}).")
        if self.actor_lag >= self.num_updates:
            raise ValueError(f"--actor-lag {self.actor_lag} is not shorter than the run "
                             f"({self.num_updates} updates): the actors would never use "
                             "parameters the learner produced; pick a smaller lag.")
        check_env_id(self.env_id, self.brax_backend)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def core(self) -> str | None:
        """The recurrent core, `gru` or `lstm` (`common/nn.py`'s `CORES`); None: feed-forward."""
        return next((c for c in ("gru", "lstm") if self.network.endswith(c)), None)

    @property
    def recurrent(self) -> bool:
        """The network has a recurrent core."""
        return self.core is not None

    @property
    def torso(self) -> str:
        """`auto`, `mlp` or `cnn`: the network's torso without its recurrent core."""
        return "auto" if self.network == self.core else self.network.split("-")[0]

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    def hparams(self) -> "HParams":
        """The float hyperparameters as traced values (see `HParams`)."""
        return HParams(*(jnp.asarray(getattr(self, f), jnp.float32) for f in HParams._fields))


class HParams(NamedTuple):
    """Float hyperparameters that travel as traced values, so one `vmap` sweeps them.

    `train(key)` takes them from the Config; `train(key, hparams)` overrides them, e.g.
    `jax.vmap(train)(keys, jax.vmap(lambda lr: config.hparams()._replace(learning_rate=lr))(lrs))`.
    Values given this way skip the Config's checks (they may be traced);
    `dataclasses.replace(config, learning_rate=lr).hparams()` builds a checked set.
    """

    learning_rate: jax.Array
    rms_decay: jax.Array
    opt_eps: jax.Array
    gamma: jax.Array
    vtrace_lambda: jax.Array
    rho_bar: jax.Array
    c_bar: jax.Array
    pg_rho_bar: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    kl_coef: jax.Array
    max_grad_norm: jax.Array


# --------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------
class ActorCritic(nn.Module):
    """pi(a|s) and V(s). MLP torso: separate actor and critic MLPs (images flattened). CNN torso:
    one shared CNN (Conv 16 3x3, Dense 128, as the MinAtar baselines, Young & Tian 2019,
    arXiv:1903.03176) with a policy head and a value head. Recurrent: the torso (one Dense
    layer, or the CNN) feeds a recurrent core (GRU or LSTM), whose output feeds an actor and a
    critic layer.

    `__call__(obs, hidden=None, first=None) -> (pi, value, memory)`. Feed-forward: `obs` has
    any leading axes and `memory` is None. Recurrent: `obs` [T, N, ...] is a time-major
    sequence, `hidden` [N, W] the core's state before it (W = H for the GRU, 2H for the LSTM's
    c and h), `first` [T, N] the episode starts (`common/nn.py`'s `GRU`, `LSTM`), and `memory`
    [T, N, W] the core's state after each step."""

    spec: EnvSpec
    hidden_size: int = 64
    activation: str = "tanh"
    cnn: bool = False
    core: str | None = None
    """The recurrent core (`gru`, `lstm`), or None: feed-forward."""
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, obs, hidden=None, first=None):
        act = nn.tanh if self.activation == "tanh" else nn.relu
        dense = lambda n, scale: Dense(n, kernel_init=orthogonal(scale))  # noqa: E731
        memory = None
        if not self.cnn:  # vectors, or images flattened into the MLPs
            obs = obs.reshape(obs.shape[:obs.ndim - len(self.spec.obs_shape)] + (-1,))
        if self.cnn:
            x = nn.relu(Conv(16, (3, 3), kernel_init=orthogonal(np.sqrt(2)))(obs))
            x = nn.relu(dense(128, np.sqrt(2))(x.reshape(x.shape[:-3] + (-1,))))
            actor, critic = x, x
        elif self.core:
            x = act(dense(self.hidden_size, np.sqrt(2))(obs))
        else:
            actor = act(dense(self.hidden_size, np.sqrt(2))(obs))
            actor = act(dense(self.hidden_size, np.sqrt(2))(actor))
            critic = act(dense(self.hidden_size, np.sqrt(2))(obs))
            critic = act(dense(self.hidden_size, np.sqrt(2))(critic))
        if self.core:
            core = CORES[self.core]
            _, memory = core(self.hidden_size)(hidden, x, first)
            out = core.output(memory)  # the LSTM's h of its state [c, h]; the GRU's state
            actor = act(dense(self.hidden_size, np.sqrt(2))(out))
            critic = act(dense(self.hidden_size, np.sqrt(2))(out))
        value = dense(1, 1.0)(critic).squeeze(-1)
        if self.spec.discrete:
            pi = distrax.Categorical(logits=dense(self.spec.action_dim, 0.01)(actor))
        else:
            mean = dense(self.spec.action_dim, 0.01)(actor)
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init),
                                 (self.spec.action_dim,))
            pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std) * jnp.ones_like(mean))
        return pi, value, memory


class PolicyInfo(NamedTuple):
    """What the actor records at acting time, beside the action."""

    log_prob: jax.Array
    """log mu(a|s), the behaviour policy's log-probability of its action."""


class Transition(NamedTuple):
    """The learner's view of a batch of trajectories: whole trajectories [num_envs, T, ...]
    (time-major [T, envs, ...] where it comes from the rollout and where the loss runs
    V-Trace along time)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    """s'_t before any automatic reset, for the bootstrap value V(s'_t)."""
    behaviour_log_prob: jax.Array
    """log mu(a_t|s_t), recorded by the actor when it acted."""
    first: jax.Array | None = None
    """Recurrent: the episode starts, where the recurrent state resets; None: feed-forward."""


class TrainState(NamedTuple):
    """Everything `train` carries from one update to the next."""

    params: dict
    """The learner's parameters."""
    past_params: dict
    """The learner's parameters of the last `actor_lag` updates, oldest first: every leaf has a
    leading axis of size `actor_lag`. Before update k it holds the parameters of updates
    `k - actor_lag, ..., k - 1` (the initial parameters where those are negative); the actors
    of update k act with `past_params[0]`. Empty (size 0) when `actor_lag = 0`."""
    opt_state: optax.OptState
    obs_stats: normalize.RunningStats
    reward_stats: normalize.RunningStats
    """Running statistics of the discounted return (used with `normalize_reward`)."""
    env: EnvState
    key: jax.Array


RHO_ROUNDING = 1e-5
"""Relative margin above rho_bar before a ratio counts as clipped in `rho_clip_fraction`: the
acting and learning passes of a recurrent core round differently, so with an on-policy batch
rho_t = 1 up to a few ulps, which is not clipping."""


class LossInfo(NamedTuple):
    value_loss: jax.Array
    policy_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    """KL(behaviour || learner), k3 estimate from the behaviour's samples."""
    explained_variance: jax.Array
    """1 - Var(vs - V) / Var(vs) (NaN where Var(vs) = 0, as Baselines). Here in the loss, where
    `ppo.py` and `a2c.py` compute it in `update_step`: the V-Trace targets vs depend on the
    learner's parameters, so they exist only inside the loss."""
    mean_clipped_rho: jax.Array
    """Mean of min(rho_bar, rho_t)."""
    rho_clip_fraction: jax.Array
    """Fraction of the rho_t above rho_bar by more than float32 rounding (`RHO_ROUNDING`)."""


# --------------------------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------------------------
def impala_loss(log_prob_t, entropy_t, v_t, v_tp1, batch: Transition, hp: "HParams", *,
                vtrace_correction: bool = True):
    r"""The V-Trace actor-critic loss of a batch of trajectories (Sec. 4.2), means over [T, B]:

        rho_t = pi(a_t|s_t) / mu(a_t|s_t)
        vs_t, A_t = vtrace(log rho_t, r_t, V(s_t), V(s'_t), ...)      (`common/vtrace.py`)
        L = -mean[A_t log pi(a_t|s_t)] + vf_coef 0.5 mean[(vs_t - V(s_t))^2]
            - ent_coef mean[H_t] + kl_coef mean[k3(rho_t)]

    `vs_t` and `A_t` are targets: the gradient reaches pi through `log_prob_t` and V through
    `v_t` in the squared error. k3(rho) = rho - 1 - log rho estimates KL(mu || pi) from mu's
    samples (Schulman, http://joschu.net/blog/kl-approx.html), the log-ratio capped at 20 so an
    extreme ratio cannot overflow (and `kl_coef = 0` times inf turn the gradients NaN).

    Args:
      log_prob_t, entropy_t, v_t, v_tp1: log pi(a_t|s_t), H(pi(.|s_t)), V(s_t) and V(s'_t)
        under the learner's parameters, [T, B] (`v_tp1` of the observation before any reset).
      batch: the `Transition`s (reward, terminated, truncated, behaviour_log_prob), [T, B].
      hp: the `HParams` (gamma, vtrace_lambda, rho_bar, c_bar, pg_rho_bar and coefficients).
      vtrace_correction: False drops the correction (log rho = 0 in the targets, the
        paper's "no-correction" baseline) and keeps the rest.

    Returns:
      `(loss, LossInfo)`, scalars.
    """
    log_rho_t = log_prob_t - batch.behaviour_log_prob
    vs_t, pg_advantage_t = vtrace(
        log_rho_t if vtrace_correction else jnp.zeros_like(log_rho_t), batch.reward, v_t,
        v_tp1, batch.terminated, batch.truncated, hp.gamma, lambda_=hp.vtrace_lambda,
        rho_bar=hp.rho_bar, c_bar=hp.c_bar, pg_rho_bar=hp.pg_rho_bar)
    policy_loss = -(pg_advantage_t * log_prob_t).mean()
    value_loss = 0.5 * jnp.square(vs_t - v_t).mean()
    entropy = entropy_t.mean()
    capped = jnp.minimum(log_rho_t, 20.0)
    kl = (jnp.exp(capped) - 1.0 - capped).mean()
    loss = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy + hp.kl_coef * kl
    rho_t = jnp.exp(lax.stop_gradient(log_rho_t))
    info = LossInfo(
        value_loss, policy_loss, entropy, lax.stop_gradient(kl),
        distributed.explained_variance(vs_t, lax.stop_gradient(v_t)),
        jnp.minimum(hp.rho_bar, rho_t).mean(),
        (rho_t > hp.rho_bar * (1 + RHO_ROUNDING)).astype(jnp.float32).mean())
    return loss, info


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
def make_train(config: Config, live_progress: bool = False):
    """Build `train(key, hparams=None) -> (TrainState, metrics)`, jittable and vmappable.

    `metrics` maps names to arrays with one row per update (leading axis `num_updates`).
    `live_progress`: print progress from inside the compiled `train` (`jax.debug.callback`;
    the last line, 100%, follows a moment after the run, or at once on
    `train.progress.close()`).
    Raises `ValueError` for a network the environment cannot take, before anything compiles.
    """
    env, env_params, spec = make_env(config.env_id, config.brax_backend)
    if config.torso == "cnn" and not spec.image_obs:
        raise ValueError(f"--network {config.network} needs image observations (a MinAtar "
                         f"game), but {config.env_id} observations have shape {spec.obs_shape}; "
                         f"use --network mlp (or auto, gru).")
    cnn = config.torso == "cnn" or (config.torso == "auto" and spec.image_obs)
    recurrent = config.recurrent
    network = ActorCritic(spec, config.hidden_size, config.activation, cnn, config.core,
                          config.log_std_init)
    num_updates, batch_size, lag = config.num_updates, config.batch_size, config.actor_lag
    envs_per_minibatch = config.num_envs // config.num_minibatches

    def learning_rate(hp: HParams, update):
        if config.anneal_lr:
            return hp.learning_rate * (1.0 - update / num_updates)
        return hp.learning_rate

    def make_optimizer(hp: HParams, lr):
        """Global-norm gradient clipping, then RMSprop (or Adam) with step size `lr`.
        (`flat_optimizer` runs them on one vector, the same numbers in fewer kernels: faster
        on CPU. A transformation that looks at the parameters' tree goes outside it.)"""
        if config.optimizer == "rmsprop":
            # TensorFlow's RMSProp as in the paper: v = decay v + (1 - decay) g^2, step
            # lr g / sqrt(v + eps), no momentum, no centring. The accumulator starts at 0 (TF1
            # started it at 1, which slowed early learning on CartPole).
            step = optax.rmsprop(lr, decay=hp.rms_decay, eps=hp.opt_eps, eps_in_sqrt=True)
        else:
            step = optax.adam(lr, eps=hp.opt_eps)
        return flat_optimizer(optax.chain(optax.clip_by_global_norm(hp.max_grad_norm), step))

    def initial_hidden(num_envs: int):
        """The recurrent state of environments before their first step (None: feed-forward)."""
        return CORES[config.core].initial_state(num_envs, config.hidden_size) if recurrent \
            else None

    def next_values(params, next_obs, memory):
        """V(s'_t) of the observation each step t led to, before any reset, [T, N]. Recurrent:
        one more step of the core from its state after s_t (the episode goes on: no reset)."""
        if not recurrent:
            return network.apply(params, next_obs)[1]
        steps, envs = next_obs.shape[:2]
        as_one_step = lambda x: x.reshape((1, steps * envs) + x.shape[2:])  # noqa: E731
        _, value, _ = network.apply(params, as_one_step(next_obs), as_one_step(memory)[0],
                                    jnp.zeros((1, steps * envs), bool))
        return value.reshape(steps, envs)

    def loss_fn(params, hp: HParams, obs_stats, minibatch):
        """The loss of a minibatch of whole trajectories, recomputed with the learner's
        parameters from their recurrent start states (None: feed-forward)."""
        hidden, batch = minibatch  # [envs] start states and [envs, T] trajectories
        batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)  # time-major: [T, envs]
        norm = (lambda obs: normalize.normalize(obs_stats, obs)) if config.normalize_obs \
            else (lambda obs: obs)
        pi, v_t, memory = network.apply(params, norm(batch.obs), hidden, batch.first)
        v_tp1 = next_values(params, norm(batch.next_obs), memory)
        return impala_loss(pi.log_prob(batch.action), pi.entropy(), v_t, v_tp1, batch, hp,
                           vtrace_correction=config.vtrace)

    def init(key, hparams: HParams | None = None) -> TrainState:
        """Fresh parameters, optimiser state and environments for one run."""
        hp = config.hparams() if hparams is None else hparams
        key, key_net, key_env = jax.random.split(key, 3)
        params = network.init(key_net, jnp.zeros((1, 1) + spec.obs_shape, jnp.float32),
                              initial_hidden(1), jnp.ones((1, 1), bool))
        past_params = jax.tree.map(lambda x: jnp.repeat(x[None], lag, axis=0), params)
        devices = distributed.axis_size()
        if envs_per_minibatch % devices:
            raise ValueError(f"data-parallel IMPALA on {devices} devices needs the environments "
                             f"per minibatch ({envs_per_minibatch}) to divide by {devices}.")
        num_envs = config.num_envs // devices
        return TrainState(params, past_params,
                          make_optimizer(hp, hp.learning_rate).init(params),
                          normalize.init(spec.obs_shape), normalize.init(()),
                          reset(env, env_params, distributed.fold_in_device(key_env), num_envs,
                                initial_hidden(num_envs), config.fresh_starts,
                                config.num_steps), key)

    def learn(state: TrainState, hp: HParams, data: Transition, key, update, hidden=None):
        """The learner's step (Sec. 4.2) on one global batch of whole trajectories `data`
        [num_envs, T], at the learning rate of update number `update`: `update_epochs`
        passes over `num_minibatches` minibatches, one SGD step on the V-Trace actor-critic
        loss (`loss_fn`) per minibatch. Minibatches split the environments, never the time
        axis, which V-Trace runs along. `hidden` [num_envs, H] holds each trajectory's
        recurrent state at its start (the behaviour policy's own), split with its
        trajectory; None for a feed-forward network.

        Every device shuffles the same batch with the same key; in data-parallel runs each
        computes the gradient of its 1/D share of every minibatch and `pmean` averages them,
        so the result does not depend on the number of devices.
        Returns `(params, opt_state, info)`, `info` [update_epochs, num_minibatches].
        """
        # the optimiser as its steps run on this backend, for all the epochs: on one vector on
        # a CPU, on the parameter tree elsewhere (`stepping_form`; speed only)
        optimizer, opt_state, stored = stepping_form(make_optimizer(hp, learning_rate(hp, update)),
                                                     state.params, state.opt_state)

        def epoch(carry, key):
            params, opt_state = carry
            # data-parallel: each device's share of a minibatch, gradients averaged (pmean)
            loss = lambda p, batch: loss_fn(  # noqa: E731
                p, hp, state.obs_stats, distributed.device_share(batch))
            batches = shuffled_minibatches(key, (hidden, data), config.num_minibatches)
            params, opt_state, info = sgd_scan(loss, optimizer, params, opt_state, batches,
                                               reduce=pmean)
            return (params, opt_state), info

        (params, opt_state), info = lax.scan(
            epoch, (state.params, opt_state), jax.random.split(key, config.update_epochs))
        return params, stored(params, opt_state), info

    def policy(params, obs_stats):
        """mu(.|s) under `params`, as `rollout` calls it: `(key, obs, first, hidden) ->
        (action, PolicyInfo, hidden)`, the core stepped once (and reset where `first`); the
        recurrent state it carries is the behaviour policy's own."""
        def sample(key, obs, first, hidden):
            if config.normalize_obs:
                obs = normalize.normalize(obs_stats, obs)
            if recurrent:  # one time step of the sequence
                pi, _, memory = network.apply(params, obs[None], hidden, first[None])
                action, log_prob = pi.sample_and_log_prob(seed=key)
                return action[0], PolicyInfo(log_prob[0]), memory[0]
            pi, _, _ = network.apply(params, obs)
            action, log_prob = pi.sample_and_log_prob(seed=key)
            return action, PolicyInfo(log_prob), None

        return sample

    def update_step(state: TrainState, hp: HParams, update):
        """One IMPALA iteration: lagged actors collect a batch, the learner learns from it."""
        key, key_rollout, key_epochs = jax.random.split(state.key, 3)
        key_rollout = distributed.fold_in_device(key_rollout)  # data-parallel: own randomness

        # ACT with the behaviour policy: the learner's parameters from `actor_lag` updates ago
        behaviour_params = jax.tree.map(lambda x: x[0], state.past_params) if lag \
            else state.params

        env_state, traj = rollout(env, env_params, spec,
                                  policy(behaviour_params, state.obs_stats), state.env,
                                  key_rollout, config.num_steps, config.fresh_starts)

        # REWARD SCALE (optional): divide by the running std of the discounted return
        reward_stats = state.reward_stats
        if config.normalize_reward:
            reward_stats, discounted, reward = normalize.normalize_rewards(
                reward_stats, env_state.discounted_return, traj.reward,
                traj.terminated | traj.truncated, hp.gamma)
            env_state = env_state._replace(discounted_return=discounted)
            traj = traj._replace(reward=reward)
        data = Transition(traj.obs, traj.action, traj.reward, traj.terminated, traj.truncated,
                          traj.next_obs, traj.policy_info.log_prob,
                          traj.first if recurrent else None)
        # GATHER (data-parallel): every device gets the global batch, environments in order
        data = distributed.all_gather(data, axis=1)
        hidden = distributed.all_gather(state.env.hidden, axis=0)  # the rollout's start states
        data = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), data)  # trajectories [num_envs, T]

        # LEARN: update_epochs passes over minibatches of whole trajectories
        params, opt_state, info = learn(state, hp, data, key_epochs, update, hidden)

        # LAG: the parameters this update started from join the queue, the oldest leave it
        past_params = jax.tree.map(
            lambda q, p: jnp.concatenate([q[1:], p[None]]), state.past_params, state.params) \
            if lag else state.past_params

        obs_stats = state.obs_stats
        if config.normalize_obs:  # global batch
            obs_stats = normalize.update(obs_stats, data.obs.reshape((-1,) + spec.obs_shape),
                                         axis_name=None)

        # METRICS: one row per update, losses averaged over the minibatches
        ret_sum, len_sum, repeated_sum, count = pmean(finished_episode_stats(traj))
        metrics = {
            "global_step": steps_done(update, batch_size, num_updates),
            "episodic_return": ret_sum / count,
            "episodic_length": len_sum / count,
            "repeated_starts": repeated_sum / count,  # NaN with no restart, as the return
            "learning_rate": learning_rate(hp, update),
            **jax.tree.map(lambda x: x.mean(), info)._asdict(),
        }
        if progress is not None:
            progress.report_from_jit(update, num_updates, metrics["global_step"],
                                     metrics["episodic_return"])
        return TrainState(params, past_params, opt_state, obs_stats, reward_stats, env_state,
                          key), metrics

    def act(state: TrainState, obs, first, hidden):
        """The learner's deterministic policy, for evaluation: `(mode of pi(.|obs), hidden)`,
        the recurrent state carried (and reset where `first`) as in the rollout."""
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs)
        if recurrent:
            pi, _, memory = network.apply(state.params, obs[None], hidden, first[None])
            return pi.mode()[0], memory[0]
        return network.apply(state.params, obs)[0].mode(), hidden

    def run_updates(state: TrainState, hparams: HParams | None, updates):
        """Continue `state` through the updates numbered `updates` (a 1-D int array)."""
        hp = config.hparams() if hparams is None else hparams
        return lax.scan(lambda s, u: update_step(s, hp, u), state, updates)

    def train(key, hparams: HParams | None = None):
        """The whole run in one call: `(final TrainState, metrics)`."""
        return run_updates(init(key, hparams), hparams, jnp.arange(num_updates))

    progress = None
    if live_progress:  # host-side printer, imported only when asked for
        from common.host.logger import Progress
        progress = Progress(f"impala {config.env_id}", num_updates * batch_size)
    # The pieces, for callers that run the updates in chunks (the command line, checkpoints).
    train.init, train.run_updates, train.learn, train.act = init, run_updates, learn, act
    train.policy, train.next_values = policy, next_values
    train.initial_hidden, train.progress = initial_hidden, progress
    train.env = env, env_params, spec
    train.hparams = config.hparams  # the Config's HParams (common/pbt.py's default base)
    return train


def main(argv=None):
    """Command line: the run options of `common/host/options.py` and this file's `Config`."""
    from common.host import cli  # the host side, only for the command line

    return cli.main("impala", Config, make_train, argv)


if __name__ == "__main__":
    main()
