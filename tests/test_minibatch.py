"""`common.minibatch`: the shuffle (a uniform permutation, minibatches that cover the batch
once), and the flat optimiser and SGD loop against the same optimiser on the parameter tree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import all_eqns


def test_permutation_is_a_uniform_permutation():
    from common.minibatch import permutation

    jitted = jax.jit(permutation, static_argnums=1)
    for n in (1, 2, 5, 512, 1000, 70_000):  # 512 and 70,000 take two and four sort rounds
        np.testing.assert_array_equal(np.sort(np.asarray(jitted(jax.random.PRNGKey(n), n))),
                                      np.arange(n))
    # all 24 orders of 4 items equally likely: chi-square over 48,000 draws (fixed keys), 23
    # degrees of freedom, 0.1% critical value 49.7
    keys = jax.random.split(jax.random.PRNGKey(0), 48_000)
    perms = np.asarray(jax.jit(jax.vmap(lambda k: permutation(k, 4)))(keys))
    codes = perms @ np.array([64, 16, 4, 1])
    counts = np.unique(codes, return_counts=True)[1]
    assert len(counts) == 24
    chi2 = np.sum((counts - 2000.0) ** 2 / 2000.0)
    assert chi2 < 49.7, chi2
    # in a 512-sample batch every item lands in every position alike: the mean position of
    # item i over 4,000 draws is (n - 1) / 2 within 5 standard errors (sd 147.8 / sqrt(4000))
    perms = np.asarray(jax.jit(jax.vmap(lambda k: permutation(k, 512)))(keys[:4000]))
    where = np.argsort(perms, axis=1)  # where[d, i]: the position of item i in draw d
    assert np.all(np.abs(where.mean(0) - 255.5) < 5 * 147.8 / np.sqrt(4000))


def test_shuffled_minibatches_cover_the_batch_once():
    from common.minibatch import shuffled_minibatches

    batch = {"i": jnp.arange(12), "x": jnp.arange(24.0).reshape(12, 2)}
    mb = shuffled_minibatches(jax.random.PRNGKey(0), batch, 3).stacked()
    assert mb["i"].shape == (3, 4) and mb["x"].shape == (3, 4, 2)
    np.testing.assert_array_equal(np.sort(np.asarray(mb["i"]).ravel()), np.arange(12))
    np.testing.assert_array_equal(mb["x"][..., 0], 2.0 * mb["i"])  # rows stay together
    with pytest.raises(ValueError, match="does not divide into 5 minibatches"):
        shuffled_minibatches(jax.random.PRNGKey(0), batch, 5)


def test_shuffled_minibatches_move_every_leaf_whatever_its_dtype_by_the_one_permutation():
    """The leaves travel packed, one gather per dtype: each must come back exactly as its own
    gather by the permutation would give it, dtype and shape included."""
    from common.minibatch import permutation, shuffled_minibatches

    key = jax.random.PRNGKey(3)
    batch = (None, {"obs": jnp.arange(8 * 2 * 3, dtype=jnp.float32).reshape(8, 2, 3) / 7,
                    "action": 7 * jnp.arange(8, dtype=jnp.int32) - 20,
                    "first": jnp.arange(8) % 3 == 0,
                    "bits": jnp.arange(8, dtype=jnp.uint8)[:, None] * jnp.ones(4, jnp.uint8)})
    got = shuffled_minibatches(key, batch, 2).stacked()
    order = np.asarray(permutation(key, 8))
    want = jax.tree.map(lambda x: np.asarray(x)[order].reshape((2, 4) + x.shape[1:]), batch)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_flat_optimizer_and_sgd_scan_equal_the_optimiser_on_the_tree_also_beside_masked():
    """`flat_optimizer` (PPO's clipping and Adam on one flat vector) gives the parameters of
    the same optimiser on the tree, over several SGD steps, also under `vmap`; a
    transformation that looks at the tree (`optax.masked` weight decay on the matrices only)
    goes beside it, outside. `sgd_scan` (PPO's minibatch loop: the vector form with a flat
    optimiser, plain trees otherwise) gives the same parameters and optimiser state."""
    import optax

    from common.minibatch import flat_optimizer, sgd_scan

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    params = {"a": {"kernel": jax.random.normal(k[0], (4, 3)),
                    "bias": jax.random.normal(k[1], (3,))},
              "b": {"kernel": jax.random.normal(k[2], (3, 2)),
                    "bias": jax.random.normal(k[3], (2,))},
              "log_std": jnp.full((2,), 0.3)}
    batches = (jax.random.normal(k[4], (5, 8, 4)), jax.random.normal(k[5], (5, 8, 2)))

    def loss(p, batch):
        x, y = batch
        h = jnp.tanh(x @ p["a"]["kernel"] + p["a"]["bias"])
        return jnp.mean(jnp.square(h @ p["b"]["kernel"] + p["b"]["bias"] - y)) + \
            jnp.sum(p["log_std"] ** 2)

    def sgd(optimizer, params):
        def step(carry, batch):
            p, s = carry
            updates, s = optimizer.update(jax.grad(loss)(p, batch), s, p)
            return (optax.apply_updates(p, updates), s), None

        return jax.lax.scan(step, (params, optimizer.init(params)), batches)[0]

    inner = lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))  # noqa: E731
    matrices = lambda p: jax.tree.map(lambda x: x.ndim == 2, p)  # noqa: E731
    decay = lambda: optax.masked(optax.add_decayed_weights(0.1), matrices)  # noqa: E731
    cases = {"alone": (inner(), flat_optimizer(inner())),
             "beside masked": (optax.chain(decay(), inner()),
                               optax.chain(decay(), flat_optimizer(inner())))}
    for name, (on_tree, flat) in cases.items():
        want, got = jax.jit(lambda p: sgd(on_tree, p)[0])(params), \
            jax.jit(lambda p: sgd(flat, p)[0])(params)
        assert jax.tree.structure(got) == jax.tree.structure(want), name
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)
        changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), got, params)
        assert all(jax.tree.leaves(changed)), name  # every leaf was trained
        # a flat optimiser steps the vector form (CPU) or the tree (elsewhere), its state
        # flat either way
        for optimizer, vector_steps in ((on_tree, None), (flat, True), (flat, False)):
            scanned, state, losses = jax.jit(lambda p: sgd_scan(
                lambda p, b: (loss(p, b), loss(p, b)), optimizer, p, optimizer.init(p),
                batches, vector_steps=vector_steps))(params)
            assert losses.shape == (5,), name
            for g, w in zip(jax.tree.leaves(scanned), jax.tree.leaves(want)):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)
            expected_state = jax.jit(lambda p: sgd(optimizer, p)[1])(params)
            assert jax.tree.structure(state) == jax.tree.structure(expected_state), name
            for g, w in zip(jax.tree.leaves(state), jax.tree.leaves(expected_state)):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)
    # under vmap over two parameter sets (seeds): each as alone
    stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), params)
    batched = jax.jit(jax.vmap(lambda p: sgd(flat_optimizer(inner()), p)[0]))(stacked)
    for i in range(2):
        alone = sgd(inner(), jax.tree.map(lambda x: x[i], stacked))[0]
        for g, w in zip(jax.tree.leaves(batched), jax.tree.leaves(alone)):
            np.testing.assert_allclose(g[i], w, rtol=1e-5, atol=1e-6)
    # the masked decay acts: with it the matrices end elsewhere
    no_decay = jax.jit(lambda p: sgd(flat_optimizer(inner()), p)[0])(params)
    with_decay = jax.jit(lambda p: sgd(optax.chain(decay(), flat_optimizer(inner())), p)[0])(
        params)
    assert not np.allclose(no_decay["a"]["kernel"], with_decay["a"]["kernel"])


def test_sgd_scan_gathers_each_minibatch_in_its_step_as_the_stacked_minibatches_give():
    """`sgd_scan` over a `Minibatches` (each minibatch gathered in its step, the loop unrolled
    1 or 2 steps at a time, with a flat optimiser stepped as a vector or on the tree) gives
    the parameters, state and per-step outputs of plain optax over its `stacked()` form, a
    reference loop written here; `take` of any indices gives those samples of every leaf."""
    import optax

    from common.minibatch import flat_optimizer, sgd_scan, shuffled_minibatches

    k = jax.random.split(jax.random.PRNGKey(4), 5)
    params = {"w": jax.random.normal(k[0], (3, 2)), "b": jnp.zeros((2,))}
    batch = (None, {"x": jax.random.normal(k[1], (12, 3)), "y": jax.random.normal(k[2], (12, 2)),
                    "weight": jnp.arange(12, dtype=jnp.int32) % 3,
                    "sequence": jax.random.normal(k[4], (12, 5, 2))})  # as (hidden, data)
    minibatches = shuffled_minibatches(k[3], batch, 4)
    assert minibatches.indices().shape == (4, 3)
    index = jnp.array([[5, 0], [11, 11]])
    for g, w in zip(jax.tree.leaves(minibatches.take(index)), jax.tree.leaves(batch)):
        np.testing.assert_array_equal(g, np.asarray(w)[np.asarray(index)])

    def loss(p, minibatch):
        _, b = minibatch
        err = (b["x"] @ p["w"] + p["b"] - b["y"] - b["sequence"].sum(1)) * \
            (1 + b["weight"][:, None])
        return jnp.mean(jnp.square(err)), b["weight"].sum()

    def reference(optimizer, p):
        def step(carry, b):
            p, s = carry
            (_, aux), grads = jax.value_and_grad(loss, has_aux=True)(p, b)
            updates, s = optimizer.update(grads, s, p)
            return (optax.apply_updates(p, updates), s), aux

        return jax.lax.scan(step, (p, optimizer.init(p)), minibatches.stacked())

    inner = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-1))
    (want, want_state), want_aux = jax.jit(lambda p: reference(inner, p))(params)
    assert not np.allclose(want["w"], params["w"])
    for optimizer, vector_steps in ((inner, None), (flat_optimizer(inner), True),
                                    (flat_optimizer(inner), False)):
        want_state = jax.jit(lambda p: reference(optimizer, p)[0][1])(params)
        for unroll in (1, 2):
            got, state, aux = jax.jit(lambda p: sgd_scan(
                loss, optimizer, p, optimizer.init(p), minibatches, vector_steps=vector_steps,
                unroll=unroll))(params)
            np.testing.assert_array_equal(aux, want_aux)
            for g, w in zip(jax.tree.leaves((got, state)), jax.tree.leaves((want, want_state))):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7,
                                           err_msg=f"{vector_steps} {unroll}")
    with pytest.raises(ValueError, match="unroll must be a whole number"):
        sgd_scan(loss, inner, params, inner.init(params), minibatches, unroll=0)


def test_tree_state_and_flat_state_move_adam_s_moments_between_vector_and_tree():
    """`tree_state` cuts a flat optimiser's moments (one vector each, `vector_form`'s order:
    the bias-like leaves, then the matrices) into trees shaped like the parameters, leaving
    the step count; `flat_state` joins them back into the same structure, bit for bit."""
    import optax

    from common.minibatch import flat_optimizer, flat_state, tree_state, vector_form

    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.arange(3.0) + 10,
              "v": {"k": jnp.arange(4.0).reshape(4, 1) + 20, "s": jnp.float32(30)}}
    inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    flat = flat_optimizer(inner)
    state = flat.init(params)
    vector = vector_form(params).ravel(vector_form(params).to_carry(params))
    # moments holding the parameters' own values (vector: b, s, then k, w)
    np.testing.assert_array_equal(vector, [10, 11, 12, 30, 20, 21, 22, 23, 0, 1, 2, 3, 4, 5])
    adam = state[1][0]
    state = (state[0], (adam._replace(count=jnp.int32(7), mu=vector, nu=2 * vector),) +
             state[1][1:])
    tree = tree_state(inner, params, state)
    assert jax.tree.structure(tree) == jax.tree.structure(inner.init(params))
    assert int(tree[1][0].count) == 7
    for got, want in ((tree[1][0].mu, params),
                      (tree[1][0].nu, jax.tree.map(lambda x: 2 * x, params))):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert g.shape == jnp.shape(w)
            np.testing.assert_array_equal(g, w)
    back = flat_state(params, tree, state)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for g, w in zip(jax.tree.leaves(back), jax.tree.leaves(state)):
        np.testing.assert_array_equal(g, w)


def test_wide_key_permutation_is_a_uniform_permutation_in_one_sort():
    """Beyond 1,625 indices, where `jax.random.permutation` sorts twice, `wide_key_permutation`
    sorts once by two 32-bit keys: a permutation, every item in every position alike (the
    mean position of item i over 2,000 draws of 2,048 is 1023.5 within 5 standard errors, sd
    591.2 / sqrt(2000); items 0 and 1 each first in half the draws of which comes first, 0.1%
    two-sided binomial bound). Up to 1,625 it is jax's permutation, bit for bit, and int32 also
    with `jax_enable_x64` (where jax's is int64: `permutation`'s two branches must agree)."""
    from common.minibatch import permutation, wide_key_permutation

    keys = jax.random.split(jax.random.PRNGKey(7), 2000)
    perms = np.asarray(jax.jit(jax.vmap(lambda k: wide_key_permutation(k, 2048)))(keys))
    np.testing.assert_array_equal(np.sort(perms, axis=1), np.tile(np.arange(2048), (2000, 1)))
    where = np.argsort(perms, axis=1)
    assert np.all(np.abs(where.mean(0) - 1023.5) < 5 * 591.2 / np.sqrt(2000))
    assert abs(np.mean(where[:, 0] < where[:, 1]) - 0.5) < 3.29 * 0.5 / np.sqrt(2000)
    for n in (5, 1625):
        np.testing.assert_array_equal(wide_key_permutation(keys[0], n),
                                      jax.random.permutation(keys[0], n))
    assert not np.array_equal(wide_key_permutation(keys[0], 1626),
                              jax.random.permutation(keys[0], 1626))
    with jax.enable_x64(True):  # jax's permutation is int64 there; the shuffle's stays int32
        assert jax.jit(lambda k: permutation(k, 512))(keys[0]).dtype == jnp.int32
        assert wide_key_permutation(keys[0], 512).dtype == jnp.int32


def test_permutation_sorts_packed_keys_on_cpu_and_wide_keys_elsewhere():
    """On CPU `permutation` is `packed_sort_permutation`, bit for bit (two one-array sorts for
    512 indices); lowered for a TPU it is `wide_key_permutation`: `jax.random.permutation`'s
    one sort of (key, index) pairs for 512 indices, one sort by two keys for Brax Ant's 20,480
    where jax's sorts twice. The TPU program is lowered here, and run where there is one."""
    from jax import export

    from common.minibatch import packed_sort_permutation, permutation, wide_key_permutation

    keys = jax.random.split(jax.random.PRNGKey(3), 5)
    shuffle = jax.jit(jax.vmap(lambda k: permutation(k, 512)))
    with jax.default_device(jax.devices("cpu")[0]):  # a CPU program on any machine
        np.testing.assert_array_equal(shuffle(keys),
                                      jax.vmap(lambda k: packed_sort_permutation(k, 512))(keys))
    if jax.default_backend() != "cpu":  # run on the accelerator too: jax's permutation there
        np.testing.assert_array_equal(shuffle(keys),
                                      jax.vmap(lambda k: wide_key_permutation(k, 512))(keys))

    def sorts(fn, platform):
        module = export.export(jax.jit(fn), platforms=[platform])(keys[0]).mlir_module()
        return module.count("stablehlo.sort")

    assert sorts(lambda k: permutation(k, 512), "cpu") == 2
    assert sorts(lambda k: permutation(k, 512), "tpu") == 1
    assert sorts(lambda k: jax.random.permutation(k, 512), "tpu") == 1
    assert sorts(lambda k: permutation(k, 20480), "tpu") == 1
    assert sorts(lambda k: jax.random.permutation(k, 20480), "tpu") == 2
    if jax.default_backend() != "cpu":
        np.testing.assert_array_equal(jax.jit(lambda k: permutation(k, 20480))(keys[0]),
                                      wide_key_permutation(keys[0], 20480))


