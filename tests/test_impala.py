"""`algos/impala.py`: the actor lag, bad values, the loss by hand, and `vtrace=False` and
`kl_coef` reaching the loss `learn` steps.
What all three algorithms share (shapes, determinism, sweeps, learning, the CLI) is checked in
`tests/test_algorithms.py`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.impala import Config
from helpers import EXACT, tiny_run

LAG = 2  # the actor lag of helpers.TINY_RUNS["impala"]


def assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def kernel(params):
    return params["params"]["Dense_0"]["kernel"]


def test_actors_use_the_learners_parameters_from_actor_lag_updates_ago():
    tiny = tiny_run("impala")
    assert tiny.config.actor_lag == LAG
    # Updates one at a time against all in one call: programs of different shapes that must
    # give the same bits (with the suite's fast emitters a one-update call rounds differently
    # in the last bit), so both compile with XLA's default emitters (`helpers.EXACT`).
    hp, run_updates = tiny.hp, jax.jit(tiny.train.run_updates, compiler_options=EXACT)
    start = state = tiny.init(tiny.keys[0], hp)
    history = [state.params]  # history[j]: the learner's parameters before update j
    rows = []
    for k in range(5):
        # Before update k the queue holds the parameters of updates k - LAG, ..., k - 1.
        for i in range(LAG):
            expected = history[max(0, k - LAG + i)]
            assert_trees_equal(jax.tree.map(lambda x: x[i], state.past_params), expected)
        state, metrics = run_updates(state, hp, jnp.array([k]))
        history.append(state.params)
        rows.append(metrics)
    assert not np.array_equal(kernel(history[-1]), kernel(history[-1 - LAG]))
    # Update by update, in separate calls, is the same run as all updates in one call.
    _, whole = run_updates(start, hp, jnp.arange(tiny.config.num_updates))
    for name in whole:
        np.testing.assert_array_equal(np.concatenate([r[name] for r in rows]),
                                      whole[name][:5], err_msg=name)

    # The actors act with past_params[0] and nothing else: make that slot the learner's own
    # parameters and the data are exactly on-policy at the learner's first (and only) step.
    # The other slot stays stale, so acting with it would show as a non-zero KL.
    def first_step_metrics(past_params):
        _, metrics = run_updates(state._replace(past_params=past_params), hp, jnp.array([5]))
        return metrics

    lagged = first_step_metrics(state.past_params)
    assert lagged["approx_kl"][0] > 1e-6, lagged["approx_kl"]
    synced = first_step_metrics(jax.tree.map(lambda q, p: q.at[0].set(p), state.past_params,
                                             state.params))
    # 0 and 1 up to float32 rounding of the mean (-1.9e-9 has been read on this CPU), more
    # than two orders of magnitude below the lagged run's KL.
    assert abs(synced["approx_kl"][0]) < 1e-8, synced["approx_kl"]
    np.testing.assert_allclose(synced["mean_clipped_rho"], 1.0, atol=1e-6)


def test_the_lag_queue_has_its_shape_and_the_ratios_are_1_on_policy_and_move_with_the_lag():
    state, metrics = tiny_run("impala").result
    assert kernel(state.past_params).shape == (3, LAG) + kernel(state.params).shape[1:]
    # Update 0: the actors' parameters are the learner's (both initial), so every rho is 1.
    np.testing.assert_allclose(metrics["mean_clipped_rho"][:, 0], 1.0, atol=1e-6)
    np.testing.assert_array_equal(metrics["rho_clip_fraction"][:, 0], 0.0)
    # Later the actors lag behind the learner: ratios move both ways, some above rho_bar.
    assert (metrics["rho_clip_fraction"][:, 1:] > 0).all(), metrics["rho_clip_fraction"]
    assert (metrics["mean_clipped_rho"][:, 1:] < 1.0 - 1e-4).all(), metrics["mean_clipped_rho"]


def test_learn_hands_vtrace_off_to_the_loss_and_steps_with_the_kl_penalty():
    """`make_train` passes `vtrace=False` to the loss its `learn` steps: with one minibatch of
    the whole batch, the value and policy losses `learn` reports, at the parameters it starts
    from, are those of the uncorrected targets (the NumPy V-Trace loop of
    `tests/test_vtrace.py` with log rho = 0), not the corrected ones, on trajectories whose
    behaviour log-probabilities are far from the learner's. And `kl_coef` (traced) reaches
    the step: the parameters after it are one RMSprop step of plain optax on the file's
    loss with the same kl_coef, 0 or 1, and the two steps differ."""
    import optax
    from test_vtrace import vtrace_reference

    from algos.impala import ActorCritic, Transition, impala_loss, make_train
    from common.envs import make_env

    config = Config(env_id="CartPole-v1", total_timesteps=4 * 8 * 2, num_envs=4, num_steps=8,
                    actor_lag=0, anneal_lr=False, vtrace=False)
    train = make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    k = jax.random.split(jax.random.PRNGKey(1), 6)
    shape = (config.num_envs, config.num_steps)  # learn's trajectories [num_envs, T]
    ends = jax.random.uniform(k[4], shape)
    data = Transition(jax.random.normal(k[0], shape + (4,)),
                      jax.random.randint(k[1], shape, 0, 2), jax.random.normal(k[2], shape),
                      ends < 0.1, (ends > 0.1) & (ends < 0.2),
                      jax.random.normal(k[3], shape + (4,)),
                      jnp.log(0.5) + 0.5 * jax.random.normal(k[5], shape))
    learn = jax.jit(train.learn, static_argnums=4)
    key, hp = jax.random.PRNGKey(2), config.hparams()

    # The losses it reports: uncorrected targets, from the network's outputs.
    network = ActorCritic(make_env("CartPole-v1")[2])
    pi, v, _ = network.apply(state.params, data.obs)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    log_prob, v, v_tp1 = f64(pi.log_prob(data.action)), f64(v), f64(network.apply(
        state.params, data.next_obs)[1])
    r, term, trunc = f64(data.reward), np.asarray(data.terminated), np.asarray(data.truncated)

    def losses(log_rho):
        vs, adv = np.stack([np.stack(vtrace_reference(
            log_rho[e], r[e], v[e], v_tp1[e], term[e], trunc[e], config.gamma))
            for e in range(config.num_envs)], axis=1)
        return 0.5 * np.mean((vs - v) ** 2), -np.mean(adv * log_prob)

    uncorrected = losses(np.zeros_like(log_prob))
    corrected = losses(log_prob - f64(data.behaviour_log_prob))
    assert np.abs(np.subtract(uncorrected, corrected)).min() > 0.01  # the switch matters here
    _, _, info = learn(state, hp, data, key, 0)
    np.testing.assert_allclose([info.value_loss[0, 0], info.policy_loss[0, 0]], uncorrected,
                               rtol=1e-5)

    # The KL penalty reaches the step.
    optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                            optax.rmsprop(config.learning_rate, decay=config.rms_decay,
                                          eps=config.opt_eps, eps_in_sqrt=True))

    @jax.jit
    def reference(params, hp):
        def loss(p):
            batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), data)  # time-major
            pi, v_t, _ = network.apply(p, batch.obs)
            return impala_loss(pi.log_prob(batch.action), pi.entropy(), v_t,
                               network.apply(p, batch.next_obs)[1], batch, hp,
                               vtrace_correction=False)[0]

        updates, _ = optimizer.update(jax.grad(loss)(params), optimizer.init(params), params)
        return optax.apply_updates(params, updates)

    steps = {}
    for kl_coef in (0.0, 1.0):
        hp_kl = hp._replace(kl_coef=jnp.float32(kl_coef))
        steps[kl_coef] = learn(state, hp_kl, data, key, 0)[0]
        for g, w in zip(jax.tree.leaves(steps[kl_coef]),
                        jax.tree.leaves(reference(state.params, hp_kl)), strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=str(kl_coef))
    moved = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(steps[0.0]),
                                                   jax.tree.leaves(steps[1.0])))
    assert moved > 1e-4, moved


@pytest.mark.parametrize("field,value,message", [
    ("actor_lag", -1, "--actor-lag must be >= 0"),
    ("num_minibatches", 3, "--num-envs 32 is not divisible by --num-minibatches 3"),
    ("rho_bar", 0.0, "--rho-bar must be > 0"),
    ("optimizer", "sgd", "--optimizer must be one of 'rmsprop', 'adam', got 'sgd'"),
])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value})


TRACE_SETTINGS = {  # the paper's V-Trace, and every threshold and lambda set apart
    "paper": dict(vtrace_lambda=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0),
    "apart": dict(vtrace_lambda=0.9, rho_bar=1.5, c_bar=0.8, pg_rho_bar=1.2),
}


def test_rho_rounded_to_just_above_rho_bar_is_not_counted_as_clipped():
    """An on-policy batch whose log-ratios are float32 rounding (a recurrent core recomputed
    over the sequence): no ratio is clipped; one 1% above rho_bar is."""
    from algos.impala import Transition, impala_loss

    log_prob = jnp.full((3, 2), -0.7, jnp.float32)
    behaviour = (log_prob - 2.5e-7).at[0, 0].set(log_prob[0, 0] - 0.01)  # rho = 1 + 2 ulp
    zeros = jnp.zeros((3, 2), jnp.float32)
    batch = Transition(jnp.zeros((3, 2, 4)), jnp.zeros((3, 2), jnp.int32), zeros,
                       zeros.astype(bool), zeros.astype(bool), jnp.zeros((3, 2, 4)), behaviour)
    _, info = impala_loss(log_prob, zeros, zeros, zeros, batch, Config().hparams())
    assert (np.exp(np.float32(log_prob - behaviour))[:, 1] > 1.0).all()  # rounding, above 1
    np.testing.assert_allclose(info.rho_clip_fraction, 1 / 6)


@pytest.mark.parametrize("trace", TRACE_SETTINGS)
@pytest.mark.parametrize("correction", [True, False])
def test_impala_loss_matches_a_hand_computation_with_clipped_and_unclipped_ratios(correction,
                                                                                  trace):
    """Two trajectories of three steps: rho = 2 (clipped by every threshold), 1.3 (between
    pg_rho_bar and rho_bar in the `apart` setting), 0.8 and 0.5 (clipped by none), a
    termination and a truncation; V-Trace from the NumPy loop of `tests/test_vtrace.py` with
    the same lambda and thresholds, the loss written out, and its gradients: -A/n for log pi
    (A and vs are targets) and vf_coef (V - vs)/n for V."""
    from test_vtrace import vtrace_reference

    from algos.impala import Transition, impala_loss

    gamma, ent_coef, vf_coef, kl_coef = 0.9, 0.01, 0.5, 0.1
    settings = TRACE_SETTINGS[trace]
    lam, rho_bar, c_bar, pg_rho_bar = (settings[k] for k in
                                       ("vtrace_lambda", "rho_bar", "c_bar", "pg_rho_bar"))
    log_prob = np.array([[-0.2, -1.0], [-1.5, -0.3], [-0.7, -0.9]])  # [T, B]
    rho = np.array([[2.0, 0.5], [0.5, 2.0], [1.3, 0.8]])
    behaviour = log_prob - np.log(rho)
    r = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]])
    v = np.array([[0.5, 0.1], [0.2, 0.4], [1.0, -0.2]])
    v_tp1 = np.array([[0.2, 0.4], [1.0, 3.0], [0.7, 0.3]])
    terminated = np.array([[False, False], [False, False], [True, False]])
    truncated = np.array([[False, False], [False, True], [False, False]])
    entropy = np.array([[0.6, 0.5], [0.4, 0.3], [0.2, 0.1]])
    log_rho = np.log(rho) if correction else np.zeros_like(rho)
    vs, adv = np.stack([np.stack(vtrace_reference(
        log_rho[:, b], r[:, b], v[:, b], v_tp1[:, b], terminated[:, b], truncated[:, b], gamma,
        lam, rho_bar, c_bar, pg_rho_bar)) for b in range(2)], axis=-1)
    n = r.size
    k3 = rho - 1 - np.log(rho)
    expected = dict(policy_loss=-np.sum(adv * log_prob) / n,
                    value_loss=0.5 * np.sum((vs - v) ** 2) / n, entropy=entropy.mean(),
                    approx_kl=k3.mean(), explained_variance=1 - np.var(vs - v) / np.var(vs),
                    mean_clipped_rho=np.minimum(rho_bar, rho).mean(),
                    rho_clip_fraction=np.mean(rho > rho_bar))
    loss_expected = expected["policy_loss"] + vf_coef * expected["value_loss"] \
        - ent_coef * expected["entropy"] + kl_coef * expected["approx_kl"]

    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch = Transition(f32(np.zeros((3, 2, 4))), jnp.zeros((3, 2), jnp.int32), f32(r),
                       jnp.asarray(terminated), jnp.asarray(truncated),
                       f32(np.zeros((3, 2, 4))), f32(behaviour))
    hp = Config(gamma=gamma, ent_coef=ent_coef, vf_coef=vf_coef, kl_coef=kl_coef,
                **settings).hparams()
    loss_fn = jax.jit(lambda lp, val, hp: impala_loss(lp, f32(entropy), val, f32(v_tp1), batch,
                                                      hp, vtrace_correction=correction))
    loss, info = loss_fn(f32(log_prob), f32(v), hp)
    np.testing.assert_allclose(loss, loss_expected, rtol=1e-5, atol=1e-6)
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(info, name), value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    no_kl = hp._replace(kl_coef=jnp.float32(0.0))
    d_logp, d_v = jax.grad(lambda lp, val: loss_fn(lp, val, no_kl)[0], argnums=(0, 1))(
        f32(log_prob), f32(v))
    np.testing.assert_allclose(d_logp, -adv / n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d_v, vf_coef * (v - vs) / n, rtol=1e-5, atol=1e-6)
