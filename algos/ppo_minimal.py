"""Proximal Policy Optimisation (PPO) in one self-contained file: a starting point to copy.

Schulman, Wolski, Dhariwal, Radford, Klimov (2017), "Proximal Policy Optimization Algorithms",
arXiv:1707.06347: Algorithm 1, the clipped surrogate L^CLIP (eq. 7) with a value loss and an
entropy bonus (eq. 9), GAE advantages (eq. 11-12; Schulman et al. 2016, arXiv:1506.02438).
What differs, as in CleanRL's `ppo.py` ("The 37 Implementation Details of PPO", Huang et al.
2022): advantages normalised per minibatch, a clipped value loss, global-norm gradient
clipping, Adam with eps 1e-5, a learning rate annealed linearly toward 0; separate 64x64 tanh
actor and critic MLPs, orthogonal init (Saxe et al. 2014, arXiv:1312.6120), policy head scaled
0.01; continuous actions from a diagonal Gaussian with a state-independent log-std, clipped to
the bounds only when sent to the environment. Time limits are not deaths (Pardo et al. 2018,
arXiv:1712.00378): GAE bootstraps from the observation a truncated episode really reached
(gymnax 1.0 reports `terminated` and `truncated` apart) and cuts the trace there (`gae`).

onpolicy-jax's `algos/ppo.py` cut to its core, gymnax and MLPs, importing nothing of the
repository; the full file adds Brax, a CNN, GRU/LSTM cores, observation and reward
normalisation, a KL early stop, data parallelism, checkpoints, logging and CPU speed helpers
(`tests/test_ppo_minimal.py` checks that both compute the same numbers where they coincide).
`python ppo_minimal.py --env-id CartPole-v1` trains one run (`--help` lists the flags); from
Python, `jax.jit(jax.vmap(make_train(Config())))(jax.random.split(key, 16))` trains 16 seeds.
"""

import dataclasses
import difflib
import math
import signal
import sys
import time
from typing import Literal, NamedTuple

if __name__ == "__main__" and "IPython" not in sys.modules:  # a script, not IPython's %run:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends it at once, compiling too (130)

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax


