"""Proximal Policy Optimisation (PPO), clipped objective, in one file.

Schulman, Wolski, Dhariwal, Radford, Klimov (2017), "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, Algorithm 1 with the clipped surrogate L^CLIP (eq. 7), a value loss and an
entropy bonus (eq. 9), and GAE advantages (eq. 11-12; Schulman et al. 2016, arXiv:1506.02438).

What differs from the paper, all following the implementation details catalogued by Huang et
al. (2022), "The 37 Implementation Details of PPO" (ICLR blog track), and matching CleanRL's
`ppo.py` flags and defaults:
- advantages are normalised per minibatch (`norm_adv`), the value loss is clipped around the
  rollout's values (`clip_vloss`), gradients are clipped by global norm (`max_grad_norm`),
  Adam uses eps=1e-5 and the learning rate is annealed linearly toward 0 (`anneal_lr`);
- separate actor and critic MLPs (64x64 tanh by default, their widths, depths and activation
  from flags; orthogonal init, policy head scaled 0.01) or a shared small CNN torso for image
  observations (MinAtar); optionally a GRU or LSTM core (`--network gru`, `lstm`) whose state
  is reset at every episode start and recomputed in the update from the state stored at the
  rollout's start, minibatches splitting environments, never time (truncated backpropagation
  through time, as OpenAI Baselines' `ppo2`);
- a time-limit truncation bootstraps from the final observation instead of being treated as
  a terminal state (Pardo et al. 2018, arXiv:1712.00378) -- see `common/gae.py`;
- optional early stop of an update's epochs when the approximate KL exceeds `target_kl`.

From Python (needs only `common/` modules `envs`, `envapi`, `gymnaxenv`, `rollout`, `scan`,
`threefry`, `gae`, `normalize`, `distributed`, `nn`, `minibatch` and `validate`;
`docs/copying.md`):

    train = make_train(Config(env_id="CartPole-v1"))
    state, metrics = jax.jit(train)(jax.random.PRNGKey(0))
    states, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 16))   # 16 seeds

From the command line (`common/host/`: seeds, logging, checkpoints, devices; README):
`python algos/ppo.py --env-id CartPole-v1 --num-seeds 4`.
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
from common.gae import gae
from common.minibatch import flat_optimizer, sgd_scan, shuffled_minibatches, stepping_form
from common.nn import CORES, Conv, Dense, orthogonal
from common.rollout import EnvState, finished_episode_stats, reset, rollout, steps_done
from common.validate import check_fields, optional_positive, require


@dataclasses.dataclass(frozen=True)
class Config:
    """PPO hyperparameters. Defaults: CleanRL's `ppo.py` / PureJaxRL's CartPole config."""

    # --- environment ---
    env_id: str = "CartPole-v1"
    """A gymnax id, `brax/<name>` (`.[brax]`; name one of ant, halfcheetah, hopper, humanoid,
    humanoidstandup, inverted_pendulum, inverted_double_pendulum, pusher, reacher, swimmer,
    walker2d), `playground/<Task>` (the Control Suite, `.[playground]`) or a masked task."""
    brax_backend: Literal["spring", "positional", "generalized", "mjx"] = "positional"
    """Brax's physics pipeline for a `brax/...` id (docs/environments.md says why this one)."""
    total_timesteps: int = 500_000
    """Environment steps per run (rounded down to whole updates)."""
    num_envs: int = 4
    """Parallel environments per run."""
    num_steps: int = 128
    """Steps per environment per rollout."""
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
    learning_rate: float = 2.5e-4
    """Adam learning rate (the start value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly toward 0: update k of N (k = 0, ..., N-1) uses
    lr * (1 - k / N), as CleanRL."""
    opt_eps: float = 1e-5
    """Adam's epsilon (CleanRL: 1e-5)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Epochs over each rollout."""
    norm_adv: bool = True
    """Normalise advantages per minibatch, by their mean and population standard deviation (as
    PureJaxRL; CleanRL's torch `std` is the sample one, which differs by sqrt((B-1)/B): 0.4%
    at the default minibatch of 128)."""
    clip_coef: float = 0.2
    """Clipping epsilon of the surrogate objective (and of the value loss)."""
    clip_vloss: bool = True
    """Clip the value loss around the rollout's values."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop an update's remaining epochs once the approximate KL exceeds this (None: never)."""

    # --- network ---
    hidden_size: int = 64
    """Width of the hidden layers of the actor and critic MLPs (the critic's is
    `critic_hidden_size` where given), and of the recurrent core and its layers."""
    hidden_layers: int = 2
    """Hidden layers of the actor and critic MLPs (the critic's: `critic_hidden_layers` where
    given). Brax's PPO networks: 32 x 4, the critic 256 x 5, swish."""
    critic_hidden_size: int | None = None
    """Width of the critic MLP's hidden layers (None: `hidden_size`)."""
    critic_hidden_layers: int | None = None
    """Hidden layers of the critic MLP (None: `hidden_layers`)."""
    activation: Literal["tanh", "relu", "swish"] = "tanh"
    """Activation of the MLPs (the CNN torso always uses ReLU); swish is x * sigmoid(x), Brax's
    PPO networks' (Ramachandran et al. 2017, arXiv:1710.05941)."""
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
                "num_minibatches", "update_epochs", "hidden_size", "hidden_layers")
        optional_positive(self, "critic_hidden_size")
        optional_positive(self, "critic_hidden_layers")
        require(self, "positive", "learning_rate", "opt_eps", "max_grad_norm", "clip_coef")
        require(self, "fraction", "fresh_starts")
        require(self, "unit", "gamma", "gae_lambda")
        require(self, "nonnegative", "ent_coef", "vf_coef")
        optional_positive(self, "target_kl")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num_envs * num_steps = {self.batch_size} is not divisible by "
                f"--num-minibatches {self.num_minibatches}; pick sizes that divide.")
        if self.recurrent and self.num_envs % self.num_minibatches:
            raise ValueError(
                f"--network {self.network} splits minibatches by environment (whole sequences), "
                f"but --num-envs {self.num_envs} is not divisible by --num-minibatches "
                f"{self.num_minibatches}; pick sizes that divide.")
        if self.norm_adv and self.minibatch_size < 2:
            raise ValueError(
                f"--norm-adv normalises the advantages over each minibatch, but a minibatch "
                f"holds one sample (num_envs * num_steps / num_minibatches = "
                f"{self.batch_size} / {self.num_minibatches}): every normalised advantage "
                f"would be 0 and the policy would not learn. Use fewer --num-minibatches, "
                f"more --num-envs or --num-steps, or --no-norm-adv.")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"--total-timesteps {self.total_timesteps} is less than one "
                             f"rollout (num_envs * num_steps = {self.batch_size}).")
        if self.torso == "cnn" or self.recurrent:
            mlp_only(self)
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
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    def hparams(self) -> "HParams":
        """The float hyperparameters as traced values (see `HParams`)."""
        return HParams(*(jnp.asarray(getattr(self, f), jnp.float32) for f in HParams._fields))


