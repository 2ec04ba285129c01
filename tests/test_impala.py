"""`algos/impala.py`: the policy lag, jit + vmap, determinism, sweeps, learning, the CLI."""

import dataclasses
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos.impala import Config, make_train
from common.host.logger import final_return

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One small config serves the lag, shape, determinism and sweep tests.
LAG = 2
TINY = Config(env_id="CartPole-v1", total_timesteps=4 * 16 * 6, num_envs=4, num_steps=16,
              actor_lag=LAG)
METRICS = {"global_step", "episodic_return", "episodic_length", "learning_rate", "value_loss",
           "policy_loss", "entropy", "approx_kl", "explained_variance", "mean_clipped_rho",
           "rho_clip_fraction"}


def assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def kernel(params):
    return params["params"]["Dense_0"]["kernel"]


@pytest.fixture(scope="module")
def tiny():
    """The tiny config's train, a compiled single run, and a compiled 3-seed vmapped run."""
    train = make_train(TINY)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    single = jax.jit(train)
    batched = jax.jit(jax.vmap(train))
    return train, keys, single, batched, batched(keys)


def test_actors_use_the_learners_parameters_from_actor_lag_updates_ago(tiny):
    train, keys, single, _, _ = tiny
    run_updates = jax.jit(train.run_updates)
    state = train.init(keys[0])
    history = [state.params]  # history[j]: the learner's parameters before update j
    rows = []
    for k in range(5):
        # Before update k the queue holds the parameters of updates k - LAG, ..., k - 1.
        for i in range(LAG):
            expected = history[max(0, k - LAG + i)]
            assert_trees_equal(jax.tree.map(lambda x: x[i], state.past_params), expected)
        state, metrics = run_updates(state, None, jnp.array([k]))
        history.append(state.params)
        rows.append(metrics)
    assert not np.array_equal(kernel(history[-1]), kernel(history[-1 - LAG]))
    # Update by update, in separate calls, is the same run as one call.
    _, whole = single(keys[0])
    for name in METRICS:
        np.testing.assert_array_equal(np.concatenate([r[name] for r in rows]),
                                      whole[name][:5], err_msg=name)

    # The actors act with past_params[0] and nothing else: make that slot the learner's own
    # parameters and the data are exactly on-policy at the learner's first (and only) step.
    # The other slot stays stale, so acting with it would show as a non-zero KL.
    def first_step_metrics(past_params):
        _, metrics = run_updates(state._replace(past_params=past_params), None, jnp.array([5]))
        return metrics

    lagged = first_step_metrics(state.past_params)
    assert lagged["approx_kl"][0] > 1e-6, lagged["approx_kl"]
    synced = first_step_metrics(jax.tree.map(lambda q, p: q.at[0].set(p), state.past_params,
                                             state.params))
    # Exactly 0 and 1 on CPU; the tolerance leaves room for other backends' rounding.
    assert abs(synced["approx_kl"][0]) < 1e-9, synced["approx_kl"]
    np.testing.assert_allclose(synced["mean_clipped_rho"], 1.0, atol=1e-6)


def test_metrics_have_one_row_per_update_and_are_finite(tiny):
    _, _, _, _, (state, metrics) = tiny
    assert set(metrics) == METRICS
    for name, value in metrics.items():
        assert value.shape == (3, TINY.num_updates), name
        if name not in ("episodic_return", "episodic_length"):  # NaN: no episode finished
            assert np.isfinite(value).all(), name
    assert np.isfinite(metrics["episodic_return"]).mean() > 0.5
    np.testing.assert_array_equal(metrics["global_step"][0],
                                  TINY.batch_size * np.arange(1, TINY.num_updates + 1))
    assert metrics["learning_rate"][0, -1] < metrics["learning_rate"][0, 0]  # annealed
    assert (metrics["rho_clip_fraction"] <= 1).all() and (metrics["mean_clipped_rho"] <= 1).all()
    assert kernel(state.past_params).shape == (3, LAG) + kernel(state.params).shape[1:]


