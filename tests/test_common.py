"""`common/`: observation normalisation, the rollout's truncation handling, pmean, init."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import normalize
from common.distributed import pmean, psum
from common.envs import check_env_id, make_env, to_env_action
from common.nn import orthogonal
from common.rollout import finished_episode_stats, reset, rollout


# ------------------------------------------------------------------ normalisation
def test_running_stats_match_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 5)).astype(np.float32) for n in (7, 64, 1, 33)]
    stats = normalize.init((5,))
    for b in batches:
        stats = jax.jit(normalize.update)(stats, b)
    everything = np.concatenate(batches)
    # gymnasium's convention: a prior of mean 0, var 1 with weight 1e-4.
    n0 = 1e-4
    n = n0 + len(everything)
    mean = everything.sum(0) / n
    var = (n0 * (1.0 + mean ** 2) + ((everything - mean) ** 2).sum(0)) / n
    np.testing.assert_allclose(stats.count, n, rtol=1e-6)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-4)
    z = normalize.normalize(stats, everything)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(z.std(0), 1.0, atol=1e-3)


def test_normalize_clips_and_rejects_wrong_shapes():
    stats = normalize.init((2,))
    np.testing.assert_allclose(normalize.normalize(stats, jnp.array([100.0, -100.0])), [10.0, -10.0])
    with pytest.raises(ValueError, match="expected"):
        normalize.update(stats, jnp.zeros((4, 3)))


# ------------------------------------------------------------------ rollout
def test_rollout_keeps_truncation_apart_and_records_final_observation():
    env, env_params, spec = make_env("CartPole-v1")
    env_params = env_params.replace(max_steps_in_episode=5)
    # Keep the pole up: push towards the side the pole leans (never terminates in 5 steps).
    policy = lambda key, obs, first, h: (  # noqa: E731
        (obs[:, 2] > 0).astype(jnp.int32), obs[:, 0] * 0, h)
    state = reset(env, env_params, jax.random.PRNGKey(0), 3)
    state, traj = jax.jit(lambda s, k: rollout(env, env_params, spec, policy, s, k, 12))(
        state, jax.random.PRNGKey(1))
    done_steps = [4, 9]
    for t in range(12):
        assert not traj.terminated[t].any()
        assert traj.truncated[t].all() == (t in done_steps)
    for t in done_steps:
        np.testing.assert_array_equal(traj.episode_length[t], 5)
        # The next observation of a truncated step is the true final state, not the reset one.
        assert not np.allclose(traj.next_obs[t], traj.obs[t + 1])
        # (that it is the state the environment really reached: the next test replays it)
    for t in range(11):
        if t not in done_steps:
            np.testing.assert_array_equal(traj.next_obs[t], traj.obs[t + 1])
    np.testing.assert_allclose(traj.episode_return[4], 5.0)
    ret_sum, len_sum, count = finished_episode_stats(traj)
    assert (float(ret_sum), float(len_sum), float(count)) == (30.0, 30.0, 6.0)


def test_rollout_final_observation_is_the_true_next_state():
    env, env_params, spec = make_env("CartPole-v1")
    env_params = env_params.replace(max_steps_in_episode=3)
    policy = lambda key, obs, first, h: (  # noqa: E731
        jnp.zeros(obs.shape[0], jnp.int32), obs[:, 0] * 0, h)
    state0 = reset(env, env_params, jax.random.PRNGKey(0), 1)
    _, traj = rollout(env, env_params, spec, policy, state0, jax.random.PRNGKey(1), 3)
    # Step the same environment by hand with gymnax's own step_env (no auto-reset).
    s = jax.tree.map(lambda x: x[0], state0.env_state)
    for t in range(3):
        obs, s, *_ = env.step_env(jax.random.PRNGKey(0), s, 0, env_params)
    np.testing.assert_allclose(traj.next_obs[2, 0], obs, rtol=1e-6)
    assert bool(traj.truncated[2, 0]) and not bool(traj.terminated[2, 0])


def test_rollout_terminates_without_truncation_flag():
    env, env_params, spec = make_env("CartPole-v1")
    policy = lambda key, obs, first, h: (  # noqa: E731
        jnp.zeros(obs.shape[0], jnp.int32), obs[:, 0] * 0, h)
    state = reset(env, env_params, jax.random.PRNGKey(0), 2)
    _, traj = rollout(env, env_params, spec, policy, state, jax.random.PRNGKey(1), 40)
    assert traj.terminated.any()  # always pushing left drops the pole within ~10 steps
    assert not (traj.terminated & traj.truncated).any()
    assert not traj.truncated.any()


def test_continuous_actions_are_clipped_for_the_environment_only():
    _, _, spec = make_env("Pendulum-v1")
    action = jnp.array([[5.0], [-0.5]])
    np.testing.assert_allclose(to_env_action(action, spec, (1,)), [[2.0], [-0.5]])


def test_unknown_environment_names_the_closest_ids():
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env("Cartpole-v1")


def test_a_brax_id_without_brax_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)  # what find_spec sees where it is missing
    with pytest.raises(ValueError, match=r'brax/ant needs Brax, which is not installed: '
                                         r'pip install -e "\.\[brax\]"'):
        check_env_id("brax/ant")
    with pytest.raises(ValueError, match="unknown environment id 'brax/walker'"):
        check_env_id("brax/walker")


LAZY_MAKE = """
import sys
import jax
import numpy as np
from common.envs import MASKED, known_env_ids, make_env
made = {}
first = ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"]
others = [i for i in known_env_ids() if i not in first and i != "MNISTBandit-bsuite"  # download
          and i not in MASKED and not i.startswith("brax/")]  # ours, not gymnax's