@dataclasses.dataclass(frozen=True)
class Config:
    """PPO hyperparameters. Defaults: CleanRL's `ppo.py` / PureJaxRL's CartPole config."""

    # --- environment ---
    env_id: str = "CartPole-v1"
    """A gymnax environment id (`gymnax.registered_envs`)."""
    total_timesteps: int = 500_000
    """Environment steps per run (rounded down to whole updates)."""
    num_envs: int = 4
    """Parallel environments per run."""
    num_steps: int = 128
    """Steps per environment per rollout."""
    # --- algorithm ---
    learning_rate: float = 2.5e-4
    """Adam learning rate (the start value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly: update k = 0, ..., N-1 uses lr * (1 - k / N)."""
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
    """Normalise advantages per minibatch, by their mean and population standard deviation."""
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
    # --- network ---
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Activation of the MLPs."""

    def __post_init__(self):  # each check: one line that names the flag and the fix
        def check(names, ok, must):
            for name in names:
                if not ok(value := getattr(self, name)):
                    raise ValueError(f"--{name.replace('_', '-')} {must}, got {value!r}.")
        integer = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool)  # noqa
        number = lambda v: (integer(v) or isinstance(v, float)) and math.isfinite(v)  # noqa
        check(("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
               "hidden_size"), lambda v: integer(v) and v >= 1, "must be a positive integer")
        check(("learning_rate", "opt_eps", "clip_coef", "max_grad_norm"),
              lambda v: number(v) and v > 0, "must be > 0")
        check(("ent_coef", "vf_coef"), lambda v: number(v) and v >= 0, "must be >= 0")
        check(("gamma", "gae_lambda"), lambda v: number(v) and 0 <= v <= 1, "must be in [0, 1]")
        check(("activation",), lambda v: v in ("tanh", "relu"), "must be 'tanh' or 'relu'")
        if self.batch_size % self.num_minibatches:
            raise ValueError(f"num_envs * num_steps = {self.batch_size} is not divisible by "
                             f"--num-minibatches {self.num_minibatches}; pick sizes that divide.")
        if self.norm_adv and self.minibatch_size < 2:
            raise ValueError("--norm-adv needs minibatches of 2 samples or more: use fewer "
                             "--num-minibatches, more --num-envs or --num-steps, or --no-norm-adv.")
        if not self.batch_size <= self.total_timesteps < 2**31:
            raise ValueError(f"--total-timesteps must be at least one rollout (num_envs * num_steps"
                             f" = {self.batch_size}) and below 2**31, got {self.total_timesteps}.")
        import gymnax  # here, not at the top: importing gymnax starts JAX's backend
        if self.env_id not in gymnax.registered_envs:
            close = difflib.get_close_matches(self.env_id, gymnax.registered_envs, 3, 0.5)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"unknown gymnax environment id {self.env_id!r}.{hint} Known ids: "
                             f"{', '.join(gymnax.registered_envs)} (Brax: algos/ppo.py).")

    batch_size = property(lambda self: self.num_envs * self.num_steps)
    minibatch_size = property(lambda self: self.batch_size // self.num_minibatches)
    num_updates = property(lambda self: self.total_timesteps // self.batch_size)

    def hparams(self) -> "HParams":
        """The float hyperparameters as traced values (see `HParams`)."""
        return HParams(*(jnp.asarray(getattr(self, f), jnp.float32) for f in HParams._fields))


class HParams(NamedTuple):
    """Float hyperparameters, traced so one `vmap` sweeps them (they skip the Config's checks):
    `vmap(train)(keys, jax.vmap(lambda lr: config.hparams()._replace(learning_rate=lr))(lrs))`."""

    learning_rate: jax.Array
    opt_eps: jax.Array
    gamma: jax.Array
    gae_lambda: jax.Array
    clip_coef: jax.Array
    ent_coef: jax.Array
    vf_coef: jax.Array
    max_grad_norm: jax.Array


# --- Network -------------------------------------------------------------------------------
def orthogonal(scale: float):
    """flax's orthogonal initialiser, batched sequentially under `vmap` (the same numbers)."""
    init = nn.initializers.orthogonal(scale)
    # jaxlib 0.10.0-0.10.2 on CPU can deadlock on a batched QR (vmapped init): one QR per seed.
    return lambda key, shape, dtype=jnp.float32: jax.custom_batching.sequential_vmap(
        lambda k: init(k, shape, dtype))(key)


class ActorCritic(nn.Module):
    """`(pi(.|s), V(s))` for `obs` [..., *obs_shape] (flattened), from separate MLPs. pi is a
    Categorical, or a diagonal Gaussian with a learned, state-independent log-std."""

    action_dim: int
    discrete: bool
    obs_ndim: int = 1
    hidden_size: int = 64
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs):
        act = nn.tanh if self.activation == "tanh" else nn.relu
        dense = lambda n, scale: nn.Dense(n, kernel_init=orthogonal(scale))  # noqa: E731
        obs = obs.reshape(obs.shape[:obs.ndim - self.obs_ndim] + (-1,))
        hidden = lambda x: act(dense(self.hidden_size, np.sqrt(2))(x))  # noqa: E731
        actor, critic = hidden(hidden(obs)), hidden(hidden(obs))  # two layers each
        value = dense(1, 1.0)(critic).squeeze(-1)
        if self.discrete:
            return distrax.Categorical(logits=dense(self.action_dim, 0.01)(actor)), value
        mean = dense(self.action_dim, 0.01)(actor)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std) * jnp.ones_like(mean)), value


# --- Records -------------------------------------------------------------------------------
class Transition(NamedTuple):
    """One step of every environment, as the rollout records it: stacked time-major
    [num_steps, num_envs, ...], then flattened to training samples [batch_size, ...]."""

    obs: jax.Array
    action: jax.Array
    """a_t as sampled, before clipping to a Box's bounds (obs is s_t)."""
    log_prob: jax.Array
    """log pi_old(a_t|s_t) and V_old(s_t), recorded when acting."""
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    """s_{t+1} is terminal: no bootstrap."""
    truncated: jax.Array
    """A time limit ended the episode at step t, which did not terminate: bootstrap."""
    next_obs: jax.Array
    """s_{t+1} before the automatic reset (gymnax's `final_observation`)."""
    episode_return: jax.Array
    """The return and length of the episode that ended at step t (meaningful only there)."""
    episode_length: jax.Array
    advantage: jax.Array = None
    """A_t and the return target G_t = A_t + V_old(s_t), from `gae` after the rollout."""
    ret: jax.Array = None


class TrainState(NamedTuple):
    """The carry of `train` and of the rollout: parameters, optimiser state; per environment
    [num_envs] gymnax's state, the observation, the episode's return and length so far; a key."""

    params: dict
    opt_state: optax.OptState
    env_state: object
    obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    key: jax.Array