def test_same_key_same_result_and_vmapped_seed_equals_single_run(tiny):
    _, keys, single, batched, (_, metrics) = tiny
    _, again = batched(keys)
    for name in METRICS:
        np.testing.assert_array_equal(again[name], metrics[name], err_msg=name)
    _, alone = single(keys[2])
    for name in METRICS:
        np.testing.assert_allclose(alone[name], metrics[name][2], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_swept_hyperparameters_equal_the_same_run_made_alone(tiny):
    train, keys, single, _, _ = tiny
    changed = dict(learning_rate=2e-2, rho_bar=0.5, c_bar=0.7, ent_coef=0.05)
    hps = jax.tree.map(lambda a, b: jnp.stack([a, b]), TINY.hparams(),
                       TINY.hparams()._replace(**{k: jnp.float32(v) for k, v in changed.items()}))
    _, swept = jax.jit(jax.vmap(train))(keys[:2], hps)
    _, alone0 = single(keys[0])
    _, alone1 = jax.jit(make_train(dataclasses.replace(TINY, **changed)))(keys[1])
    for name in ("episodic_return", "value_loss", "mean_clipped_rho", "learning_rate"):
        np.testing.assert_allclose(alone0[name], swept[name][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(alone1[name], swept[name][1], rtol=1e-5, atol=1e-6)
    assert (swept["mean_clipped_rho"][1] <= 0.5).all()


def test_other_branches_run():
    """Continuous actions, observation normalisation, no lag, minibatches and epochs, Adam,
    the KL penalty and the uncorrected ablation, in one compile."""
    config = Config(env_id="Pendulum-v1", total_timesteps=8 * 8 * 3, num_envs=8, num_steps=8,
                    actor_lag=0, normalize_obs=True, num_minibatches=2, update_epochs=2,
                    optimizer="adam", kl_coef=0.1, vtrace=False, anneal_lr=False)
    state, metrics = jax.jit(make_train(config))(jax.random.PRNGKey(0))
    assert jax.tree.leaves(state.past_params)[0].shape[0] == 0
    for name in METRICS - {"episodic_return", "episodic_length"}:
        assert metrics[name].shape == (3,) and np.isfinite(metrics[name]).all(), name
    assert float(state.obs_stats.count) > 1.0
    np.testing.assert_allclose(metrics["learning_rate"], config.learning_rate)


def test_live_progress_prints_from_inside_jit_under_vmap(capfd):
    train = make_train(TINY, live_progress=True)
    jax.block_until_ready(jax.jit(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(0), 2)))
    train.progress.close()
    out = capfd.readouterr().out
    assert f"[impala CartPole-v1] step {TINY.num_updates * TINY.batch_size:>12,}" in out, out


def test_learns_cartpole_with_lagged_actors():
    # Default hyperparameters (actor_lag = 1), 2 seeds, 2e5 steps: returns start near 20.
    config = Config(env_id="CartPole-v1", total_timesteps=200_000)
    assert config.actor_lag >= 1
    _, metrics = jax.jit(jax.vmap(make_train(config)))(jax.random.split(jax.random.PRNGKey(0), 2))
    first = np.nanmean(metrics["episodic_return"][:, :5])
    final = final_return(metrics["episodic_return"])
    assert first < 40, first
    assert final.min() > 200, final


@pytest.mark.parametrize("field,value,message", [
    ("actor_lag", -1, "--actor-lag must be >= 0"),
    ("num_minibatches", 3, "--num-envs 32 is not divisible by --num-minibatches 3"),
    ("rho_bar", 0.0, "--rho-bar must be > 0"),
    ("optimizer", "sgd", "--optimizer must be one of 'rmsprop', 'adam', got 'sgd'"),
])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value})


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "algos/impala.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_cli_trains_logs_and_summarises(tmp_path):
    result = run_cli("--total-timesteps", "1280", "--num-envs", "4", "--num-steps", "16",
                     "--num-seeds", "2", "--log-dir", str(tmp_path), "--exp-name", "smoke",
                     "--eval-every", "10",
                     env={"ONPOLICY_JAX_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: IMPALA on CartPole-v1, 2 run(s)" in result.stdout
    runs = sorted(d for d in os.listdir(tmp_path) if d.startswith("CartPole-v1__smoke__"))
    assert [r.split("__")[2] for r in runs] == ["1", "2"], runs
    for run in runs:
        assert glob.glob(str(tmp_path / run / "events.out.tfevents.*"))


def test_cli_bad_input_is_one_line_without_traceback():
    result = run_cli("--actor-lag", "-1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "error: --actor-lag must be >= 0, got -1."


# --------------------------------------------------------------------------------------------
# The loss by hand
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("correction", [True, False])
def test_impala_loss_matches_a_hand_computation_with_clipped_and_unclipped_ratios(correction):
    """Two trajectories of three steps: rho = 2 (clipped to rho_bar = 1 and pg_rho_bar = 1) and
    0.5 (not clipped), a termination and a truncation; V-Trace from the NumPy loop of
    `tests/test_vtrace.py`, the loss written out, and its gradients: -A/n for log pi (A and vs
    are targets) and vf_coef (V - vs)/n for V."""
    from test_vtrace import vtrace_reference

    from algos.impala import Transition, impala_loss

    gamma, ent_coef, vf_coef, kl_coef = 0.9, 0.01, 0.5, 0.1
    log_prob = np.array([[-0.2, -1.0], [-1.5, -0.3], [-0.7, -0.9]])  # [T, B]
    rho = np.array([[2.0, 0.5], [0.5, 2.0], [1.0, 0.8]])
    behaviour = log_prob - np.log(rho)
    r = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]])
    v = np.array([[0.5, 0.1], [0.2, 0.4], [1.0, -0.2]])
    v_tp1 = np.array([[0.2, 0.4], [1.0, 3.0], [0.7, 0.3]])
    terminated = np.array([[False, False], [False, False], [True, False]])
    truncated = np.array([[False, False], [False, True], [False, False]])
    entropy = np.array([[0.6, 0.5], [0.4, 0.3], [0.2, 0.1]])
    log_rho = np.log(rho) if correction else np.zeros_like(rho)
    vs, adv = np.stack([np.stack(vtrace_reference(
        log_rho[:, b], r[:, b], v[:, b], v_tp1[:, b], terminated[:, b], truncated[:, b], gamma))
        for b in range(2)], axis=-1)
    n = r.size
    k3 = rho - 1 - np.log(rho)
    expected = dict(policy_loss=-np.sum(adv * log_prob) / n,
                    value_loss=0.5 * np.sum((vs - v) ** 2) / n, entropy=entropy.mean(),
                    approx_kl=k3.mean(), explained_variance=1 - np.var(vs - v) / np.var(vs),
                    mean_clipped_rho=np.minimum(1.0, rho).mean(),
                    rho_clip_fraction=np.mean(rho > 1.0))
    loss_expected = expected["policy_loss"] + vf_coef * expected["value_loss"] \
        - ent_coef * expected["entropy"] + kl_coef * expected["approx_kl"]

    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    batch = Transition(f32(np.zeros((3, 2, 4))), jnp.zeros((3, 2), jnp.int32), f32(r),
                       jnp.asarray(terminated), jnp.asarray(truncated),
                       f32(np.zeros((3, 2, 4))), f32(behaviour))
    hp = Config(gamma=gamma, ent_coef=ent_coef, vf_coef=vf_coef, kl_coef=kl_coef).hparams()
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