for env_id in first + others:
    env, params, _ = make_env(env_id)
    made[env_id] = (type(env), params)
    if env_id == first[-1]:
        heavy = [m for m in ("gymnax", "gymnax.environments", "matplotlib", "seaborn",
                             "scipy.stats") if m in sys.modules]
        assert not heavy, heavy
assert "gymnax" not in sys.modules
import gymnax
for env_id, (cls, params) in made.items():
    env, default = gymnax.make(env_id)
    assert type(env) is cls, (env_id, type(env), cls)
    assert jax.tree.structure(default) == jax.tree.structure(params), env_id
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b, equal_nan=True)), default, params)
    assert all(jax.tree.leaves(same)), (env_id, same)
print("made", len(made))
"""


def test_make_env_imports_only_the_environment_s_own_module_and_makes_what_gymnax_makes():
    """In a fresh process: CartPole, Pendulum and Breakout import no gymnax package init and no
    plotting library; every other built-in id (but MNIST, a download) is made too; then
    `import gymnax` works and makes the same classes and default parameters."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", LAZY_MAKE], cwd=root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "made 25" in result.stdout, result.stdout


# ------------------------------------------------------------------ pmean
def test_pmean_is_a_noop_without_a_bound_axis_and_averages_with_one():
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(jax.jit(pmean)(x), x)
    np.testing.assert_array_equal(jax.vmap(pmean)(x), x)  # vmap without axis_name: unbound
    averaged = jax.vmap(lambda v: pmean(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(averaged, np.full(4, 1.5))
    summed = jax.vmap(lambda v: psum(v, "data"), axis_name="data")(x)
    np.testing.assert_allclose(summed, np.full(4, 6.0))


# ------------------------------------------------------------------ init
def qr_operand_shapes(jaxpr) -> list:
    """The operand shapes of every QR decomposition in `jaxpr`, nested programs included."""
    shapes = []
    for eqn in jaxpr.eqns:
        if "qr" in eqn.primitive.name:
            shapes += [v.aval.shape for v in eqn.invars]
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                shapes += qr_operand_shapes(getattr(inner, "jaxpr", inner))
    return shapes


def test_orthogonal_equals_flax_and_vmaps_sequentially():
    key = jax.random.PRNGKey(3)
    ours = orthogonal(np.sqrt(2))(key, (64, 64))
    flax_init = jax.nn.initializers.orthogonal(np.sqrt(2))(key, (64, 64))
    np.testing.assert_allclose(ours, flax_init, rtol=1e-6, atol=1e-6)
    keys = jax.random.split(key, 3)
    batched = jax.vmap(lambda k: orthogonal(1.0)(k, (8, 8)))(keys)
    for i in range(3):
        np.testing.assert_allclose(batched[i], orthogonal(1.0)(keys[i], (8, 8)), rtol=1e-6)
    # Under vmap: one 8 x 8 QR per seed in a loop, never flax's batched QR of [3, 8, 8] (the
    # jaxlib 0.10 deadlock below).
    def vmapped(init):
        return jax.make_jaxpr(jax.vmap(lambda k: init(k, (8, 8))))(keys).jaxpr

    assert qr_operand_shapes(vmapped(orthogonal(1.0))) == [(8, 8)]
    assert (3, 8, 8) in qr_operand_shapes(vmapped(jax.nn.initializers.orthogonal(1.0)))


# ------------------------------------------------------------------ the jaxlib 0.10 deadlock
def test_vmapped_network_init_under_pmap_does_not_deadlock():
    """Regression test for the batched-QR deadlock of jaxlib 0.10.x (see `common.nn.orthogonal`).

    `tests/hang_probe.py --flax-orthogonal` (flax's own initialiser) hangs here, at 0% CPU;
    with `common.nn.orthogonal` the same probe finishes in seconds."""
    import os
    import subprocess
    import sys

    probe = os.path.join(os.path.dirname(__file__), "hang_probe.py")
    try:
        result = subprocess.run([sys.executable, probe], capture_output=True, text=True,
                                timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("pmap(vmap(network.init)) hung: the batched-QR deadlock is back")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


# ------------------------------------------------------------------ the CNN's convolution
def numpy_conv_same(x, kernel, bias):
    """The definition, one output at a time: zero padding, stride 1, cross-correlation."""
    kh, kw, _, features = kernel.shape
    height, width = x.shape[-3:-1]
    padded = np.pad(x, [(0, 0)] * (x.ndim - 3) + [(kh // 2,) * 2, (kw // 2,) * 2, (0, 0)])
    out = np.zeros(x.shape[:-1] + (features,))
    for i in range(height):
        for j in range(width):
            window = padded[..., i:i + kh, j:j + kw, :]
            out[..., i, j, :] = np.einsum("...abc,abcf->...f", window, kernel) + bias
    return out


@pytest.mark.parametrize("kernel_size", [(3, 3), (1, 1), (5, 3)])
def test_conv_same_matches_a_numpy_loop_and_flax(kernel_size):
    from common.nn import Conv, conv_same

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 6, 5, 4)).astype(np.float32)
    kernel = rng.normal(size=(*kernel_size, 4, 7)).astype(np.float32)
    bias = rng.normal(size=7).astype(np.float32)
    np.testing.assert_allclose(jax.jit(conv_same)(x, kernel, bias),
                               numpy_conv_same(x, kernel, bias), rtol=1e-5, atol=1e-5)
    # the module: flax.linen.Conv's parameters (names, shapes, initial values) and outputs
    import flax.linen as nn
    ours, theirs = Conv(7, kernel_size, orthogonal(1.4)), nn.Conv(7, kernel_size,
                                                                  kernel_init=orthogonal(1.4))
    params = ours.init(jax.random.PRNGKey(1), x)
    flax_params = theirs.init(jax.random.PRNGKey(1), x)
    jax.tree.map(np.testing.assert_array_equal, params, flax_params)
    np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-5,
                               atol=1e-5)
    # under vmap over kernels (seeds): each the same as alone
    kernels = np.stack([kernel, -kernel, 2 * kernel])
    batched = jax.vmap(conv_same, in_axes=(None, 0, None))(x, kernels, bias)
    for k, got in zip(kernels, batched):
        np.testing.assert_allclose(got, numpy_conv_same(x, k, bias), rtol=1e-5, atol=1e-4)


def test_conv_same_refuses_even_kernels_and_wrong_channels():
    from common.nn import conv_same

    x = np.zeros((10, 10, 4), np.float32)
    with pytest.raises(ValueError, match="odd sizes"):
        conv_same(x, np.zeros((2, 2, 4, 8), np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="4 input channels"):
        conv_same(np.zeros((10, 10, 3), np.float32), np.zeros((3, 3, 4, 8), np.float32),
                  np.zeros(8, np.float32))


# ------------------------------------------------------------------ Dense's weight gradient
@pytest.mark.parametrize("shape", [(32, 7), (3, 5, 7)])
def test_dense_equals_flax_dense_in_value_and_gradients(shape):
    """Same parameters, outputs and gradients (to rounding) as nn.Dense, also under vmap; the
    reference gradients are written out in NumPy: dL/dW = x^T g, dL/dx = g W^T, dL/db = sum g."""
    import flax.linen as nn
    from common.nn import Dense, matmul

    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    params = nn.Dense(4).init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, Dense(4).init(jax.random.PRNGKey(1), x)) == \
        jax.tree.map(jnp.shape, params)
    np.testing.assert_array_equal(Dense(4).init(jax.random.PRNGKey(1), x)["params"]["kernel"],
                                  params["params"]["kernel"])

    def loss(module, p, x):  # L = sum(sin(y)), so g = cos(y)
        return jnp.sum(jnp.sin(module.apply(p, x)))

    kernel = np.asarray(params["params"]["kernel"])
    x_rows = np.asarray(x).reshape(-1, shape[-1])
    g = np.cos(x_rows @ kernel + np.asarray(params["params"]["bias"]))
    grads, grad_x = jax.jit(jax.grad(lambda p, x: loss(Dense(4), p, x), argnums=(0, 1)))(params, x)
    np.testing.assert_allclose(grads["params"]["kernel"], x_rows.T @ g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["params"]["bias"], g.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_x, (g @ kernel.T).reshape(shape), rtol=1e-5, atol=1e-5)
    # under vmap over a leading axis of parameters (as over seeds): each equals its own grad
    stacked = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), params)
    batched = jax.vmap(jax.grad(lambda p: loss(Dense(4), p, x)))(stacked)
    for i in range(2):
        one = jax.tree.map(lambda a: a[i], stacked)
        expected = jax.grad(lambda p: loss(nn.Dense(4), p, x))(one)
        np.testing.assert_allclose(batched["params"]["kernel"][i], expected["params"]["kernel"],
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(matmul(x, kernel), np.asarray(x) @ kernel, rtol=1e-6, atol=1e-6)


def test_dense_kept_transpose_is_a_copy_for_one_run_and_folds_into_the_product_under_vmap():
    """`kept_transpose(x) = x.T`, also vmapped and nested; one run keeps it as an array (an
    optimisation barrier), vmapped over seeds it is a plain transpose, so that the weight
    gradient is one batched product; Dense's gradients with inputs batched too equal flax's."""
    import flax.linen as nn
    from common.nn import Dense, kept_transpose

    xs = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(kept_transpose(xs[0, 0]), xs[0, 0].T)
    np.testing.assert_array_equal(jax.vmap(kept_transpose)(xs[0]), xs[0].transpose(0, 2, 1))
    np.testing.assert_array_equal(jax.vmap(jax.vmap(kept_transpose))(xs),
                                  xs.transpose(0, 1, 3, 2))
    assert "optimization_barrier" in str(jax.make_jaxpr(kept_transpose)(xs[0, 0]))
    assert "optimization_barrier" not in str(jax.make_jaxpr(jax.vmap(kept_transpose))(xs[0]))

    def grads(module, p, x):
        return jax.grad(lambda p: jnp.sum(jnp.sin(module.apply(p, x))))(p)

    params = jax.vmap(nn.Dense(6).init)(jax.random.split(jax.random.PRNGKey(0), 3), xs[0])
    ours = jax.jit(jax.vmap(functools.partial(grads, Dense(6))))(params, xs[0])
    flax = jax.vmap(functools.partial(grads, nn.Dense(6)))(params, xs[0])
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), ours, flax)


