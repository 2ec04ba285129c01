"""`common.vtrace.vtrace` against a NumPy loop written from the equations, plus its properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.gae import gae
from common.vtrace import vtrace


def vtrace_reference(log_rho, r, v, v_next, terminated, truncated, gamma, lam=1.0, rho_bar=1.0,
                     c_bar=1.0, pg_rho_bar=1.0):
    """Espeholt et al. (2018) Sec. 4.1 (Remark 1) and Sec. 4.2, with termination (no
    bootstrap) and truncation (bootstrap, cut the trace) kept apart -- a plain loop over t."""
    T = len(r)
    rho = np.exp(np.asarray(log_rho, np.float64))
    vs = np.zeros(T)
    diff_tp1 = 0.0  # vs_{t+1} - V(s_{t+1}), zero beyond the last step
    for t in reversed(range(T)):
        done = terminated[t] or truncated[t]
        bootstrap = 0.0 if terminated[t] else v_next[t]
        delta = min(rho_bar, rho[t]) * (r[t] + gamma * bootstrap - v[t])
        trace = 0.0 if done else gamma * lam * min(c_bar, rho[t])
        diff = delta + trace * diff_tp1
        vs[t] = v[t] + diff
        diff_tp1 = diff
    pg_adv = np.zeros(T)
    for t in range(T):
        if terminated[t]:
            target = r[t]
        elif truncated[t] or t == T - 1:
            target = r[t] + gamma * v_next[t]
        else:
            target = r[t] + gamma * vs[t + 1]
        pg_adv[t] = min(pg_rho_bar, rho[t]) * (target - v[t])
    return vs, pg_adv


def random_trajectory(seed, T=64, batch=()):
    """Random data whose ratios rho = exp(log_rho) span ~[0.2, 5]: both sides of every
    threshold used below."""
    rng = np.random.default_rng(seed)
    shape = (T,) + batch
    return dict(
        log_rhos=rng.uniform(-1.6, 1.6, size=shape).astype(np.float32),
        rewards=rng.normal(size=shape).astype(np.float32),
        values=rng.normal(size=shape).astype(np.float32),
        next_values=rng.normal(size=shape).astype(np.float32),
        terminated=rng.random(shape) < 0.08,
        truncated=rng.random(shape) < 0.08,
    )


CASES = [  # gamma, lambda_, rho_bar, c_bar, pg_rho_bar
    (0.99, 1.0, 1.0, 1.0, 1.0),    # the paper's defaults
    (0.9, 0.95, 1.5, 0.8, 2.0),   # three different thresholds
    (0.97, 0.5, 0.7, 1.2, 0.9),
]


@pytest.mark.parametrize("gamma,lam,rho_bar,c_bar,pg_rho_bar", CASES)
def test_matches_numpy_reference_single_trajectory(gamma, lam, rho_bar, c_bar, pg_rho_bar):
    d = random_trajectory(0)
    assert d["terminated"].any() and d["truncated"].any()
    rho = np.exp(d["log_rhos"])
    for bar in (rho_bar, c_bar, pg_rho_bar):
        assert (rho < bar).any() and (rho > bar).any()
    fn = jax.jit(lambda *a: vtrace(*a, gamma, lambda_=lam, rho_bar=rho_bar, c_bar=c_bar,
                                   pg_rho_bar=pg_rho_bar))
    vs, pg_adv = fn(*d.values())
    ref_vs, ref_pg = vtrace_reference(*d.values(), gamma, lam, rho_bar, c_bar, pg_rho_bar)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pg_adv, ref_pg, rtol=1e-5, atol=1e-5)


def test_batched_equals_per_column_reference_and_vmap():
    d = random_trajectory(1, T=50, batch=(6,))
    kw = dict(lambda_=0.9, rho_bar=1.3, c_bar=0.9, pg_rho_bar=1.1)
    vs, pg_adv = vtrace(*d.values(), 0.97, **kw)
    for i in range(6):
        col = {k: v[:, i] for k, v in d.items()}
        ref_vs, ref_pg = vtrace_reference(*col.values(), 0.97, 0.9, 1.3, 0.9, 1.1)
        np.testing.assert_allclose(vs[:, i], ref_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pg_adv[:, i], ref_pg, rtol=1e-5, atol=1e-5)
    # vmap over a leading batch axis (batch-major input) gives the same numbers.
    batch_major = {k: np.moveaxis(v, 1, 0) for k, v in d.items()}
    vvs, vpg = jax.jit(jax.vmap(lambda *a: vtrace(*a, 0.97, **kw)))(*batch_major.values())
    np.testing.assert_allclose(np.moveaxis(np.asarray(vvs), 0, 1), vs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.moveaxis(np.asarray(vpg), 0, 1), pg_adv, rtol=1e-6, atol=1e-6)


def test_traced_scalars_under_jit_and_vmap():
    d = random_trajectory(2)
    hp = jnp.array([[0.9, 0.0, 0.5, 2.0, 1.0],  # gamma, lambda_, rho_bar, c_bar, pg_rho_bar
                    [0.99, 0.95, 2.0, 0.5, 0.8]])
    fn = jax.jit(jax.vmap(lambda h: vtrace(*d.values(), h[0], lambda_=h[1], rho_bar=h[2],
                                           c_bar=h[3], pg_rho_bar=h[4])))
    vs, pg_adv = fn(hp)
    for i in range(2):
        ref_vs, ref_pg = vtrace_reference(*d.values(), *map(float, hp[i]))
        np.testing.assert_allclose(vs[i], ref_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pg_adv[i], ref_pg, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_on_policy_vs_equals_gae_returns(lam):
    d = random_trajectory(3, T=40, batch=(3,))
    d["log_rhos"][:] = 0.0  # rho = 1, below every threshold here: no clipping
    vs, _ = vtrace(*d.values(), 0.99, lambda_=lam, rho_bar=1.5, c_bar=1.2, pg_rho_bar=2.0)
    rest = [d[k] for k in ("rewards", "values", "next_values", "terminated", "truncated")]
    _, returns = gae(*rest, 0.99, lam)
    np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)


def test_split_at_episode_end_changes_nothing():
    d = random_trajectory(4)
    cut = int(np.flatnonzero(d["terminated"] | d["truncated"])[0])
    whole = np.concatenate(vtrace(*d.values(), 0.99, lambda_=0.9), axis=0)
    first = vtrace(*(v[:cut + 1] for v in d.values()), 0.99, lambda_=0.9)
    second = vtrace(*(v[cut + 1:] for v in d.values()), 0.99, lambda_=0.9)
    T = len(d["rewards"])
    np.testing.assert_allclose(whole[:T], np.concatenate([first[0], second[0]]), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(whole[T:], np.concatenate([first[1], second[1]]), rtol=1e-6,
                               atol=1e-6)


def test_truncation_bootstraps_but_termination_does_not():
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    # One step, reward 1, V(s)=0, V(s')=10, gamma=0.5, on-policy.
    vs_trunc, pg_trunc = vtrace(zero, one, zero, 10 * one, [False], [True], 0.5)
    vs_term, pg_term = vtrace(zero, one, zero, 10 * one, [True], [False], 0.5)
    np.testing.assert_allclose(vs_trunc, [6.0])
    np.testing.assert_allclose(pg_trunc, [6.0])
    np.testing.assert_allclose(vs_term, [1.0])
    np.testing.assert_allclose(pg_term, [1.0])


def test_no_gradient_flows_through_outputs():
    d = random_trajectory(5, T=8)

    def total(log_rhos, values, next_values):
        vs, pg_adv = vtrace(log_rhos, d["rewards"], values, next_values, d["terminated"],
                            d["truncated"], 0.99, lambda_=0.9)
        return vs.sum() + pg_adv.sum()

    grads = jax.grad(total, argnums=(0, 1, 2))(d["log_rhos"], d["values"], d["next_values"])
    for g in grads:
        np.testing.assert_array_equal(g, 0.0)


def test_shape_mismatch_is_a_clear_error():
    d = random_trajectory(6, T=8)
    with pytest.raises(ValueError, match="log_rhos"):
        vtrace(d["log_rhos"][:-1], *list(d.values())[1:], 0.99)


def pg_advantage_mixing_reference(log_rho, r, v, v_next, terminated, truncated, gamma, lam):
    """The other convention for lambda < 1 (rlax's `vtrace_td_error_and_advantage`): inside an
    episode the policy-gradient target bootstraps from `lam * vs_{t+1} + (1 - lam) V(s_{t+1})`
    instead of `vs_{t+1}`. A plain loop, all thresholds 1."""
    vs, _ = vtrace_reference(log_rho, r, v, v_next, terminated, truncated, gamma, lam)
    rho = np.exp(np.asarray(log_rho, np.float64))
    pg_adv = np.zeros(len(r))
    for t in range(len(r)):
        if terminated[t]:
            target = r[t]
        elif truncated[t] or t == len(r) - 1:
            target = r[t] + gamma * v_next[t]
        else:
            target = r[t] + gamma * (lam * vs[t + 1] + (1 - lam) * v[t + 1])
        pg_adv[t] = min(1.0, rho[t]) * (target - v[t])
    return pg_adv


@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_policy_gradient_target_bootstraps_from_vs_for_every_lambda(lam):
    """This code's convention (`common/vtrace.py`): `vs_{t+1}` for every lambda. At lambda = 1
    it equals the mixing convention; below 1 the two differ."""
    d = random_trajectory(5)
    _, pg = vtrace(*d.values(), 0.95, lambda_=lam)
    args = [np.asarray(x) for x in d.values()]
    np.testing.assert_allclose(pg, vtrace_reference(*args, 0.95, lam)[1], rtol=1e-5, atol=1e-5)
    mixed = pg_advantage_mixing_reference(*args, 0.95, lam)
    if lam == 1.0:
        np.testing.assert_allclose(pg, mixed, rtol=1e-5, atol=1e-5)
    else:
        assert np.abs(pg - mixed).max() > 1e-2
