"""`algos/a2c.py`: bad values, the loss against a hand computation of the n-step
advantage, `norm_adv` reaching the loss `learn` steps, and one whole update (`update_step`,
with the recurrent bootstrap `next_values`) against a reference. What all three algorithms
share (shapes, determinism, sweeps, learning, the CLI) is checked in
`tests/test_algorithms.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algos.a2c import Config, a2c_loss, main
from common.rollout import rollout
from helpers import tiny_run


def n_step_returns(r, v_tp1, terminated, truncated, gamma):
    """R_t = r_t + gamma R_{t+1} for one environment, written as a plain loop: the tail is
    V(final observation) after a truncation or at the rollout's end, 0 after a termination."""
    T = len(r)
    R = [0.0] * T
    for t in reversed(range(T)):
        if terminated[t]:
            tail = 0.0
        elif truncated[t] or t == T - 1:
            tail = v_tp1[t]
        else:
            tail = R[t + 1]
        R[t] = r[t] + gamma * tail
    return R


# T = 3 steps, 2 environments (columns). Env 0 terminates at t=1 (V(s'_1) = 9 must be ignored)
# and is cut by the rollout's end at t=2; env 1 is truncated by a time limit at t=0 (bootstrap
# from V(final obs) = 5). Inside an episode V(s'_t) = V(s_{t+1}).
GAMMA = 0.9
ROLLOUT = dict(
    r_t=[[1.0, 0.5], [2.0, -1.0], [3.0, 1.0]],
    v_t=[[0.5, 1.0], [0.2, 0.3], [-0.1, 0.7]],
    v_tp1=[[0.2, 5.0], [9.0, 0.7], [0.4, 2.0]],
    terminated_t=[[False, False], [True, False], [False, False]],
    truncated_t=[[False, True], [False, False], [False, False]],
)
LOG_PROB = [[-0.1, -0.7], [-1.2, -0.3], [-0.5, -2.0]]
ENTROPY = [[0.6, 0.5], [0.4, 0.69], [0.3, 0.2]]


@pytest.mark.parametrize("norm_adv,jit,lam", [(False, False, 1.0), (True, False, 1.0),
                                               (False, True, 1.0), (True, True, 1.0),
                                               (False, True, 0.9), (True, True, 0.9)])