# ------------------------------------------------------------------ PPO's minibatch shuffle
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
    mb = shuffled_minibatches(jax.random.PRNGKey(0), batch, 3)
    assert mb["i"].shape == (3, 4) and mb["x"].shape == (3, 4, 2)
    np.testing.assert_array_equal(np.sort(np.asarray(mb["i"]).ravel()), np.arange(12))
    np.testing.assert_array_equal(mb["x"][..., 0], 2.0 * mb["i"])  # rows stay together
    with pytest.raises(ValueError, match="does not divide into 5 minibatches"):
        shuffled_minibatches(jax.random.PRNGKey(0), batch, 5)


# ------------------------------------------------------------------ Threefry without its loop
def test_unrolled_threefry_gives_the_same_bits_without_a_loop():
    """The CPU lowering the command line opts into (common/host/prng.py) draws bit for bit the
    same keys, uniforms, normals and categorical samples as JAX's looped default, and its
    program has no while loop; `make_train` leaves the process's choice alone."""
    from algos.ppo import Config, make_train
    from common.host.prng import unroll_threefry_on_cpu

    def draws(key):
        k1, k2 = jax.random.split(key)
        logits = jnp.log(jnp.array([[0.2, 0.3, 0.5]] * 6))
        return (jax.random.key_data(jax.random.split(key, 7)), jax.random.bits(k1, (9,)),
                jax.random.uniform(k2, (5, 3)), jax.random.normal(k1, (4,)),
                jax.random.categorical(k2, logits))

    def compiled(key):  # a fresh function each time, so it is lowered again
        fn = jax.jit(lambda k: draws(k))
        return fn(key), fn.lower(key).as_text()

    key = jax.random.PRNGKey(3)
    try:
        assert unroll_threefry_on_cpu(False)
        make_train(Config(total_timesteps=2048))  # changes no process-wide setting
        looped, looped_text = compiled(key)
        unroll_threefry_on_cpu(True)
        unrolled, unrolled_text = compiled(key)
    finally:
        unroll_threefry_on_cpu(False)  # JAX's default again for the tests after this one
    assert "while" in looped_text and "while" not in unrolled_text
    for a, b in zip(looped, unrolled):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_threefry_stays_looped_on_a_jax_release_it_was_not_measured_on(monkeypatch):
    """jax 0.11.2 compiled a vmapped `train` for minutes with the straight-line lowering: on
    a release outside `MEASURED_ON` the opt-in declines and JAX's loop stays."""
    from common.host import prng

    prng.unroll_threefry_on_cpu(False)
    monkeypatch.setattr(jax, "__version__", "0.11.2")
    try:
        assert not prng.unroll_threefry_on_cpu(True)
        text = jax.jit(lambda k: jax.random.split(k, 3)).lower(jax.random.PRNGKey(1)).as_text()
    finally:
        prng.unroll_threefry_on_cpu(False)
    assert "while" in text