def mlp_only(config: Config):
    """Raise `ValueError` where `config` shapes the MLPs but its network has none."""
    if (config.hidden_layers, config.critic_hidden_size, config.critic_hidden_layers) != \
            (2, None, None):
        raise ValueError(f"--hidden-layers, --critic-hidden-size and --critic-hidden-layers "
                         f"shape the actor and critic MLPs, which --network {config.network} "
                         f"on {config.env_id} does not have; use --network mlp, or leave them "
                         f"out.")


class HParams(NamedTuple):
    """Float hyperparameters that travel as traced values, so one `vmap` sweeps them.

    `train(key)` takes them from the Config; `train(key, hparams)` overrides them, e.g.
    `jax.vmap(train)(keys, jax.vmap(lambda lr: config.hparams()._replace(learning_rate=lr))(lrs))`.
    Values given this way skip the Config's checks (they may be traced);
    `dataclasses.replace(config, learning_rate=lr).hparams()` builds a checked set.
    """

    learning_rate: jax.Array
    opt_eps: jax.Array
    gamma: jax.Array
    gae_lambda: jax.Array
    clip_coef: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    max_grad_norm: jax.Array


# --------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------
class ActorCritic(nn.Module):
    """pi(a|s) and V(s). MLP torso: separate actor and critic MLPs (images flattened), of
    `hidden_layers` layers of `hidden_size` units (the critic's: `critic_hidden_layers` of
    `critic_hidden_size` where given). CNN torso: one shared CNN (Conv 16 3x3, Dense 128, as
    the MinAtar baselines, Young & Tian 2019, arXiv:1903.03176) with a policy head and a value
    head. Recurrent: the torso (one Dense layer, or the CNN) feeds a recurrent core (GRU or
    LSTM), whose output feeds an actor and a critic layer.

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
    hidden_layers: int = 2
    critic_hidden_size: int | None = None
    critic_hidden_layers: int | None = None

    @nn.compact
    def __call__(self, obs, hidden=None, first=None):
        act = {"tanh": nn.tanh, "relu": nn.relu, "swish": nn.swish}[self.activation]
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
            actor, critic = obs, obs
            for _ in range(self.hidden_layers):
                actor = act(dense(self.hidden_size, np.sqrt(2))(actor))
            for _ in range(self.critic_hidden_layers or self.hidden_layers):
                critic = act(dense(self.critic_hidden_size or self.hidden_size,
                                   np.sqrt(2))(critic))
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
            log_std = self.param("log_std", nn.initializers.zeros, (self.spec.action_dim,))
            pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std) * jnp.ones_like(mean))
        return pi, value, memory


class PolicyInfo(NamedTuple):
    """What the actor records at acting time, beside the action."""

    log_prob: jax.Array
    value: jax.Array
    memory: jax.Array | None
    """The recurrent core's state after this step, for the bootstrap value; else None."""