def test_loss_matches_hand_computed_n_step_and_gae_advantages(norm_adv, jit, lam):
    """lambda = 1: A2C's n-step returns written out by hand; lambda < 1: GAE's, from the NumPy
    loop of `tests/test_gae.py`. `update_step` computes the targets with `common.gae.gae`
    from the rollout's values; the loss then takes one step on them."""
    from test_gae import gae_reference

    from algos.a2c import Transition
    from common.gae import gae

    ent_coef, vf_coef = 0.01, 0.5
    col = lambda name, j: [row[j] for row in ROLLOUT[name]]  # noqa: E731
    R = np.array([n_step_returns(col("r_t", j), col("v_tp1", j), col("terminated_t", j),
                                 col("truncated_t", j), GAMMA) for j in range(2)]).T
    np.testing.assert_allclose(R, [[2.8, 5.0], [2.0, 1.52], [3.36, 2.8]], rtol=1e-12)
    if lam < 1.0:
        lambda_returns = np.array([gae_reference(
            col("r_t", j), col("v_t", j), col("v_tp1", j), col("terminated_t", j),
            col("truncated_t", j), GAMMA, lam)[1] for j in range(2)]).T
        assert np.abs(lambda_returns - R).max() > 0.1  # lambda matters on this rollout
        R = lambda_returns
    V, logp, H = (np.array(x) for x in (ROLLOUT["v_t"], LOG_PROB, ENTROPY))
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    advantage, ret = gae(*(jnp.asarray(ROLLOUT[k]) for k in ROLLOUT), GAMMA, lam)
    np.testing.assert_allclose(ret, R, rtol=1e-5)
    A = R - V
    np.testing.assert_allclose(advantage, A, rtol=1e-5, atol=1e-6)
    A_used = (A - A.mean()) / (A.std() + 1e-8) if norm_adv else A
    n = A.size
    expected_policy_loss = -np.sum(A_used * logp) / n
    expected_value_loss = 0.5 * np.sum((R - V) ** 2) / n
    expected_entropy = H.sum() / n
    expected_loss = (expected_policy_loss + vf_coef * expected_value_loss
                     - ent_coef * expected_entropy)

    batch = Transition(jnp.zeros((3, 2, 4)), jnp.zeros((3, 2), jnp.int32), f32(V), advantage,
                       ret)
    hp = Config(ent_coef=ent_coef, vf_coef=vf_coef).hparams()

    def loss(log_prob, v_t):
        return a2c_loss(log_prob, f32(ENTROPY), v_t, batch, hp, norm_adv=norm_adv)

    fn = jax.jit(loss) if jit else loss
    args = (f32(LOG_PROB), f32(V))
    total, info = fn(*args)
    np.testing.assert_allclose(total, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(info.policy_loss, expected_policy_loss, rtol=1e-5)
    np.testing.assert_allclose(info.value_loss, expected_value_loss, rtol=1e-5)
    np.testing.assert_allclose(info.entropy, expected_entropy, rtol=1e-5)

    # The advantage is a target: the policy gradient is -A/n per sample, and V gets gradient
    # only from the squared error, vf_coef * (V - R) / n.
    d_logp, d_v = jax.grad(lambda *a: fn(*a)[0], argnums=(0, 1))(*args)
    np.testing.assert_allclose(d_logp, -A_used / n, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(d_v, vf_coef * (V - R) / n, rtol=1e-5, atol=1e-7)


def test_learn_hands_norm_adv_to_the_loss_it_steps():
    """`make_train` passes `norm_adv` to the loss its `learn` steps: with it on, the policy
    loss `learn` reports for its one step, at the parameters it starts from, is
    -mean[A' log pi(a|s)] with A' the advantages normalised over the whole batch. Here the
    advantages are 1 + 2 z, z the log-probabilities (under a policy far from uniform)
    standardised, so A' = z and the loss is -std(log pi), from the network's outputs in NumPy;
    the raw advantages would give -mean(log pi) - 2 std(log pi)."""
    from algos.a2c import ActorCritic, Transition, make_train
    from common.envs import make_env

    config = Config(env_id="CartPole-v1", total_timesteps=64, num_envs=4, num_steps=8,
                    norm_adv=True)
    train = make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    state = state._replace(params=jax.tree_util.tree_map_with_path(  # the policy head scaled
        lambda path, x: 100.0 * x if "Dense_5" in jax.tree_util.keystr(path) else x,
        state.params))
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    n = config.batch_size
    obs, action = jax.random.normal(k[0], (n, 4)), jax.random.randint(k[1], (n,), 0, 2)
    pi, _, _ = ActorCritic(make_env("CartPole-v1")[2]).apply(state.params, obs)
    log_prob = np.asarray(pi.log_prob(action), np.float64)
    assert log_prob.std() > 0.3, log_prob.std()
    z = (log_prob - log_prob.mean()) / log_prob.std()
    data = Transition(obs, action, jnp.zeros(n), jnp.asarray(1.0 + 2.0 * z, jnp.float32),
                      jax.random.normal(k[2], (n,)))
    info = jax.jit(train.learn, static_argnums=3)(state, config.hparams(), data, 0)[2]
    np.testing.assert_allclose(info.policy_loss, -log_prob.std(), rtol=1e-5)


# --------------------------------------------------------------------------------------------
# One update of make_train against a reference
# --------------------------------------------------------------------------------------------
def stepped_next_values(network, params, hidden, traj):
    """V(s'_t) [T, N] of every step's next observation, the network stepped one observation
    at a time from the state `hidden` stored at the rollout's start: the recurrent state
    carried from step to step (reset where `first`), and from the state after s_t one step
    further on s'_t, without a reset (the episode goes on past s_t)."""
    step = jax.jit(lambda h, obs, first: network.apply(params, obs[None], h, first[None]))
    values = []
    for t in range(traj.obs.shape[0]):
        hidden = step(hidden, traj.obs[t], traj.first[t])[2][0]
        values.append(step(hidden, traj.next_obs[t], jnp.zeros_like(traj.first[t]))[1][0])
    return np.stack(values).astype(np.float64)


def replayed_rollout(run):
    """`replay(state) -> (key, env_state, trajectory)`: the rollout `update_step` collects
    from `state` (the file's policy, the same key) and the key it carries on."""
    env, env_params, spec = run.train.env

    @jax.jit
    def replay(state):
        key, key_rollout = jax.random.split(state.key)
        return (key,) + rollout(env, env_params, spec, run.train.policy(state.params,
                                                                        state.obs_stats),
                                state.env, key_rollout, run.config.num_steps,
                                run.config.fresh_starts)

    return replay


@pytest.mark.parametrize("network", ["auto", "gru", "lstm"])
def test_update_step_is_one_rmsprop_step_on_the_n_step_loss_of_its_rollout(network):
    """One update of `run_updates` (A2C's `update_step`), the first after 3 whose rollout
    holds an episode's end and a new start, against a reference written here: the rollout
    replayed with the file's policy and the update's key; n-step returns (`gae_lambda = 1`)
    from the NumPy loop above, bootstrapped from V(s'_t), for a recurrent core by stepping
    the network from the stored start state (`stepped_next_values`, which `next_values`
    must equal); the gradient of -mean[A log pi(a|s)] + vf_coef 0.5 mean[(G - V)^2]
    - ent_coef mean[H] written with `log_softmax`; then PyTorch's RMSprop step in NumPy,
    from the optimiser's average of squared gradients (some updates old, so the step's size
    follows the gradient's, not only its sign) after clipping by global norm. The reported
    losses match too. The entropy bonus is on (ent_coef 0.01, traced: the same program)."""
    run = tiny_run("a2c", network)
    config, hp = run.config, run.hp._replace(ent_coef=jnp.float32(0.01))
    recurrent = config.recurrent
    state, replay = run.init(run.keys[0], hp), replayed_rollout(run)
    for update in range(config.num_updates - 1):
        key, env_state, traj = replay(state)
        if update >= 3 and np.asarray(traj.terminated | traj.truncated)[:-1].any():
            break
        state = run.run_updates(state, hp, jnp.array([update]))[0]
    assert np.asarray(traj.terminated | traj.truncated)[:-1].any()  # an episode ends inside
    new, metrics = run.run_updates(state, hp, jnp.array([update]))
    np.testing.assert_array_equal(new.key, key)
    for got, want in zip(jax.tree.leaves(new.env), jax.tree.leaves(env_state), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # the update's rollout

    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    net = run.module.ActorCritic(run.train.env[2], config.hidden_size, config.activation, False,
                                 config.core)
    if recurrent:
        v_tp1 = stepped_next_values(net, state.params, state.env.hidden, traj)
        np.testing.assert_allclose(jax.jit(run.train.next_values)(
            state.params, traj.next_obs, traj.policy_info.memory), v_tp1, rtol=1e-5, atol=1e-6)
        reset = jax.jit(net.apply)(state.params, traj.next_obs, state.env.hidden,
                                        jnp.ones_like(traj.first))[1]  # from a fresh state
        assert np.abs(reset - v_tp1).max() > 1e-3  # another value: the state matters
    else:
        v_tp1 = f64(jax.jit(net.apply)(state.params, traj.next_obs)[1])
    r, term, trunc = f64(traj.reward), np.asarray(traj.terminated), np.asarray(traj.truncated)
    G = np.stack([n_step_returns(r[:, n], v_tp1[:, n], term[:, n], trunc[:, n], config.gamma)
                  for n in range(config.num_envs)], axis=1)
    A = G - f64(traj.policy_info.value)

    def loss(params):
        pi, value, _ = net.apply(params, traj.obs, state.env.hidden, traj.first) \
            if recurrent else net.apply(params, traj.obs)
        log_pi = jax.nn.log_softmax(pi.logits)
        log_pi_a = jnp.take_along_axis(log_pi, traj.action[..., None], axis=-1)[..., 0]
        entropy = -(jnp.exp(log_pi) * log_pi).sum(-1).mean()
        value_loss = 0.5 * jnp.mean((jnp.float32(G) - value) ** 2)
        policy_loss = -jnp.mean(jnp.float32(A) * log_pi_a)
        total = policy_loss + config.vf_coef * value_loss - 0.01 * entropy
        return total, (value_loss, policy_loss, entropy)

    grads, losses = jax.jit(jax.grad(loss, has_aux=True))(state.params)
    for name, want in zip(("value_loss", "policy_loss", "entropy"), losses):
        np.testing.assert_allclose(metrics[name][0], want, rtol=1e-5, err_msg=name)

    g = [f64(x) for x in jax.tree.leaves(grads)]
    norm = np.sqrt(sum((x ** 2).sum() for x in g))
    g = [x * min(1.0, config.max_grad_norm / norm) for x in g]
    rms = state.opt_state[1][0]
    assert isinstance(rms, optax.ScaleByRmsState)
    nu = [config.rms_decay * f64(n) + (1 - config.rms_decay) * x ** 2
          for n, x in zip(jax.tree.leaves(rms.nu), g, strict=True)]
    want = [f64(p) - config.learning_rate * x / (np.sqrt(n) + config.opt_eps)
            for p, x, n in zip(jax.tree.leaves(state.params), g, nu, strict=True)]
    for got, w, p in zip(jax.tree.leaves(new.params), want, jax.tree.leaves(state.params)):
        assert np.abs(f64(got) - f64(p)).max() > 1e-4  # a step, which the reference
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)  # matches to rounding
    for got, w in zip(jax.tree.leaves(new.opt_state[1][0].nu), nu, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Config and command line
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,flag", [
    (dict(num_envs=0), "--num-envs"), (dict(optimizer="sgd"), "--optimizer"),
    (dict(rms_decay=1.0), "--rms-decay"), (dict(opt_eps=0.0), "--opt-eps"),
    (dict(gae_lambda=1.5), "--gae-lambda"), (dict(total_timesteps=10), "--total-timesteps"),
    (dict(env_id="CartPol-v1"), "CartPole-v1"),
])
def test_config_rejects_bad_values_naming_the_flag(overrides, flag):
    with pytest.raises(ValueError, match=flag):
        Config(**overrides)


def test_cli_unknown_optimizer_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--optimizer", "sgd"])
    assert exit_info.value.code == 2
    assert "error: --optimizer: expected one of rmsprop, adam, got 'sgd'" in \
        capsys.readouterr().err


def test_squash_mean_keeps_the_gaussian_s_mean_inside_the_action_bounds():
    """`squash_mean`: the mean is mid + half-width x tanh(x) of the unsquashed network's
    output x (Pendulum's bounds, [-2, 2]), so it stays inside them however far x goes; the
    log std is the same parameter."""
    from algos.a2c import ActorCritic
    from common.envs import make_env

    _, _, spec = make_env("Pendulum-v1")
    obs = jax.random.normal(jax.random.PRNGKey(1), (64,) + spec.obs_shape)
    plain, squashed = ActorCritic(spec), ActorCritic(spec, squash_mean=True)
    params = plain.init(jax.random.PRNGKey(0), obs)
    params = jax.tree.map(lambda p: 300.0 * p, params)  # outputs far past the bounds
    x = plain.apply(params, obs)[0].mean()
    pi = squashed.apply(params, obs)[0]
    assert np.abs(x).max() > 2.0, "the check needs means past the bounds"
    np.testing.assert_allclose(pi.mean(), 2.0 * np.tanh(np.asarray(x)), rtol=1e-6, atol=1e-6)
    assert np.abs(pi.mean()).max() <= 2.0
    np.testing.assert_array_equal(pi.stddev(), plain.apply(params, obs)[0].stddev())
