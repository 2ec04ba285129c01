"""Proximal Policy Optimisation (PPO), clipped objective, in one file.

Schulman, Wolski, Dhariwal, Radford, Klimov (2017), "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, Algorithm 1 with the clipped surrogate L^CLIP (eq. 7), a value loss and an
entropy bonus (eq. 9), and GAE advantages (eq. 11-12; Schulman et al. 2016, arXiv:1506.02438).

What differs from the paper, all following the implementation details catalogued by Huang et
al. (2022), "The 37 Implementation Details of PPO" (ICLR blog track), and matching CleanRL's
`ppo.py` flags and defaults:
- advantages are normalised per minibatch (`norm_adv`), the value loss is clipped around the
  rollout's values (`clip_vloss`), gradients are clipped by global norm (`max_grad_norm`),
  Adam uses eps=1e-5 and the learning rate is annealed linearly to 0 (`anneal_lr`);
- separate actor and critic MLPs (64x64 tanh, orthogonal init, policy head scaled 0.01) or a
  shared small CNN torso for image observations (MinAtar);
- a time-limit truncation bootstraps from the final observation instead of being treated as
  a terminal state (Pardo et al. 2018, arXiv:1712.00378) -- see `common/gae.py`;
- optional early stop of an update's epochs when the approximate KL exceeds `target_kl`.

Four pieces are there only for speed on CPU and change no equation: `Dense`
(`common/dense.py`, `nn.Dense` with a weight gradient XLA:CPU runs on its fast kernels); the
minibatch loop of `learn` (the parameters carried as their matrices plus one vector of biases,
`common/params.py`, the optimiser on one flat vector, the learning rate set once per update);
`shuffled_minibatches` (`common/minibatch.py`, a faster sort for the same kind of
permutation); and `unroll_threefry_on_cpu` (`common/prng.py`, the same random bits without a
loop). The shared rollout runs its scan packed (`common/scan.py`) for the same reason.

Use it from the command line, `python algos/ppo.py --env-id CartPole-v1 --num-seeds 4` (on
every core: `--num-devices`, `--parallel seeds|data`, `--coordinator-address`; README, "Scaling
out"), or from Python:

    train = make_train(Config(env_id="CartPole-v1"))
    state, metrics = jax.jit(train)(jax.random.PRNGKey(0))
    states, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 16))   # 16 seeds
"""

import dataclasses
from typing import Literal, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro
from jax import lax

from common import cli, distributed, logger, normalize
from common.conv import Conv
from common.dense import Dense
from common.distributed import pmean
from common.envs import EnvSpec, make_env
from common.gae import gae
from common.init import orthogonal
from common.minibatch import shuffled_minibatches
from common.params import carry_form
from common.prng import unroll_threefry_on_cpu
from common.rollout import EnvState, finished_episode_stats, reset, rollout


