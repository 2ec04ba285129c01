"""`common.host.prng`: the straight-line Threefry lowering draws JAX's bits without a loop,
and stays off on a JAX release it was not measured on."""

import jax
import jax.numpy as jnp
import numpy as np


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
        with jax.default_device(jax.devices("cpu")[0]):  # CPU programs on any machine
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
        with jax.default_device(jax.devices("cpu")[0]):  # a CPU program on any machine
            text = jax.jit(lambda k: jax.random.split(k, 3)).lower(
                jax.random.PRNGKey(1)).as_text()
    finally:
        prng.unroll_threefry_on_cpu(False)
    assert "while" in text
