"""`common.scan.packed_scan` against `lax.scan`, bit for bit, and its packing round trip."""

import jax
import jax.numpy as jnp
import numpy as np


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


def test_packed_scan_is_lax_scan_itself_where_the_program_is_not_for_a_cpu(monkeypatch):
    """Packing pays on XLA:CPU only; traced for another backend, the program is `lax.scan`'s
    (on a TPU, unpacking re-lays out every leaf at every step)."""
    from jax import lax

    from common.scan import packed_scan

    def step(carry, x):
        return (carry[0] + x, carry[1] * 2), carry[0] * x

    init, xs = (jnp.zeros(3), jnp.int32(1)), jnp.arange(12.0).reshape(4, 3)
    plain = str(jax.make_jaxpr(lambda i, x: lax.scan(step, i, x))(init, xs))
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # whatever runs the test
    assert str(jax.make_jaxpr(lambda i, x: packed_scan(step, i, x))(init, xs)) != plain
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert str(jax.make_jaxpr(lambda i, x: packed_scan(step, i, x))(init, xs)) == plain