def test_packed_scan_equals_lax_scan_on_mixed_dtypes_and_packing_round_trips():
    from common.scan import packed_scan, packing

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    init = {"x": jax.random.normal(k[0], (3, 2)), "n": jnp.arange(3, dtype=jnp.int32),
            "flag": jnp.array([True, False, True]), "t": jnp.float32(0.5)}
    xs = (jax.random.normal(k[1], (7, 3)), jax.random.randint(k[2], (7, 3), 0, 5))

    def step(c, x):
        r, a = x
        c = {"x": c["x"] * 0.9 + r[:, None], "n": c["n"] + a, "flag": c["flag"] ^ (a > 2),
             "t": c["t"] + r.sum()}
        return c, {"obs": c["x"], "count": c["n"] * 2, "done": c["flag"], "none": None}

    want = jax.jit(lambda c, x: jax.lax.scan(step, c, x))(init, xs)
    got = jax.jit(lambda c, x: packed_scan(step, c, x))(init, xs)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)

    pack, unpack = packing(init)
    packed = pack(init)
    assert len(packed) == 3  # one array per dtype: bool, float32, int32
    assert sorted(p.shape[-1] for p in packed) == [3, 3, 7]
    stacked = jax.tree.map(lambda x: jnp.stack([x, x + 1]), init)  # a leading axis
    for g, w in zip(jax.tree.leaves(unpack(pack(stacked))), jax.tree.leaves(stacked)):
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
        for optimizer in (on_tree, flat):
            scanned, state, losses = jax.jit(lambda p: sgd_scan(
                lambda p, b: (loss(p, b), loss(p, b)), optimizer, p, optimizer.init(p),
                batches))(params)
            assert losses.shape == (5,), name
            for g, w in zip(jax.tree.leaves(scanned), jax.tree.leaves(want)):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=name)
            expected_state = jax.jit(lambda p: sgd(optimizer, p)[1])(params)
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


