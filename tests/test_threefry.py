"""`common.threefry`: JAX's Threefry in straight-line code, checked against the hash's published
known answers and against JAX's own keys, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.threefry import THREEFRY, raw_keys, straight_keys, threefry2x32


@pytest.mark.parametrize("key, counter, expected", [
    # Random123's known-answer tests for Threefry-2x32, 20 rounds (kat_vectors):
    # key, counter, output
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_the_hash_gives_random123_s_known_answers(key, counter, expected):
    u = lambda v: jnp.uint32(v)  # noqa: E731
    out = threefry2x32(u(key[0]), u(key[1]), u(counter[0]), u(counter[1]))
    assert [int(x) for x in out] == list(expected)


def draws(key):
    """Every way the project draws random numbers, from one key."""
    k1, k2 = jax.random.split(key)
    logits = jnp.log(jnp.array([[0.2, 0.3, 0.5]] * 6))
    return (raw_keys(jax.random.split(key, (3, 5))), raw_keys(jax.random.fold_in(key, 11)),
            jax.random.bits(k1, (9,)), jax.random.bits(k2, (4, 3), jnp.uint8),
            jax.random.bits(k1, (5,), jnp.uint16), jax.random.uniform(k2, (5, 3)),
            jax.random.normal(k1, (4,)), jax.random.categorical(k2, logits),
            jax.random.permutation(k1, 17), jax.random.randint(k2, (6,), -3, 9))


def test_straight_keys_draw_jax_s_bits_eagerly_jitted_and_vmapped():
    """Eagerly (op by op), jitted, and vmapped (under `jit`: the same batching rules as an
    eager `vmap`, in one program rather than one for each operation)."""
    raw = jax.random.PRNGKey(1234)
    wrapped = jax.random.wrap_key_data(raw, impl=THREEFRY)
    keys = jax.random.split(raw, 3)
    for got, want in [(draws(wrapped), draws(raw)),
                      (jax.jit(lambda k: draws(straight_keys(k)))(raw), jax.jit(draws)(raw)),
                      (jax.jit(jax.vmap(lambda k: draws(straight_keys(k))))(keys),
                       jax.jit(jax.vmap(draws))(keys))]:
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_straight_keys_take_raw_and_typed_threefry_keys_and_leave_other_kinds_alone(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # whatever runs the test
    typed = jax.random.key(5)
    assert str(jax.random.key_impl(straight_keys(typed))) == str(THREEFRY)
    np.testing.assert_array_equal(jax.random.key_data(straight_keys(typed)),
                                  jax.random.key_data(typed))
    rbg = jax.random.key(5, impl="rbg")
    assert straight_keys(rbg) is rbg
    raw = jax.random.PRNGKey(5)
    assert straight_keys(raw) is not raw
    jax.config.update("jax_threefry_partitionable", False)  # other bits: JAX's keys stay
    try:
        assert straight_keys(raw) is raw
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # JAX's own hash is straight there
    assert straight_keys(raw) is raw


def test_raw_keys_unwraps_typed_keys_in_a_tree_and_nothing_else():
    tree = {"rng": straight_keys(jax.random.PRNGKey(2)), "x": jnp.arange(3, dtype=jnp.uint32)}
    out = raw_keys(tree)
    assert out["rng"].dtype == jnp.uint32 and out["rng"].shape == (2,)
    np.testing.assert_array_equal(out["rng"], jax.random.PRNGKey(2))
    assert out["x"] is tree["x"]


def test_the_rollout_draws_the_same_transitions_with_straight_keys_as_with_jax_s(monkeypatch):
    """On CPU the rollout hashes with `THREEFRY`; traced as for another backend it keeps JAX's
    keys. Discrete CartPole, so the only possible difference is the random bits."""
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # whatever runs the test
    from common.envs import make_env
    from common.rollout import reset, rollout

    env, params, spec = make_env("CartPole-v1")
    policy = lambda key, obs, first, hidden: (  # noqa: E731
        jax.random.categorical(key, jnp.zeros((obs.shape[0], 2))), {}, hidden)
    state = reset(env, params, jax.random.PRNGKey(0), 4)

    def run():
        fn = lambda s, k: rollout(env, params, spec, policy, s, k, 64)  # noqa: E731
        program = str(jax.make_jaxpr(fn)(state, jax.random.PRNGKey(1)))
        return jax.jit(fn)(state, jax.random.PRNGKey(1)), "key<fs>" in program

    straight, used = run()
    assert used  # the CPU program hashes with THREEFRY (keys of its tag, "fs")
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    plain, used = run()
    assert not used
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_environment_that_keeps_its_key_in_its_state_gets_jax_s_keys(monkeypatch):
    """Playground keeps `info["rng"]` in its state: with wrapped keys its state would hold a
    typed key where the rollout's carry holds raw data. (Keys are wrapped for a CPU only.)"""
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # whatever runs the test
    from common.envs import make_env
    from common.rollout import keeps_keys

    class KeepsKey:
        def reset(self, key, params):
            return jnp.zeros(3), {"rng": key, "t": jnp.int32(0)}

    env, params, _ = make_env("CartPole-v1")
    key = jax.random.PRNGKey(0)
    assert not keeps_keys(env, params, key)
    assert keeps_keys(KeepsKey(), None, key)