def _scans(jaxpr):
    """Every `scan` in `jaxpr`, nested programs included, outermost first."""
    return [eqn for eqn in all_eqns(jaxpr) if eqn.primitive.name == "scan"]


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_an_update_s_epochs_carry_the_optimiser_s_state_as_a_tree_off_a_cpu_vector_on_it(
        algo, monkeypatch):
    """`learn` takes the flat optimiser's state into its `stepping_form` once an update, around
    the epochs: traced for a TPU, the epochs' loop carries Adam's moments as trees shaped like
    the parameters and no vector of all the parameters; traced for a CPU it carries the
    moments as such vectors (the vector steps). (IMPALA's RMSProp has one moment.) Both
    programs, run here, end two updates with the same parameters and optimiser state."""
    import importlib

    module = importlib.import_module(f"algos.{algo}")
    config = module.Config(env_id="CartPole-v1", num_envs=4, num_steps=8, num_minibatches=2,
                           update_epochs=3, total_timesteps=64)
    ends = {}
    for backend in ("tpu", "cpu"):
        with monkeypatch.context() as patch:
            patch.setattr(jax, "default_backend", lambda: backend)  # as traced there
            train = module.make_train(config)
            state = jax.eval_shape(train.init, jax.random.PRNGKey(0))
            traced = jax.jit(train).trace(jax.random.PRNGKey(0))  # checked, then compiled
            jaxpr = traced.jaxpr.jaxpr
            ends[backend] = traced.lower().compile()(jax.random.PRNGKey(0))[0]
        size = sum(x.size for x in jax.tree.leaves(state.params))
        moments = [tuple(x.shape) for x in jax.tree.leaves(state.opt_state)].count((size,))
        assert moments == {"ppo": 2, "impala": 1}[algo]  # Adam's mu and nu; RMSProp's nu
        shapes = [tuple(x.shape) for x in jax.tree.leaves(state.params)]
        epochs = [eqn for eqn in _scans(jaxpr) if eqn.params["length"] == 3
                  and any(inner.params["length"] == 2
                          for inner in _scans(eqn.params["jaxpr"].jaxpr))]
        assert epochs, "no loop of 3 epochs of 2 minibatches found"
        for eqn in epochs:
            start = eqn.params["num_consts"]
            carry = [tuple(v.aval.shape)
                     for v in eqn.params["jaxpr"].jaxpr.invars[start:start
                                                               + eqn.params["num_carry"]]]
            vectors = carry.count((size,))
            if backend == "tpu":
                assert vectors == 0, carry
                assert all(carry.count(s) >= 1 + moments for s in shapes), carry
            else:
                assert vectors == moments, carry
    counts = [int(x) for x in jax.tree.leaves(ends["tpu"].opt_state)
              if jnp.issubdtype(x.dtype, jnp.integer)]
    assert counts == {"ppo": [2 * 3 * 2], "impala": []}[algo]  # Adam's steps; RMSProp has none
    for part in ("params", "opt_state"):
        for g, w in zip(jax.tree.leaves(getattr(ends["tpu"], part)),
                        jax.tree.leaves(getattr(ends["cpu"], part))):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-7, err_msg=part)
