"""`algos/ppo.py`: the annealed step, `learn` as plain optax SGD with the KL stop, the
loss by hand, and `--no-norm-adv --no-clip-vloss` reaching the loss `learn` steps. What all
three algorithms share (shapes, determinism, sweeps, learning, the CLI) is checked in
`tests/test_algorithms.py`."""

import dataclasses

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from algos.ppo import Config, Transition, make_train

TINY = Config(env_id="CartPole-v1", total_timesteps=2048, num_envs=4, num_steps=32,
              num_minibatches=2, update_epochs=2)


def random_batch(n: int) -> Transition:
    """A batch of `n` CartPole samples with random observations, actions, advantages and
    returns, recorded under a uniform policy (log-prob log 0.5) with values 0."""
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    return Transition(jax.random.normal(k[0], (n, 4)), jax.random.randint(k[1], (n,), 0, 2),
                      jnp.full((n,), jnp.log(0.5)), jnp.zeros((n,)),
                      jax.random.normal(k[2], (n,)), jax.random.normal(k[3], (n,)))


def test_learn_steps_at_the_learning_rate_of_the_update_it_is_given():
    """With one minibatch and a fresh Adam state, the first step is -lr * m/(sqrt(v)+eps) with
    m and v independent of lr: so the step of update u is (1 - u/num_updates) times that of
    update 0, and update num_updates (lr annealed to 0) leaves the parameters unchanged."""
    config = dataclasses.replace(TINY, num_minibatches=1, update_epochs=1)
    train = make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    data = random_batch(config.batch_size)
    learn = jax.jit(train.learn)  # the update number traced, as in `run_updates`: one program
    num_updates = config.num_updates

    def step(update):
        params = learn(state, config.hparams(), data, jax.random.PRNGKey(2), update)[0]
        return jax.flatten_util.ravel_pytree(params)[0] - jax.flatten_util.ravel_pytree(
            state.params)[0]

    first, quarter, last = step(0), step(num_updates // 4), step(num_updates)
    assert np.abs(first).max() > 1e-5
    np.testing.assert_array_equal(last, 0.0)
    frac = 1.0 - (num_updates // 4) / num_updates
    # (float32 parameters near 1 keep a 1e-4 step to about 6e-8)
    np.testing.assert_allclose(quarter, frac * first, rtol=1e-4, atol=1e-7)
    assert np.abs(quarter - first).max() > 100 * 1e-7  # (a wrong rate would fail above)


@pytest.mark.parametrize("clip_vloss", [True, False])
@pytest.mark.parametrize("norm_adv", [False, True])
def test_ppo_loss_matches_a_hand_computation_on_every_clipping_branch(norm_adv, clip_vloss):
    """Six samples, eps = 0.2: ratios 1.5 and 0.5 with positive and negative advantages (the
    surrogate clipped above and below, and unclipped where the min keeps the raw term), ratio
    1.1 inside the clip range, and values moved beyond and within eps of the old values."""
    from algos.ppo import ppo_loss

    eps, ent_coef, vf_coef = 0.2, 0.01, 0.5
    ratio = np.array([1.5, 1.5, 0.5, 0.5, 1.1, 1.0])
    adv = np.array([2.0, -1.0, 1.0, -3.0, 0.5, 0.0])
    old_logp = np.array([-0.7, -1.2, -0.3, -2.0, -0.9, -0.4])
    logp = old_logp + np.log(ratio)
    old_v = np.array([1.0, 0.0, -1.0, 2.0, 0.5, 0.0])
    v = np.array([1.5, 0.1, -1.3, 2.0, 0.45, 1.0])  # moved by 0.5, 0.1, -0.3, 0, -0.05, 1
    ret = np.array([2.0, -0.5, -2.0, 1.0, 0.0, 0.8])
    entropy = np.array([0.6, 0.5, 0.4, 0.69, 0.3, 0.2])

    a = (adv - adv.mean()) / (adv.std() + 1e-8) if norm_adv else adv
    # the surrogate, term by term: max(-A r, -A clip(r, 0.8, 1.2))
    surrogate = [max(-ai * ri, -ai * min(max(ri, 1 - eps), 1 + eps)) for ai, ri in zip(a, ratio)]
    if not norm_adv:  # the branches, spelled out: clipped, raw, raw, clipped, raw, zero
        np.testing.assert_allclose(surrogate, [-2.4, 1.5, -0.5, 2.4, -0.55, 0.0])
    if clip_vloss:
        v_clipped = old_v + np.clip(v - old_v, -eps, eps)
        value_terms = np.maximum((v - ret) ** 2, (v_clipped - ret) ** 2)
    else:
        value_terms = (v - ret) ** 2
    expected = dict(policy_loss=np.mean(surrogate), value_loss=0.5 * value_terms.mean(),
                    entropy=entropy.mean(),
                    approx_kl=np.mean((ratio - 1) - np.log(ratio)),
                    clipfrac=np.mean(np.abs(ratio - 1) > eps))
    loss_expected = expected["policy_loss"] + vf_coef * expected["value_loss"] \
        - ent_coef * expected["entropy"]

    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch = Transition(f32(np.zeros((6, 4))), jnp.zeros(6, jnp.int32), f32(old_logp), f32(old_v),
                       f32(adv), f32(ret))
    hp = Config(clip_coef=eps, ent_coef=ent_coef, vf_coef=vf_coef).hparams()
    loss, info = jax.jit(lambda lp, h, val: ppo_loss(
        lp, h, val, batch, hp, norm_adv=norm_adv, clip_vloss=clip_vloss))(
        f32(logp), f32(entropy), f32(v))
    np.testing.assert_allclose(loss, loss_expected, rtol=1e-5, atol=1e-6)
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(info, name), value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    # Where the clip is active the surrogate's gradient in log pi is 0; elsewhere -A r / n.
    policy_only = hp._replace(ent_coef=jnp.float32(0.0), vf_coef=jnp.float32(0.0))
    grad = jax.grad(lambda lp: ppo_loss(lp, f32(entropy), f32(v), batch, policy_only,
                                        norm_adv=norm_adv, clip_vloss=clip_vloss)[0])(f32(logp))
    active = np.array([s != -ai * ri for s, ai, ri in zip(surrogate, a, ratio)])
    np.testing.assert_allclose(grad, np.where(active, 0.0, -a * ratio / 6), rtol=1e-5,
                               atol=1e-6)


def test_learn_hands_norm_adv_and_clip_vloss_off_to_the_loss_it_steps():
    """`make_train` passes its switches to the loss its `learn` steps (`--no-norm-adv
    --no-clip-vloss`; the defaults are `test_learn_is_plain_minibatch_sgd...`'s): with one
    minibatch of the whole batch, the losses `learn` reports for its step, taken at the
    parameters it starts from, are the surrogate of the raw advantages and the unclipped value
    loss 0.5 mean[(V - G)^2], written here in NumPy from the network's outputs. The batch makes
    both switches matter: advantages of mean 1 and std 2, old values 1 away from V."""
    from algos.ppo import ActorCritic
    from common.envs import make_env

    config = dataclasses.replace(TINY, num_minibatches=1, update_epochs=1, norm_adv=False,
                                 clip_vloss=False)
    train = make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    data = random_batch(config.batch_size)
    data = data._replace(advantage=1.0 + 2.0 * data.advantage, value=data.value + 1.0)
    info = jax.jit(train.learn, static_argnums=4)(state, config.hparams(), data,
                                                  jax.random.PRNGKey(2), 0)[2]

    pi, value, _ = ActorCritic(make_env("CartPole-v1")[2]).apply(state.params, data.obs)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    ratio = np.exp(f64(pi.log_prob(data.action)) - f64(data.log_prob))
    adv, v, v_old, ret = f64(data.advantage), f64(value), f64(data.value), f64(data.ret)
    eps = config.clip_coef
    surrogate = lambda a: np.mean(np.maximum(  # noqa: E731
        -a * ratio, -a * np.clip(ratio, 1 - eps, 1 + eps)))
    raw, normalised = surrogate(adv), surrogate((adv - adv.mean()) / adv.std())
    unclipped = 0.5 * np.mean((v - ret) ** 2)
    clipped = 0.5 * np.mean(np.maximum((v - ret) ** 2,
                                       (v_old + np.clip(v - v_old, -eps, eps) - ret) ** 2))
    assert abs(raw - normalised) > 0.5 and abs(unclipped - clipped) > 0.1  # both matter here
    assert info.policy_loss.shape == (1, 1)  # [epochs, minibatches]
    np.testing.assert_allclose(info.policy_loss[0, 0], raw, rtol=1e-5)
    np.testing.assert_allclose(info.value_loss[0, 0], unclipped, rtol=1e-5)


def test_learn_is_plain_minibatch_sgd_with_optax_and_a_kl_stop_keeps_the_epochs_before_it(
        monkeypatch):
    """`learn`'s packed loop and flattened Adam (speed only) give what plain optax on the
    parameter tree gives: two epochs of two minibatches, replayed here with `lax.scan`. With a
    `target_kl` the first epoch exceeds, the second epoch does not run: the parameters are
    those of the first epoch alone and `ran` says so. The program traced for a TPU (Adam's
    steps on the tree, its state flat between updates) gives the same, and the same optimiser
    state in the same structure."""
    import optax

    from algos.ppo import ActorCritic, ppo_loss
    from common.envs import make_env
    from common.minibatch import flat_state, shuffled_minibatches

    config = dataclasses.replace(TINY, num_minibatches=2, update_epochs=2, anneal_lr=False)
    state = jax.jit(make_train(config).init)(jax.random.PRNGKey(0))
    data = random_batch(config.batch_size)
    key = jax.random.PRNGKey(2)

    def learn(target_kl, backend="cpu"):
        with monkeypatch.context() as patch:
            patch.setattr(jax, "default_backend", lambda: backend)  # as traced there
            train = make_train(dataclasses.replace(config, target_kl=target_kl))
            return jax.jit(train.learn, static_argnums=4)(state, config.hparams(), data, key,
                                                          0)

    network = ActorCritic(make_env("CartPole-v1")[2])
    optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                            optax.adam(config.learning_rate, eps=config.opt_eps))

    def reference(params, epochs: int):
        def step(carry, batch):
            p, s = carry

            def loss(p):
                pi, value, _ = network.apply(p, batch.obs)
                return ppo_loss(pi.log_prob(batch.action), pi.entropy(), value, batch,
                                config.hparams())[0]

            updates, s = optimizer.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, updates), s), None

        s = optimizer.init(params)
        for epoch_key in jax.random.split(key, config.update_epochs)[:epochs]:
            batches = shuffled_minibatches(epoch_key, data, config.num_minibatches).stacked()
            (params, s), _ = jax.lax.scan(step, (params, s), batches)
        return params, flat_state(params, s, state.opt_state)  # Adam's state in learn's form

    replay, wants = jax.jit(reference, static_argnums=1), {}
    for target_kl, epochs, backend in ((None, 2, "cpu"), (1e-9, 1, "cpu"), (None, 2, "tpu"),
                                       (1e-9, 1, "tpu")):
        params, opt_state, info, ran = learn(target_kl, backend)
        np.testing.assert_array_equal(ran, [1.0] * epochs + [0.0] * (2 - epochs))
        assert jax.tree.structure(opt_state) == jax.tree.structure(state.opt_state)
        wants[epochs], want_state = replay(state.params, epochs)
        for g, w in zip(jax.tree.leaves(params), jax.tree.leaves(wants[epochs])):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=str(target_kl))
        for g, w in zip(jax.tree.leaves(opt_state), jax.tree.leaves(want_state)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-9, err_msg=str(target_kl))
        assert not np.allclose(jax.tree.leaves(params)[0], jax.tree.leaves(state.params)[0])
    assert float(info.approx_kl[0, -1]) > 1e-9  # the first epoch's last minibatch stopped it
    assert not np.allclose(jax.tree.leaves(wants[1])[0], jax.tree.leaves(wants[2])[0])
