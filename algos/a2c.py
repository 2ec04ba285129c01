"""Advantage Actor-Critic (A2C), the synchronous variant of A3C, in one file.

Mnih, Badia, Mirza, Graves, Lillicrap, Harley, Silver, Kavukcuoglu (2016), "Asynchronous
Methods for Deep Reinforcement Learning", arXiv:1602.01783, Algorithm S3 (A3C) run
synchronously: `num_envs` environments act for `num_steps` steps with the current policy, then
one gradient step on the whole rollout of

    L = -mean_t[ A_t * log pi(a_t|s_t) ] + vf_coef * 0.5 * mean_t[ (G_t - V(s_t))^2 ]
        - ent_coef * mean_t[ H(pi(.|s_t)) ]

with A_t and G_t targets (no gradient). No ratio, no clipping, no epochs, no replay.

Returns: `gae_lambda = 1` gives the paper's n-step bootstrapped returns,
G_t = r_t + gamma r_{t+1} + ... + gamma^{T-t} V(s_T), A_t = G_t - V(s_t); any other lambda gives
GAE (Schulman et al. 2016, arXiv:1506.02438). Both come from `common/gae.py`, which also keeps
termination (no bootstrap) and time-limit truncation (bootstrap from the final observation,
Pardo et al. 2018, arXiv:1712.00378) apart.

What differs from the paper, following OpenAI Baselines' `a2c` and Stable-Baselines3's `A2C`
(the implementations whose defaults are used here, see `Config`):
- synchronous batches instead of asynchronous workers (the "A2C" of Baselines; Wu et al. 2017,
  arXiv:1708.05144, found it no worse than A3C);
- RMSprop with statistics per run (not shared across workers) and eps added outside the square
  root, as PyTorch's `torch.optim.RMSprop` that SB3 uses; gradients clipped by global norm;
- separate actor and critic MLPs (64x64 tanh, orthogonal init, policy head scaled 0.01), or a
  shared small CNN torso for image observations (MinAtar) -- the same network as `ppo.py`,
  also with its GRU or LSTM core (`--network gru`, `lstm`), recomputed over the rollout in
  the update from the state stored at the rollout's start;
- the value loss carries a factor 0.5 (as in `ppo.py`); Baselines and SB3 use the plain mean
  squared error, so their `vf_coef` equals ours / 2 for the same gradient.

From Python (needs only `common/` modules `envs`, `envapi`, `gymnaxenv`, `rollout`, `scan`,
`threefry`, `gae`, `normalize`, `distributed`, `nn`, `minibatch` and `validate`;
`docs/copying.md`):

    train = make_train(Config(env_id="CartPole-v1"))
    state, metrics = jax.jit(train)(jax.random.PRNGKey(0))
    states, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 16))   # 16 seeds

From the command line (`common/host/`: seeds, logging, checkpoints, devices; README):
`python algos/a2c.py --env-id CartPole-v1 --num-seeds 4`.
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
from common.minibatch import sgd_scan
from common.nn import CORES, Conv, Dense, orthogonal
from common.rollout import EnvState, finished_episode_stats, reset, rollout, steps_done
from common.validate import check_fields, require


@dataclasses.dataclass(frozen=True)
class Config:
    """A2C hyperparameters.

    Defaults: the widely used A2C settings of OpenAI Baselines `a2c` (RMSprop, lr 7e-4, alpha
    0.99, eps 1e-5, 5 steps, gradient clip 0.5), 16 environments as the A3C paper's 16 actor
    threads, and Stable-Baselines3 `A2C` (n-step returns `gae_lambda=1`, entropy coefficient
    0.0, constant learning rate where Baselines anneals it, no advantage normalisation;
    rl-baselines3-zoo's CartPole config is these with 8 environments), except the value
    coefficient: half of theirs (`vf_coef`). RMSprop is PyTorch's, as in SB3: its average of
    squared gradients starts at 0 and eps sits outside the square root (TensorFlow 1's, in
    Baselines, starts the average at 1 and adds eps inside).
    """

    # --- environment ---
    env_id: str = "CartPole-v1"
    """A gymnax id, `brax/<name>` (`.[brax]`; name one of ant, halfcheetah, hopper, humanoid,
    humanoidstandup, inverted_pendulum, inverted_double_pendulum, pusher, reacher, swimmer,
    walker2d), `playground/<Task>` (the Control Suite, `.[playground]`) or a masked task."""
    brax_backend: Literal["spring", "positional", "generalized", "mjx"] = "positional"
    """Brax's physics pipeline for a `brax/...` id (docs/environments.md says why this one)."""
    total_timesteps: int = 500_000
    """Environment steps per run (rounded down to whole updates)."""
    num_envs: int = 16
    """Parallel environments per run."""
    num_steps: int = 5
    """Steps per environment per rollout (the n of the n-step returns)."""
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
    learning_rate: float = 7e-4
    """Learning rate (the start value when annealed)."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly toward 0: update k of N (k = 0, ..., N-1) uses
    lr * (1 - k / N), as CleanRL."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda; 1.0 gives the classic n-step bootstrapped returns of A2C/A3C."""
    norm_adv: bool = False
    """Normalise advantages over each rollout (SB3's `normalize_advantage`), dividing by the
    population standard deviation where SB3 uses the sample one: a factor sqrt((B-1)/B),
    0.6% at the default B = 80 samples."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient. 0.0 as SB3; Baselines' 0.01 keeps CartPole's policy too
    random to hold 500 (mean final return 453 over 16 seeds, one seed at 193). MinAtar
    needs far more: 0.3 with normalised advantages (`common/presets.py`). With 0.05 or less
    the policy turns near-deterministic early and stalls (Breakout, 5e6 steps: about 6; 0.1
    reached 11 at lr 1e-3, 0.3 reached 32 at lr 4e-3)."""
    vf_coef: float = 0.5
    """Value loss coefficient. The value loss is 0.5 * mean squared error, so this is twice
    Baselines' and SB3's `vf_coef`: 0.5 here is their 0.25. Their 0.5 (1.0 here) learned worse
    with these settings (vmapped sweeps of both values on the same seeds, the presets
    otherwise; `benchmarks/results/sweeps/a2c__*vf.json`): MountainCarContinuous 13.7 against
    46.4 (16 seeds, 2 against 6 solved), MaskedCartPole 130 against 170 with a GRU and 184
    against 262 with an LSTM (8 seeds; the worst seed 9 against 88 and 193); MemoryChain
    solved by all 16 seeds with either. On Pendulum the two are even within seed noise, and
    that preset keeps RL Zoo's value (`common/presets.py`)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """Optimiser: RMSprop (PyTorch/SB3 semantics, not centred) or Adam."""
    rms_decay: float = 0.99
    """RMSprop's decay of the squared-gradient average (PyTorch's `alpha`)."""
    opt_eps: float = 1e-5
    """Epsilon of the optimiser's denominator, added outside the square root (PyTorch)."""

    # --- network ---
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the MLPs (the CNN torso always uses ReLU)."""
    log_std_init: float = 0.0
    """Continuous actions: the Gaussian policy's initial log standard deviation (a learned
    parameter per action dimension; SB3's `log_std_init`)."""
    squash_mean: bool = False
    """Continuous actions: the Gaussian's mean inside the action space's bounds, mid +
    half-width x tanh(x), not the layer's output x. The environment takes the action clipped
    to its bounds, so a mean pushed past one gets no signal back and can stay there."""
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
        require(self, "positive_int", "total_timesteps", "num_envs", "num_steps", "hidden_size")
        require(self, "positive", "learning_rate", "max_grad_norm", "opt_eps")
        require(self, "fraction", "fresh_starts")
        require(self, "unit", "gamma", "gae_lambda")
        require(self, "unit_open", "rms_decay")
        require(self, "nonnegative", "ent_coef", "vf_coef")
        if self.norm_adv and self.batch_size < 2:
            raise ValueError(
                "--norm-adv normalises the advantages over each rollout, but a rollout holds "
                "one sample (num_envs * num_steps = 1): every normalised advantage would be 0 "
                "and the policy would not learn. Use more --num-envs or --num-steps, or "
                "--no-norm-adv.")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"--total-timesteps {self.total_timesteps} is less than one "
                             f"rollout (num_envs * num_steps = {self.batch_size}).")
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
    gamma: jax.Array
    gae_lambda: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    max_grad_norm: jax.Array
    rms_decay: jax.Array
    opt_eps: jax.Array


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
    squash_mean: bool = False

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
            if self.squash_mean:  # inside [low, high]
                low, high = np.asarray(self.spec.action_low), np.asarray(self.spec.action_high)
                mean = (high + low) / 2 + (high - low) / 2 * jnp.tanh(mean)
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init),
                                 (self.spec.action_dim,))
            pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std) * jnp.ones_like(mean))
        return pi, value, memory