def normalize_rewards_reference(reward, done, gamma, g0, clip=10.0, eps=1e-8):
    """gym's NormalizeReward, one step at a time: a running discounted return per
    environment, a running variance of it (Welford-style merge of each step's batch), and
    rewards divided by its standard deviation."""
    mean, var, count = 0.0, 1.0, 1e-4
    g = np.array(g0, np.float64)
    out = np.zeros_like(reward, np.float64)
    for t in range(reward.shape[0]):
        g = reward[t] + gamma * g
        b_mean, b_var, b_count = g.mean(), g.var(), len(g)
        delta, total = b_mean - mean, count + b_count
        mean, var = mean + delta * b_count / total, \
            (var * count + b_var * b_count + delta**2 * count * b_count / total) / total
        count = total
        out[t] = np.clip(reward[t] / np.sqrt(var + eps), -clip, clip)
        g = np.where(done[t], 0.0, g)
    return out, g, var


def test_normalize_rewards_matches_gyms_wrapper_written_out():
    rng = np.random.default_rng(3)
    reward = rng.normal(5.0, 3.0, (40, 6)).astype(np.float32)
    done = rng.random((40, 6)) < 0.1
    done[-1] = [True, True, True, False, False, False]  # some episodes end at the last step
    g0 = rng.normal(0, 10, 6).astype(np.float32)
    stats, g, scaled = jax.jit(normalize.normalize_rewards, static_argnames="axis_name")(
        normalize.init(()), jnp.asarray(g0), jnp.asarray(reward), jnp.asarray(done), 0.99)
    ref, ref_g, ref_var = normalize_rewards_reference(reward, done, 0.99, g0)
    np.testing.assert_allclose(scaled, ref, rtol=2e-5)
    np.testing.assert_allclose(g, ref_g, rtol=1e-5)
    np.testing.assert_allclose(stats.var, ref_var, rtol=1e-5)
    assert not np.allclose(scaled, reward)  # it did scale
    # A returned G of 0 where the last step ended an episode: the next rollout starts afresh.
    np.testing.assert_array_equal(np.asarray(g)[:3], 0.0)
    assert (np.abs(np.asarray(g)[3:]) > 1.0).all()  # the others carry their return on
    with pytest.raises(ValueError, match="must be \\[T, num_envs\\]"):
        normalize.normalize_rewards(normalize.init(()), jnp.zeros(5), jnp.zeros((3, 6)),
                                    jnp.zeros((3, 6), bool), 0.99)