@dataclasses.dataclass(frozen=True)
class Config:
    """PPO hyperparameters. Defaults: CleanRL's `ppo.py` / PureJaxRL's CartPole config."""

    # --- run ---
    exp_name: str = "ppo"
    """Experiment name, part of the run directory name."""
    seed: int = 1
    """Seed of the first run; run i of `num_seeds` uses seed `seed + i`."""
    num_seeds: int = 1
    """Independent runs trained together in one vmapped call, each logged as its own run."""
    log_dir: str = "runs"
    """TensorBoard runs go to `{log_dir}/{env_id}__{exp_name}__{seed}__{unix_time}`."""
    live_progress: tyro.conf.Suppress[bool] = False
    """Python API only: print progress from inside the compiled `train` (jax.debug.callback)."""
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

    # --- environment ---
    env_id: str = "CartPole-v1"
    """A gymnax environment id."""
    total_timesteps: int = 500_000
    """Environment steps per run (rounded down to whole updates)."""
    num_envs: int = 4
    """Parallel environments per run."""
    num_steps: int = 128
    """Steps per environment per rollout."""
    normalize_obs: bool = False
    """Normalise observations with running mean and variance (`common/normalize.py`)."""

    # --- algorithm ---
    learning_rate: float = 2.5e-4
    """Adam learning rate (the start value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Epochs over each rollout."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
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
    """Width of the two hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the MLPs (the CNN torso always uses ReLU)."""
    network: Literal["auto", "mlp", "cnn"] = "auto"
    """Torso: `auto` picks the CNN for image observations (MinAtar) and the MLPs otherwise;
    `mlp` flattens images into the MLPs (PureJaxRL's MinAtar baseline, much cheaper on a CPU)."""

    def __post_init__(self):
        positive = ("num_seeds", "total_timesteps", "num_envs", "num_steps", "num_minibatches",
                    "update_epochs", "hidden_size", "eval_episodes")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"got {getattr(self, name)}.")
        if self.num_devices < 0 or self.num_processes < 1 or \
                not 0 <= self.process_id < self.num_processes or self.distributed_timeout < 1:
            raise ValueError("--num-devices must be >= 0, --num-processes >= 1, --process-id in "
                             "[0, num_processes) and --distributed-timeout >= 1.")
        if self.parallel not in ("seeds", "data"):
            raise ValueError(f"--parallel must be 'seeds' or 'data', got {self.parallel!r}.")
        for name in ("checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (0: never), got "
                                 f"{getattr(self, name)}.")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num_envs * num_steps = {self.batch_size} is not divisible by "
                f"--num-minibatches {self.num_minibatches}; pick sizes that divide.")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"--total-timesteps {self.total_timesteps} is less than one "
                             f"rollout (num_envs * num_steps = {self.batch_size}).")
        for name in ("learning_rate", "max_grad_norm", "clip_coef"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got "
                                 f"{getattr(self, name)}.")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got "
                                 f"{getattr(self, name)}.")
        for name in ("ent_coef", "vf_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got "
                                 f"{getattr(self, name)}.")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"--target-kl must be > 0 (or None), got {self.target_kl}.")
        if self.network not in ("auto", "mlp", "cnn"):
            raise ValueError(f"--network must be 'auto', 'mlp' or 'cnn', got {self.network!r}.")
        _, _, spec = make_env(self.env_id)  # an unknown id fails here, before anything compiles
        if self.network == "cnn" and not spec.image_obs:
            raise ValueError(f"--network cnn needs image observations (a MinAtar game), but "
                             f"{self.env_id} observations have shape {spec.obs_shape}; use "
                             f"--network mlp (or auto).")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

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
    """

    learning_rate: jax.Array
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
    """pi(a|s) and V(s). MLP torso: separate actor and critic MLPs (images flattened). CNN torso:
    one shared CNN (Conv 16 3x3, Dense 128, as the MinAtar baselines, Young & Tian 2019,
    arXiv:1903.03176) with a policy head and a value head."""

    spec: EnvSpec
    hidden_size: int = 64
    activation: str = "tanh"
    cnn: bool = False

    @nn.compact
    def __call__(self, obs):
        act = nn.tanh if self.activation == "tanh" else nn.relu
        dense = lambda n, scale: Dense(n, kernel_init=orthogonal(scale))  # noqa: E731
        if self.cnn:
            x = nn.relu(Conv(16, (3, 3), kernel_init=orthogonal(np.sqrt(2)))(obs))
            x = nn.relu(dense(128, np.sqrt(2))(x.reshape(x.shape[:-3] + (-1,))))
            actor, critic = x, x
        else:
            obs = obs.reshape(obs.shape[:obs.ndim - len(self.spec.obs_shape)] + (-1,))
            actor = act(dense(self.hidden_size, np.sqrt(2))(obs))
            actor = act(dense(self.hidden_size, np.sqrt(2))(actor))
            critic = act(dense(self.hidden_size, np.sqrt(2))(obs))
            critic = act(dense(self.hidden_size, np.sqrt(2))(critic))
        value = dense(1, 1.0)(critic).squeeze(-1)
        if self.spec.discrete:
            pi = distrax.Categorical(logits=dense(self.spec.action_dim, 0.01)(actor))
        else:
            mean = dense(self.spec.action_dim, 0.01)(actor)
            log_std = self.param("log_std", nn.initializers.zeros, (self.spec.action_dim,))
            pi = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std) * jnp.ones_like(mean))
        return pi, value


class PolicyInfo(NamedTuple):
    """What the actor records at acting time, beside the action."""

    log_prob: jax.Array
    value: jax.Array


class Transition(NamedTuple):
    """One flattened training sample."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    ret: jax.Array


class TrainState(NamedTuple):
    """Everything `train` carries from one update to the next."""

    params: dict
    opt_state: optax.OptState
    obs_stats: normalize.RunningStats
    env: EnvState
    key: jax.Array


class LossInfo(NamedTuple):
    value_loss: jax.Array
    policy_loss: jax.Array
    entropy: jax.Array
    approx_kl: jax.Array
    clipfrac: jax.Array