# --- Advantages and loss -------------------------------------------------------------------
def gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    r"""GAE advantages and lambda-returns (arXiv:1506.02438 eq. 16), all arrays [T, N]:

        delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   A_T = 0
        G_t     = A_t + V(s_t),          done_t = terminated_t or truncated_t

    `next_values` is V(s'_t) of the observation step t led to, before any automatic reset: a
    truncated step bootstraps from it, a terminated one from 0, and both cut the trace.
    """
    not_terminated = 1.0 - terminated.astype(values.dtype)
    not_done = 1.0 - jnp.logical_or(terminated, truncated).astype(values.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values

    def backward(advantage_tp1, xs):  # xs = (delta_t, gamma * lambda * (1 - done_t))
        advantage_t = xs[0] + xs[1] * advantage_tp1
        return advantage_t, advantage_t

    _, advantages = lax.scan(backward, jnp.zeros_like(values[0]),
                             (deltas, gamma * gae_lambda * not_done), reverse=True)
    return lax.stop_gradient(advantages), lax.stop_gradient(advantages + values)


def ppo_loss(log_prob, entropy, value, batch: Transition, hp: HParams, *,
             norm_adv: bool = True, clip_vloss: bool = True):
    r"""The PPO loss of one minibatch (paper eq. 9, as a loss to minimise):

        r = pi(a|s) / pi_old(a|s),   A = the advantages (normalised if `norm_adv`)
        L^CLIP = mean[ max(-A r, -A clip(r, 1 - eps, 1 + eps)) ]
        L^VF   = 0.5 mean[ max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2) ]
                 (plain 0.5 mean[(V - G)^2] without `clip_vloss`)
        L = L^CLIP + vf_coef L^VF - ent_coef mean[H]

    `log_prob`, `entropy`, `value`: log pi(a|s), H(pi(.|s)) and V(s) under the parameters being
    trained, [B]; `batch`: the samples' old log-probabilities and values, advantages, returns;
    `hp`: eps (`clip_coef`) and the coefficients.
    Returns `(loss, info)`, `info` a dict of scalars: `approx_kl` is the k3 estimate of
    KL(pi_old || pi) (http://joschu.net/blog/kl-approx.html), `clipfrac` the share of |r-1| > eps.
    """
    clip_coef, log_ratio = hp.clip_coef, log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    advantage = batch.advantage
    if norm_adv:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    policy_loss = jnp.maximum(-advantage * ratio,
                              -advantage * jnp.clip(ratio, 1.0 - clip_coef, 1.0 + clip_coef)).mean()
    value_loss = jnp.square(value - batch.ret)
    if clip_vloss:
        value_clipped = batch.value + jnp.clip(value - batch.value, -clip_coef, clip_coef)
        value_loss = jnp.maximum(value_loss, jnp.square(value_clipped - batch.ret))
    value_loss = 0.5 * value_loss.mean()
    entropy = entropy.mean()
    loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    clipfrac = (jnp.abs(ratio - 1.0) > clip_coef).astype(jnp.float32).mean()
    return loss, {"value_loss": value_loss, "policy_loss": policy_loss, "entropy": entropy,
                  "approx_kl": lax.stop_gradient(approx_kl), "clipfrac": clipfrac}


# --- Training ------------------------------------------------------------------------------
def make_train(config: Config):
    """Build `train(key, hparams=None) -> (TrainState, metrics)`, jittable and vmappable.
    `metrics` maps names to arrays with one row per update (leading axis `num_updates`)."""
    import gymnax  # here, not at the top: importing gymnax starts JAX's backend
    from gymnax.environments import spaces
    env, env_params = gymnax.make(config.env_id)
    obs_shape = tuple(env.observation_space(env_params).shape)
    space = env.action_space(env_params)
    discrete = isinstance(space, spaces.Discrete)  # else a Box of shape [action_dim]
    network = ActorCritic(space.n if discrete else space.shape[0], discrete, len(obs_shape),
                          config.hidden_size, config.activation)
    num_updates, batch_size, num_envs = config.num_updates, config.batch_size, config.num_envs
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def make_optimizer(hp: HParams, lr):
        # Adam's state does not hold the step size: each update builds it with its own rate.
        return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                           optax.adam(lr, eps=hp.opt_eps))

    def init(key, hp: HParams) -> TrainState:
        key, key_net, key_env = jax.random.split(key, 3)
        params = network.init(key_net, jnp.zeros((1,) + obs_shape, jnp.float32))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(key_env, num_envs), env_params)
        return TrainState(params, make_optimizer(hp, hp.learning_rate).init(params), env_state,
                          obs.astype(jnp.float32), jnp.zeros(num_envs, jnp.float32),
                          jnp.zeros(num_envs, jnp.int32), key)

    def env_step(state: TrainState, keys):
        """Act once in every environment (`keys`: the action's, then one per environment)."""
        key_act, keys = keys[0], keys[1:]
        pi, value = network.apply(state.params, state.obs)
        action, log_prob = pi.sample_and_log_prob(seed=key_act)
        env_action = action if discrete else jnp.clip(action, space.low, space.high)  # env only
        obs, env_state, reward, terminated, truncated, info = step_envs(
            keys, state.env_state, env_action, env_params)
        terminated = terminated.astype(bool)
        truncated = truncated.astype(bool) & ~terminated  # a step is one or the other
        done, reward = terminated | truncated, reward.astype(jnp.float32)
        episode_return, episode_length = state.episode_return + reward, state.episode_length + 1
        step = Transition(state.obs, action, log_prob, value, reward, terminated, truncated,
                          info["final_observation"].astype(jnp.float32), episode_return,
                          episode_length)
        return state._replace(env_state=env_state, obs=obs.astype(jnp.float32),
                              episode_return=jnp.where(done, 0.0, episode_return),
                              episode_length=jnp.where(done, 0, episode_length)), step

    def loss_fn(params, hp: HParams, batch: Transition):
        pi, value = network.apply(params, batch.obs)
        return ppo_loss(pi.log_prob(batch.action), pi.entropy(), value, batch, hp,
                        norm_adv=config.norm_adv, clip_vloss=config.clip_vloss)

    def update_step(state: TrainState, hp: HParams, update):
        """One PPO iteration: collect a rollout, compute GAE, run the epochs of minibatch SGD."""
        key, key_rollout, key_epochs = jax.random.split(state.key, 3)

        # COLLECT TRAJECTORIES with the current policy
        keys = jax.random.split(key_rollout, (config.num_steps, 1 + num_envs))  # all at once
        state, traj = lax.scan(env_step, state, keys)

        # ADVANTAGES: GAE, bootstrapping from V of the true next observation
        next_value = network.apply(state.params, traj.next_obs)[1]
        advantage, ret = gae(traj.reward, traj.value, next_value, traj.terminated,
                             traj.truncated, hp.gamma, hp.gae_lambda)
        data = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]),
                            traj._replace(advantage=advantage, ret=ret))

        # UPDATE: update_epochs passes over shuffled minibatches
        lr = hp.learning_rate * (1.0 - update / num_updates) if config.anneal_lr \
            else hp.learning_rate
        optimizer = make_optimizer(hp, lr)

        def minibatch_step(carry, batch: Transition):
            params, opt_state = carry
            grads, info = jax.grad(loss_fn, has_aux=True)(params, hp, batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), info

        def epoch(carry, key):
            order = jax.random.permutation(key, batch_size)
            batches = jax.tree.map(
                lambda x: x[order].reshape((config.num_minibatches, -1) + x.shape[1:]), data)
            return lax.scan(minibatch_step, carry, batches)

        (params, opt_state), info = lax.scan(epoch, (state.params, state.opt_state),
                                             jax.random.split(key_epochs, config.update_epochs))

        # METRICS: one row per update; the episodes that finished (NaN when none did)
        done = traj.terminated | traj.truncated
        var_ret = jnp.var(data.ret)  # explained variance: NaN for constant returns
        metrics = {
            "global_step": (update + 1) * batch_size,
            "episodic_return": jnp.where(done, traj.episode_return, 0.0).sum() / done.sum(),
            "episodic_length": jnp.where(done, traj.episode_length, 0).sum() / done.sum(),
            "learning_rate": lr,
            **{name: x.mean() for name, x in info.items()},  # over epochs and minibatches
            "explained_variance": jnp.where(
                var_ret > 0, 1.0 - jnp.var(data.ret - data.value) / var_ret, jnp.nan),
        }
        return state._replace(params=params, opt_state=opt_state, key=key), metrics

    def train(key, hparams: HParams | None = None):
        """The whole run in one call: `(final TrainState, metrics)`."""
        hp = config.hparams() if hparams is None else hparams
        return lax.scan(lambda state, update: update_step(state, hp, update), init(key, hp),
                        jnp.arange(num_updates))

    return train


def main():
    """Command line: train one run (key 1), print its final return and speed."""
    import tyro  # only the command line needs it
    config, key, start = tyro.cli(Config), jax.random.PRNGKey(1), time.time()
    train, compiled = jax.jit(make_train(config)).lower(key).compile(), time.time()
    _, metrics = jax.block_until_ready(train(key))
    seconds, steps = time.time() - compiled, config.num_updates * config.batch_size
    last = np.asarray(metrics["episodic_return"])[-max(1, config.num_updates // 10):]
    final = np.nanmean(last) if (~np.isnan(last)).any() else float("nan")  # NaN: no episode
    print(f"{config.env_id}: final episodic return {final:.1f} (last 10% of updates), "
          f"{steps / seconds:,.0f} SPS ({steps:,} steps, compiled in {compiled - start:.1f} s)")


if __name__ == "__main__":
    main()