class PolicyInfo(NamedTuple):
    """What the actor records at acting time, beside the action."""

    value: jax.Array
    memory: jax.Array | None
    """The recurrent core's state after this step, for the bootstrap value; else None."""


class Transition(NamedTuple):
    """Training samples: one per (step, environment), flattened (feed-forward), or whole
    sequences [num_envs, T] (recurrent)."""

    obs: jax.Array
    action: jax.Array
    value: jax.Array
    """V(s), recorded when acting (the parameters the gradient step starts from)."""
    advantage: jax.Array
    ret: jax.Array
    """The return target G_t, advantage + value."""
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


# --------------------------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------------------------
def a2c_loss(log_prob, entropy, value, batch: Transition, hp: "HParams", *,
             norm_adv: bool = False):
    r"""The A2C loss of one rollout (Algorithm S3's update, as a loss to minimise):

        L = -mean[A_t log pi(a_t|s_t)] + vf_coef * 0.5 mean[(G_t - V(s_t))^2] - ent_coef mean[H_t]

    A_t and G_t are targets, computed before the step from the rollout (`common.gae.gae`:
    with `gae_lambda = 1`, G_t is the n-step return of Mnih et al. 2016, r_t + gamma G_{t+1},
    ending in V(s'_t) at a truncation or at the rollout's last step and in 0 at a
    termination): the gradient reaches the policy only through `log_prob` and the critic only
    through `value` in the squared error.

    Args:
      log_prob, entropy, value: log pi(a|s), H(pi(.|s)) and V(s) under the parameters being
        trained, one per sample [B] (or [T, B]).
      batch: the samples' `Transition`s (advantages and returns), every field [B, ...].
      hp: the `HParams` (ent_coef, vf_coef).
      norm_adv: normalise the advantages to mean 0, std 1 over the rollout (across the
        devices of a data-parallel run).

    Returns:
      `(loss, LossInfo)`, scalars.
    """
    advantage = batch.advantage
    if norm_adv:
        mean, var = distributed.mean_var(advantage)
        advantage = (advantage - mean) / (jnp.sqrt(var) + 1e-8)
    policy_loss = -(advantage * log_prob).mean()
    value_loss = 0.5 * jnp.square(batch.ret - value).mean()
    entropy = entropy.mean()
    loss = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
    return loss, LossInfo(value_loss, policy_loss, entropy)


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
    if config.squash_mean and (spec.discrete or not np.isfinite(
            np.concatenate([spec.action_low, spec.action_high])).all()):
        raise ValueError(f"--squash-mean needs bounded continuous actions, but {config.env_id}"
                         f"'s are {'discrete' if spec.discrete else 'unbounded'}; leave it off.")
    cnn = config.torso == "cnn" or (config.torso == "auto" and spec.image_obs)
    recurrent = config.recurrent
    network = ActorCritic(spec, config.hidden_size, config.activation, cnn, config.core,
                          config.log_std_init, config.squash_mean)
    num_updates, batch_size = config.num_updates, config.batch_size

    def learning_rate(hp: HParams, update):
        if config.anneal_lr:
            return hp.learning_rate * (1.0 - update / num_updates)
        return hp.learning_rate

    def make_optimizer(hp: HParams, lr):
        """Global-norm gradient clipping, then RMSprop (or Adam) with step size `lr`, on the
        parameter tree. (`ppo.py` and `impala.py` wrap theirs in `flat_optimizer`, which pays
        over many minibatch steps per update; with A2C's one step it cost 3% on CPU,
        docs/performance.md.)"""
        if config.optimizer == "rmsprop":
            # PyTorch's RMSprop (what SB3 uses): v = alpha v + (1 - alpha) g^2, step
            # lr g / (sqrt(v) + eps) -- eps outside the square root (optax's default puts it
            # inside, https://github.com/google-deepmind/optax/issues/532), accumulator
            # starting at 0, no centring, no momentum.
            step = optax.rmsprop(lr, decay=hp.rms_decay, eps=hp.opt_eps, eps_in_sqrt=False,
                                 centered=False)
        else:
            step = optax.adam(lr, eps=hp.opt_eps)
        return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm), step)

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
        return a2c_loss(pi.log_prob(batch.action), pi.entropy(), value, batch, hp,
                        norm_adv=config.norm_adv)

    def init(key, hparams: HParams | None = None) -> TrainState:
        """Fresh parameters, optimiser state and environments for one run (data-parallel:
        the same parameters on every device, each device its own share of the environments)."""
        hp = config.hparams() if hparams is None else hparams
        key, key_net, key_env = jax.random.split(key, 3)
        params = network.init(key_net, jnp.zeros((1, 1) + spec.obs_shape, jnp.float32),
                              initial_hidden(1), jnp.ones((1, 1), bool))
        devices = distributed.axis_size()
        if config.num_envs % devices:
            raise ValueError(f"data-parallel A2C on {devices} devices needs --num-envs "
                             f"({config.num_envs}) to divide by {devices}.")
        num_envs = config.num_envs // devices
        return TrainState(params, make_optimizer(hp, hp.learning_rate).init(params),
                          normalize.init(spec.obs_shape), normalize.init(()),
                          reset(env, env_params, distributed.fold_in_device(key_env), num_envs,
                                initial_hidden(num_envs), config.fresh_starts,
                                config.num_steps), key)

    def learn(state: TrainState, hp: HParams, data: Transition, update, hidden=None):
        """One gradient step on the whole rollout `data` (Algorithm S3's update), at the
        learning rate of update number `update`: minibatch SGD with one epoch of one
        minibatch. Feed-forward: `data` holds single samples [batch_size] and `hidden` is
        None; recurrent: whole sequences [num_envs, T] and `hidden` [num_envs, H] the
        recurrent state at each one's start, the core recomputed over them.

        In data-parallel runs every device holds the global batch, computes the gradient of its
        1/D share and `pmean` averages them (advantage normalisation uses global statistics),
        so the result does not depend on the number of devices.
        Returns `(params, opt_state, info)`.
        """
        optimizer = make_optimizer(hp, learning_rate(hp, update))
        # data-parallel: each device's share of the batch, gradients averaged (pmean)
        loss = lambda p, batch: loss_fn(  # noqa: E731
            p, hp, state.obs_stats, distributed.device_share(batch))
        whole = jax.tree.map(lambda x: x[None], (hidden, data))  # one minibatch: all of it
        params, opt_state, info = sgd_scan(loss, optimizer, state.params, state.opt_state,
                                           whole, reduce=pmean)
        return params, opt_state, jax.tree.map(lambda x: x[0], info)

    def policy(params, obs_stats):
        """pi(.|s) under `params`, as `rollout` calls it: `(key, obs, first, hidden) ->
        (action, PolicyInfo, hidden)`, the core stepped once (and reset where `first`)."""
        def sample(key, obs, first, hidden):
            if config.normalize_obs:
                obs = normalize.normalize(obs_stats, obs)
            if recurrent:  # one time step of the sequence
                pi, value, memory = network.apply(params, obs[None], hidden, first[None])
                return pi.sample(seed=key)[0], PolicyInfo(value[0], memory[0]), memory[0]
            pi, value, _ = network.apply(params, obs)
            return pi.sample(seed=key), PolicyInfo(value, None), None

        return sample

    def update_step(state: TrainState, hp: HParams, update):
        """One A2C iteration: collect a rollout, take one gradient step on all of it."""
        key, key_rollout = jax.random.split(state.key)
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

        # ADVANTAGES: n-step returns (GAE with gae_lambda < 1), bootstrapping from V of the
        # true next observation
        next_obs = traj.next_obs
        if config.normalize_obs:
            next_obs = normalize.normalize(state.obs_stats, next_obs)
        next_value = next_values(state.params, next_obs, traj.policy_info.memory)
        advantage, ret = gae(traj.reward, traj.policy_info.value, next_value,
                             traj.terminated, traj.truncated, hp.gamma, hp.gae_lambda)
        data = Transition(traj.obs, traj.action, traj.policy_info.value, advantage, ret,
                          traj.first if recurrent else None)
        # GATHER (data-parallel): every device gets the global batch, environments in order
        data = distributed.all_gather(data, axis=1)
        hidden = distributed.all_gather(state.env.hidden, axis=0)  # the rollout's start states
        if recurrent:  # whole sequences, environment-major [num_envs, T]
            data = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), data)
        else:  # single samples [batch_size]
            data = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), data)

        # UPDATE: one gradient step on the whole rollout
        params, opt_state, info = learn(state, hp, data, update, hidden)

        obs_stats = state.obs_stats
        if config.normalize_obs:  # global batch
            obs_stats = normalize.update(obs_stats, data.obs.reshape((-1,) + spec.obs_shape),
                                         axis_name=None)

        # METRICS: one row per update
        ret_sum, len_sum, repeated_sum, count = pmean(finished_episode_stats(traj))
        metrics = {
            "global_step": steps_done(update, batch_size, num_updates),
            "episodic_return": ret_sum / count,
            "episodic_length": len_sum / count,
            "repeated_starts": repeated_sum / count,  # NaN with no restart, as the return
            "learning_rate": learning_rate(hp, update),
            **info._asdict(),
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
        progress = Progress(f"a2c {config.env_id}", num_updates * batch_size)
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

    return cli.main("a2c", Config, make_train, argv)


if __name__ == "__main__":
    main()