def test_normalize_rewards_across_devices_equals_the_global_computation():
    """Environments split over a device axis (`vmap` with the data-parallel axis name):
    every device ends with the statistics of all environments, and each its own scaled
    rewards -- the same numbers as one call over all environments."""
    from common.distributed import DATA_AXIS

    rng = np.random.default_rng(5)
    reward = jnp.asarray(rng.normal(1.0, 2.0, (12, 8)), jnp.float32)
    done = jnp.asarray(rng.random((12, 8)) < 0.2)
    stats, g, scaled = normalize.normalize_rewards(normalize.init(()), jnp.zeros(8), reward,
                                                   done, 0.9)
    split = lambda x: x.reshape(x.shape[0], 4, 2).swapaxes(0, 1)  # noqa: E731  [4 devices]
    per_device = jax.vmap(lambda r, d: normalize.normalize_rewards(
        normalize.init(()), jnp.zeros(2), r, d, 0.9), axis_name=DATA_AXIS)
    d_stats, d_g, d_scaled = per_device(split(reward), split(done))
    for leaf, want in zip(d_stats, stats):
        np.testing.assert_allclose(leaf, jnp.broadcast_to(want, (4,)), rtol=1e-6)
    np.testing.assert_allclose(d_scaled.swapaxes(0, 1).reshape(12, 8), scaled, rtol=1e-6)
    np.testing.assert_allclose(d_g.reshape(8), g, rtol=1e-6)


@pytest.mark.parametrize("masked,base,keep", [("MaskedCartPole-v1", "CartPole-v1", [0, 2]),
                                              ("MaskedPendulum-v1", "Pendulum-v1", [0, 1])])
def test_masked_tasks_hide_the_velocities(masked, base, keep):
    """The same environment and keys: the masked observation is the full one without its
    velocity entries, at every step, across automatic resets, and in the final observation
    of a truncated or terminated episode."""
    env, params, spec = make_env(masked)
    full_env, full_params, full_spec = make_env(base)
    assert spec.obs_shape == (2,) and full_spec.obs_shape[0] in (3, 4)
    assert spec.discrete == full_spec.discrete and spec.action_dim == full_spec.action_dim
    policy = lambda key, obs, first, h: (  # noqa: E731
        jax.random.randint(key, (obs.shape[0],), 0, 2) if spec.discrete
        else jax.random.uniform(key, (obs.shape[0], 1), minval=-2, maxval=2), None, h)
    key = jax.random.PRNGKey(0)
    _, traj = rollout(env, params, spec, policy, reset(env, params, key, 4), key, 250)
    _, full = rollout(full_env, full_params, full_spec, policy,
                      reset(full_env, full_params, key, 4), key, 250)
    np.testing.assert_array_equal(traj.obs, full.obs[..., keep])
    np.testing.assert_array_equal(traj.next_obs, full.next_obs[..., keep])
    assert (np.asarray(traj.terminated) | np.asarray(traj.truncated)).any()  # resets happened
    hidden = [i for i in range(full_spec.obs_shape[0]) if i not in keep]
    assert np.std(np.asarray(full.obs)[..., hidden]) > 0.1  # what is hidden does vary
    space = env.observation_space(params)
    assert space.shape == (2,) and np.shape(space.low) == (2,)