class Transition(NamedTuple):
    """Training samples: one per (step, environment), flattened (feed-forward), or whole
    sequences [num_envs, T] (recurrent)."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    """log pi_old(a|s), recorded when acting."""
    value: jax.Array
    """V_old(s), recorded when acting."""
    advantage: jax.Array
    ret: jax.Array
    """The GAE return target, advantage + value."""
    first: jax.Array | None = None
    """Recurrent: the episode starts, where the recurrent state resets; None: feed-forward."""


class TrainState(NamedTuple):
    """Everything `train` carries from one update to the next."""

    params: dict
    opt_state: optax.OptState
    obs_stats: normalize.RunningStats
    reward_stats: normalize.RunningStats
    """Running statistics of the discounted return (used with `normalize_reward`)."""
    env: EnvState
    key: jax.Array


class LossInfo(NamedTuple):
    value_loss: jax.Array
    policy_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    clipfrac: jax.Array


# --------------------------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------------------------
def ppo_loss(log_prob, entropy, value, batch: Transition, hp: "HParams", *,
             norm_adv: bool = True, clip_vloss: bool = True):
    r"""The PPO loss of one minibatch (paper eq. 9, as a loss to minimise):

        r = pi(a|s) / pi_old(a|s),   A = the advantages (normalised if `norm_adv`)
        L^CLIP = mean[ max(-A r, -A clip(r, 1 - eps, 1 + eps)) ]
        L^VF   = 0.5 mean[ max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2) ]
                 (plain 0.5 mean[(V - G)^2] without `clip_vloss`)
        L = L^CLIP + vf_coef L^VF - ent_coef mean[H]

    Args:
      log_prob, entropy, value: log pi(a|s), H(pi(.|s)) and V(s) under the parameters being
        trained, one per sample [B].
      batch: the samples' `Transition`s (old log-probabilities and values, advantages and
        returns), every field [B, ...].
      hp: the `HParams` (clip_coef, ent_coef, vf_coef: eps and the coefficients).
      norm_adv: normalise the advantages to mean 0, std 1 over the minibatch (across the
        devices of a data-parallel run).

    Returns:
      `(loss, LossInfo)`, scalars; `approx_kl` is Schulman's k3 estimator of KL(pi_old || pi)
      (http://joschu.net/blog/kl-approx.html), `clipfrac` the fraction of |r - 1| > eps.
    """
    clip_coef, log_ratio = hp.clip_coef, log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    advantage = batch.advantage
    if norm_adv:
        mean, var = distributed.mean_var(advantage)
        advantage = (advantage - mean) / (jnp.sqrt(var) + 1e-8)
    policy_loss = jnp.maximum(-advantage * ratio,
                              -advantage * jnp.clip(ratio, 1.0 - clip_coef, 1.0 + clip_coef)).mean()
    if clip_vloss:
        value_clipped = batch.value + jnp.clip(value - batch.value, -clip_coef, clip_coef)
        value_loss = 0.5 * jnp.maximum(jnp.square(value - batch.ret),
                                       jnp.square(value_clipped - batch.ret)).mean()
    else:
        value_loss = 0.5 * jnp.square(value - batch.ret).mean()
    entropy = entropy.mean()
    loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    clipfrac = (jnp.abs(ratio - 1.0) > clip_coef).astype(jnp.float32).mean()
    return loss, LossInfo(value_loss, policy_loss, entropy, lax.stop_gradient(approx_kl),
                          clipfrac)


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
    if cnn:
        mlp_only(config)
    recurrent = config.recurrent
    network = ActorCritic(spec, config.hidden_size, config.activation, cnn, config.core,
                          config.hidden_layers, config.critic_hidden_size,
                          config.critic_hidden_layers)
    num_updates, batch_size = config.num_updates, config.batch_size

    def learning_rate(hp: HParams, update):
        if config.anneal_lr:
            return hp.learning_rate * (1.0 - update / num_updates)
        return hp.learning_rate

    def make_optimizer(hp: HParams, lr):
        """Global-norm gradient clipping, then Adam with step size `lr`, on one flat vector
        (`flat_optimizer`: the same numbers in fewer kernels; `optax.masked` goes outside it)."""
        return flat_optimizer(optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                                          optax.adam(lr, eps=hp.opt_eps)))

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
        hidden, batch = minibatch  # recurrent: [envs] start states and [envs, T] sequences
        if recurrent:  # time-major for the core's scan: [T, envs]
            batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
        obs = normalize.normalize(obs_stats, batch.obs) if config.normalize_obs else batch.obs
        pi, value, _ = network.apply(params, obs, hidden, batch.first)
        return ppo_loss(pi.log_prob(batch.action), pi.entropy(), value, batch, hp,
                        norm_adv=config.norm_adv, clip_vloss=config.clip_vloss)

    def local_num_envs():
        """This device's environments: `num_envs` split across the devices of `DATA_AXIS`."""
        devices = distributed.axis_size()
        if config.num_envs % devices or config.minibatch_size % devices:
            raise ValueError(f"data-parallel PPO on {devices} devices needs --num-envs "
                             f"({config.num_envs}) and the minibatch size "
                             f"({config.minibatch_size}) to divide by {devices}.")
        if recurrent and (config.num_envs // config.num_minibatches) % devices:
            raise ValueError(f"data-parallel recurrent PPO on {devices} devices needs the "
                             f"environments per minibatch ({config.num_envs} / "
                             f"{config.num_minibatches}) to divide by {devices}.")
        return config.num_envs // devices

    def init(key, hparams: HParams | None = None) -> TrainState:
        """Fresh parameters, optimiser state and environments for one run (data-parallel:
        the same parameters on every device, each device its own environments)."""
        hp = config.hparams() if hparams is None else hparams
        key, key_net, key_env = jax.random.split(key, 3)
        params = network.init(key_net, jnp.zeros((1, 1) + spec.obs_shape, jnp.float32),
                              initial_hidden(1), jnp.ones((1, 1), bool))
        num_envs = local_num_envs()
        return TrainState(params, make_optimizer(hp, hp.learning_rate).init(params),
                          normalize.init(spec.obs_shape), normalize.init(()),
                          reset(env, env_params, distributed.fold_in_device(key_env), num_envs,
                                initial_hidden(num_envs), config.fresh_starts,
                                config.num_steps), key)

    def learn(state: TrainState, hp: HParams, data: Transition, key, update, hidden=None):
        """The epochs of minibatch SGD on one global batch `data`, at the learning rate of
        update number `update`. Feed-forward: `data` holds single samples [batch_size] and
        `hidden` is None; recurrent: whole sequences [num_envs, T] and `hidden` [num_envs, H]
        their stored start states, from which a minibatch of environments is recomputed.
        Data-parallel: each device takes the gradient of its share of every minibatch, and
        `pmean` averages them (`common/distributed.py`).
        Returns `(params, opt_state, info, ran)`: `info` per epoch and minibatch, `ran` 1.0 for
        the epochs that ran (0.0 after a KL early stop).
        """
        # the optimiser as its steps run on this backend, for all the epochs: on one vector on
        # a CPU, on the parameter tree elsewhere (`stepping_form`; speed only)
        optimizer, opt_state, stored = stepping_form(make_optimizer(hp, learning_rate(hp, update)),
                                                     state.params, state.opt_state)

        def epoch(carry, key):
            params, opt_state, stopped = carry
            # data-parallel: each device's share of a minibatch, gradients averaged (pmean)
            loss = lambda p, batch: loss_fn(  # noqa: E731
                p, hp, state.obs_stats, distributed.device_share(batch))
            batches = shuffled_minibatches(key, (hidden, data), config.num_minibatches)
            new_params, new_opt_state, info = sgd_scan(loss, optimizer, params, opt_state,
                                                       batches, reduce=pmean)
            if config.target_kl is None:
                return (new_params, new_opt_state, stopped), (info, jnp.float32(1))
            # KL early stop: once an epoch ends above target_kl, skip the remaining ones.
            keep = lambda new, old: jax.tree.map(  # noqa: E731
                lambda n, o: jnp.where(stopped, o, n), new, old)
            params, opt_state = keep(new_params, params), keep(new_opt_state, opt_state)
            ran = 1.0 - stopped.astype(jnp.float32)
            stopped = jnp.logical_or(stopped, info.approx_kl[-1] > config.target_kl)
            return (params, opt_state, stopped), (info, ran)

        (params, opt_state, _), (info, ran) = lax.scan(
            epoch, (state.params, opt_state, jnp.bool_(False)),
            jax.random.split(key, config.update_epochs))
        return params, stored(params, opt_state), info, ran

    def policy(params, obs_stats):
        """pi(.|s) under `params`, as `rollout` calls it: `(key, obs, first, hidden) ->
        (action, PolicyInfo, hidden)`, the core stepped once (and reset where `first`)."""
        def sample(key, obs, first, hidden):
            if config.normalize_obs:
                obs = normalize.normalize(obs_stats, obs)
            if recurrent:  # one time step of the sequence
                pi, value, memory = network.apply(params, obs[None], hidden, first[None])
                action, log_prob = pi.sample_and_log_prob(seed=key)
                return action[0], PolicyInfo(log_prob[0], value[0], memory[0]), memory[0]
            pi, value, _ = network.apply(params, obs)
            action, log_prob = pi.sample_and_log_prob(seed=key)
            return action, PolicyInfo(log_prob, value, None), None

        return sample

    def update_step(state: TrainState, hp: HParams, update):
        """One PPO iteration: collect a rollout, compute GAE, run the epochs of minibatch SGD."""
        key, key_rollout, key_epochs = jax.random.split(state.key, 3)
        key_rollout = distributed.fold_in_device(key_rollout)  # data-parallel: own randomness

        # COLLECT TRAJECTORIES with the current policy
        env_state, traj = rollout(env, env_params, spec, policy(state.params, state.obs_stats),
                                  state.env, key_rollout, config.num_steps,
                                  config.fresh_starts)

        # REWARD SCALE (optional): divide by the running std of the discounted return
        reward_stats = state.reward_stats
        if config.normalize_reward:
            reward_stats, discounted, reward = normalize.normalize_rewards(
                reward_stats, env_state.discounted_return, traj.reward,
                traj.terminated | traj.truncated, hp.gamma)
            env_state = env_state._replace(discounted_return=discounted)
            traj = traj._replace(reward=reward)

        # ADVANTAGES: GAE, bootstrapping from V of the true next observation
        next_obs = traj.next_obs
        if config.normalize_obs:
            next_obs = normalize.normalize(state.obs_stats, next_obs)
        next_value = next_values(state.params, next_obs, traj.policy_info.memory)
        advantage, ret = gae(traj.reward, traj.policy_info.value, next_value,
                             traj.terminated, traj.truncated, hp.gamma, hp.gae_lambda)
        data = Transition(traj.obs, traj.action, traj.policy_info.log_prob,
                          traj.policy_info.value, advantage, ret,
                          traj.first if recurrent else None)
        # GATHER (data-parallel): every device gets the global batch, environments in order
        data = distributed.all_gather(data, axis=1)
        hidden = distributed.all_gather(state.env.hidden, axis=0)  # the rollout's start states
        if recurrent:  # whole sequences, environment-major [num_envs, T]
            data = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), data)
        else:  # single samples [batch_size]
            data = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), data)

        # UPDATE: update_epochs passes over shuffled minibatches
        params, opt_state, info, ran = learn(state, hp, data, key_epochs, update, hidden)

        obs_stats = state.obs_stats
        if config.normalize_obs:  # global batch
            obs_stats = normalize.update(obs_stats, data.obs.reshape((-1,) + spec.obs_shape),
                                         axis_name=None)

        # METRICS: one row per update, losses averaged over the minibatches that ran
        ret_sum, len_sum, repeated_sum, count = pmean(finished_episode_stats(traj))
        losses = jax.tree.map(lambda x: (x.mean(-1) * ran).sum() / ran.sum(), info)
        metrics = {
            "global_step": steps_done(update, batch_size, num_updates),
            "episodic_return": ret_sum / count,
            "episodic_length": len_sum / count,
            "repeated_starts": repeated_sum / count,  # NaN with no restart, as the return
            "learning_rate": learning_rate(hp, update),
            **losses._asdict(),
            "explained_variance": distributed.explained_variance(data.ret, data.value),
        }
        if progress is not None:
            progress.report_from_jit(update, num_updates, metrics["global_step"],
                                     metrics["episodic_return"])
        return TrainState(params, opt_state, obs_stats, reward_stats, env_state, key), metrics

    def act(state: TrainState, obs, first, hidden):
        """The deterministic policy, for evaluation: `(mode of pi(.|obs), hidden)`, the core
        state carried (and reset where `first`) as in the rollout."""
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
        progress = Progress(f"ppo {config.env_id}", num_updates * batch_size)
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

    return cli.main("ppo", Config, make_train, argv)


if __name__ == "__main__":
    main()