def make_train(config: Config):
    """Build `train(key, hparams=None) -> (TrainState, metrics)`, jittable and vmappable.

    `metrics` maps names to arrays with one row per update (leading axis `num_updates`).
    """
    unroll_threefry_on_cpu()  # speed only, the same random bits: common/prng.py
    env, env_params, spec = make_env(config.env_id)
    cnn = config.network == "cnn" or (config.network == "auto" and spec.image_obs)
    network = ActorCritic(spec, config.hidden_size, config.activation, cnn)
    num_updates, batch_size = config.num_updates, config.batch_size
    report_every = max(1, num_updates // 50)
    progress = logger.Progress(f"ppo {config.env_id}", num_updates * batch_size) \
        if config.live_progress else None

    def learning_rate(hp: HParams, update):
        if config.anneal_lr:
            return hp.learning_rate * (1.0 - update / num_updates)
        return hp.learning_rate

    def make_optimizer(hp: HParams, lr):
        """Global-norm gradient clipping, then Adam (eps 1e-5) with step size `lr`."""
        return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                           optax.adam(lr, eps=1e-5))

    def loss_fn(params, hp: HParams, obs_stats, batch: Transition):
        obs = normalize.normalize(obs_stats, batch.obs) if config.normalize_obs else batch.obs
        pi, value = network.apply(params, obs)
        log_prob = pi.log_prob(batch.action)
        log_ratio = log_prob - batch.log_prob
        ratio = jnp.exp(log_ratio)
        advantage = batch.advantage
        if config.norm_adv:  # over the whole minibatch, across devices in data-parallel runs
            mean, var = distributed.mean_var(advantage)
            advantage = (advantage - mean) / (jnp.sqrt(var) + 1e-8)
        # Clipped surrogate objective, L^CLIP (paper eq. 7), as a loss to minimise.
        policy_loss = jnp.maximum(
            -advantage * ratio,
            -advantage * jnp.clip(ratio, 1.0 - hp.clip_coef, 1.0 + hp.clip_coef)).mean()
        # Value loss, optionally clipped around the rollout's values.
        if config.clip_vloss:
            value_clipped = batch.value + jnp.clip(value - batch.value, -hp.clip_coef, hp.clip_coef)
            value_loss = 0.5 * jnp.maximum(jnp.square(value - batch.ret),
                                           jnp.square(value_clipped - batch.ret)).mean()
        else:
            value_loss = 0.5 * jnp.square(value - batch.ret).mean()
        entropy = pi.entropy().mean()
        loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss
        # Diagnostics (Schulman's k3 KL estimator, http://joschu.net/blog/kl-approx.html).
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = (jnp.abs(ratio - 1.0) > hp.clip_coef).astype(jnp.float32).mean()
        return loss, LossInfo(value_loss, policy_loss, entropy, lax.stop_gradient(approx_kl),
                              clipfrac)

    def local_num_envs():
        """This device's environments: `num_envs` split across the devices of `DATA_AXIS`."""
        devices = distributed.axis_size()
        if config.num_envs % devices or config.minibatch_size % devices:
            raise ValueError(f"data-parallel PPO on {devices} devices needs --num-envs "
                             f"({config.num_envs}) and the minibatch size "
                             f"({config.minibatch_size}) to divide by {devices}.")
        return config.num_envs // devices

    def init(key, hparams: HParams | None = None) -> TrainState:
        """Fresh parameters, optimiser state and environments for one run (data-parallel:
        the same parameters on every device, each device its own environments)."""
        hp = config.hparams() if hparams is None else hparams
        key, key_net, key_env = jax.random.split(key, 3)
        params = network.init(key_net, jnp.zeros((1,) + spec.obs_shape, jnp.float32))
        form = carry_form(params)  # the optimiser's state is for one flat vector (see `learn`)
        opt_state = make_optimizer(hp, hp.learning_rate).init(form.ravel(form.to_carry(params)))
        return TrainState(params, opt_state, normalize.init(spec.obs_shape),
                          reset(env, env_params, distributed.fold_in_device(key_env),
                                local_num_envs()), key)

    def learn(state: TrainState, hp: HParams, data: Transition, key, update):
        """The epochs of minibatch SGD on one global batch `data` (leading axis batch_size),
        at the learning rate of update number `update`.

        Every device shuffles the same batch with the same key; in data-parallel runs each
        computes the gradient of its 1/D share of every minibatch and `pmean` averages them,
        so the result does not depend on the number of devices.
        The epochs carry the parameters as their matrices plus one vector of all the biases,
        and clipping, Adam and the step run on them as one flat vector (`common/params.py`).
        (Speed only: XLA:CPU then never has more than 8 kernels ready at once in a minibatch,
        and does not hand half of them to another thread, which on two cores had cost the
        run about a third of its speed; README, "Against PureJaxRL".)
        Returns `(params, opt_state, info, ran)`: `info` per epoch and minibatch, `ran` 1.0 for
        the epochs that ran (0.0 after a KL early stop).
        """
        optimizer = make_optimizer(hp, learning_rate(hp, update))
        form = carry_form(state.params)

        def epoch(carry, key):
            params, opt_state, stopped = carry

            def minibatch(carry, batch: Transition):
                params, opt_state = carry
                grads, info = jax.grad(lambda p: loss_fn(
                    form.to_params(p), hp, state.obs_stats, distributed.device_share(batch)),
                    has_aux=True)(params)
                grads, info = pmean((grads, info))  # data-parallel: average over devices
                updates, opt_state = optimizer.update(form.ravel(grads), opt_state)
                return (optax.apply_updates(params, form.unravel(updates)), opt_state), info

            batches = shuffled_minibatches(key, data, config.num_minibatches)
            (new_params, new_opt_state), info = lax.scan(minibatch, (params, opt_state), batches)
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
            epoch, (form.to_carry(state.params), state.opt_state, jnp.bool_(False)),
            jax.random.split(key, config.update_epochs))
        return form.to_params(params), opt_state, info, ran

    def update_step(state: TrainState, hp: HParams, update):
        """One PPO iteration: collect a rollout, compute GAE, run the epochs of minibatch SGD."""
        key, key_rollout, key_epochs = jax.random.split(state.key, 3)
        key_rollout = distributed.fold_in_device(key_rollout)  # data-parallel: own randomness

        # COLLECT TRAJECTORIES with the current policy
        def policy(key, obs):
            if config.normalize_obs:
                obs = normalize.normalize(state.obs_stats, obs)
            pi, value = network.apply(state.params, obs)
            action, log_prob = pi.sample_and_log_prob(seed=key)
            return action, PolicyInfo(log_prob, value)

        env_state, traj = rollout(env, env_params, spec, policy, state.env, key_rollout,
                                  config.num_steps)

        # ADVANTAGES: GAE, bootstrapping from V of the true next observation
        next_obs = traj.next_obs
        if config.normalize_obs:
            next_obs = normalize.normalize(state.obs_stats, next_obs)
        _, next_value = network.apply(state.params, next_obs)
        advantage, ret = gae(traj.reward, traj.policy_info.value, next_value,
                             traj.terminated, traj.truncated, hp.gamma, hp.gae_lambda)
        data = Transition(traj.obs, traj.action, traj.policy_info.log_prob,
                          traj.policy_info.value, advantage, ret)
        # GATHER (data-parallel): every device gets the global batch, environments in order
        data = distributed.all_gather(data, axis=1)
        data = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), data)

        # UPDATE: update_epochs passes over shuffled minibatches
        params, opt_state, info, ran = learn(state, hp, data, key_epochs, update)

        obs_stats = state.obs_stats
        if config.normalize_obs:
            obs_stats = normalize.update(obs_stats, data.obs, axis_name=None)  # global batch

        # METRICS: one row per update, losses averaged over the minibatches that ran
        ret_sum, len_sum, count = pmean(finished_episode_stats(traj))
        losses = jax.tree.map(lambda x: (x.mean(-1) * ran).sum() / ran.sum(), info)
        metrics = {
            "global_step": (update + 1) * batch_size,
            "episodic_return": ret_sum / count,
            "episodic_length": len_sum / count,
            "learning_rate": learning_rate(hp, update),
            **losses._asdict(),
            "explained_variance": 1.0 - jnp.var(data.ret - data.value) / jnp.var(data.ret),
        }
        if progress is not None:
            logger.report_progress(progress, update, num_updates, report_every,
                                   metrics["global_step"], metrics["episodic_return"])
        return TrainState(params, opt_state, obs_stats, env_state, key), metrics

    def act(state: TrainState, obs):
        """The deterministic policy, for evaluation: the mode of pi(.|obs)."""
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs)
        return network.apply(state.params, obs)[0].mode()

    def run_updates(state: TrainState, hparams: HParams | None, updates):
        """Continue `state` through the updates numbered `updates` (a 1-D int array)."""
        hp = config.hparams() if hparams is None else hparams
        return lax.scan(lambda s, u: update_step(s, hp, u), state, updates)

    def train(key, hparams: HParams | None = None):
        """The whole run in one call: `(final TrainState, metrics)`."""
        return run_updates(init(key, hparams), hparams, jnp.arange(num_updates))

    # The pieces, for callers that run the updates in chunks (the CLI, checkpointing), the
    # evaluation policy, and the host-side printer of `live_progress` (call
    # `train.progress.close()` for its last line).
    train.init, train.run_updates, train.act, train.progress = init, run_updates, act, progress
    train.learn = learn
    return train


def main(argv=None):
    """Command line: parse a Config, train `num_seeds` runs together, log each to TensorBoard."""
    config = cli.parse_config(Config, argv)
    return cli.train_and_log("PPO", config, make_train(config))


if __name__ == "__main__":
    main()
