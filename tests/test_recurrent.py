"""Recurrent policies (`--network gru`, `--network lstm`) of all three algorithms.

The GRU and LSTM cores against NumPy loops of their equations; each algorithm's own rollout policy resets
the state at every episode start (a state leaking across an automatic reset would show) and the
update's recomputation from the state stored at the rollout's start gives the values recorded
while acting; evaluation carries the state through an episode. The `make_train` contract with a
GRU (same key, vmapped seed, chunked updates) is in `test_algorithms.py`, exact resume from the
command line in `test_checkpoint.py`, bad input in `test_bad_input.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common.envs import make_env
from common.evaluate import evaluate, record_episode
from common.nn import GRU, LSTM
from common.rollout import rollout
from helpers import ALGOS, tiny_run

# How close a core's float32 states come to the float64 loops. On a TPU v5e, even with float32
# matrix products at full precision (conftest.py), 7 steps of the cores were up to 2.6e-5 away
# from the loops (the chip's own tanh and sigmoid, most likely). A missed reset in this test's
# sequences moves the states by up to 0.44.
CLOSE = (dict(rtol=1e-5, atol=1e-6) if jax.default_backend() == "cpu"
         else dict(rtol=1e-4, atol=1e-4))


def numpy_gru(p, h, xs, firsts):
    """The GRU of Cho et al. (2014) as flax's `GRUCell` writes it, one step at a time:
        r = s(x W_ir + b_ir + h W_hr),  z = s(x W_iz + b_iz + h W_hz)
        n = tanh(x W_in + b_in + r (h W_hn + b_hn)),  h' = (1 - z) n + z h
    with h set to 0 before every step whose `first` flag is set. The kernels of the gates r, z,
    n sit side by side in `GRU`'s parameters."""
    sig = lambda a: 1.0 / (1.0 + np.exp(-a))  # noqa: E731
    q = {name: np.asarray(v, np.float64) for name, v in p["params"].items()}
    w_ir, w_iz, w_in = np.split(q["input_kernel"], 3, axis=1)
    b_ir, b_iz, b_in = np.split(q["input_bias"], 3)
    w_hr, w_hz, w_hn = np.split(q["recurrent_kernel"], 3, axis=1)
    h, out = np.asarray(h, np.float64), []
    for x, first in zip(np.asarray(xs, np.float64), np.asarray(firsts)):
        h = np.where(first[:, None], 0.0, h)
        r = sig(x @ w_ir + b_ir + h @ w_hr)
        z = sig(x @ w_iz + b_iz + h @ w_hz)
        n = np.tanh(x @ w_in + b_in + r * (h @ w_hn + q["recurrent_bias"]))
        h = (1.0 - z) * n + z * h
        out.append(h)
    return h, np.stack(out)


def numpy_lstm(p, state, xs, firsts):
    """The LSTM with a forget gate (Hochreiter & Schmidhuber 1997; Gers et al. 2000) as flax's
    `LSTMCell` writes it, one step at a time:
        i = s(x W_ii + h W_hi + b_i),  f = s(x W_if + h W_hf + b_f),
        g = tanh(x W_ig + h W_hg + b_g),  o = s(x W_io + h W_ho + b_o),
        c' = f c + i g,  h' = o tanh(c')
    with (c, h) set to 0 before every step whose `first` flag is set; the state is [c, h]."""
    sig = lambda a: 1.0 / (1.0 + np.exp(-a))  # noqa: E731
    q = {name: np.asarray(v, np.float64) for name, v in p["params"].items()}
    w_ii, w_if, w_ig, w_io = np.split(q["input_kernel"], 4, axis=1)
    w_hi, w_hf, w_hg, w_ho = np.split(q["recurrent_kernel"], 4, axis=1)
    b_i, b_f, b_g, b_o = np.split(q["bias"], 4)
    c, h = np.split(np.asarray(state, np.float64), 2, axis=1)
    out = []
    for x, first in zip(np.asarray(xs, np.float64), np.asarray(firsts)):
        c, h = np.where(first[:, None], 0.0, c), np.where(first[:, None], 0.0, h)
        i = sig(x @ w_ii + h @ w_hi + b_i)
        f = sig(x @ w_if + h @ w_hf + b_f)
        g = np.tanh(x @ w_ig + h @ w_hg + b_g)
        o = sig(x @ w_io + h @ w_ho + b_o)
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(np.concatenate([c, h], axis=1))
    return out[-1], np.stack(out)


@pytest.mark.parametrize("core,reference,gates,width_factor",
                         [(GRU, numpy_gru, 3, 1), (LSTM, numpy_lstm, 4, 2)], ids=["gru", "lstm"])
def test_core_matches_its_equations_and_resets_where_an_episode_starts(core, reference, gates,
                                                                        width_factor):
    """The core against its NumPy loop: outputs and last state, a reset that matters where an
    episode starts (for the LSTM, of both c and h) and none elsewhere, and a sequence cut in two
    continued from the state in between. The state is [N, width_factor * width]; the output its
    last `width` entries (the GRU's h; the LSTM's h, not c)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    steps, envs, features, width = 7, 3, 5, 4
    xs = jax.random.normal(keys[0], (steps, envs, features))
    state0 = jax.random.normal(keys[1], (envs, width_factor * width))
    assert core.initial_state(envs, width).shape == state0.shape
    firsts = jnp.zeros((steps, envs), bool).at[3, 0].set(True).at[5, 2].set(True)
    module = core(width)
    params = module.init(keys[2], state0, xs, firsts)
    params = jax.tree.map(  # biases away from their zero init, so that they are checked too
        lambda x: x + 0.3 * jax.random.normal(keys[3], x.shape) if x.ndim == 1 else x, params)
    for block in np.split(np.asarray(params["params"]["recurrent_kernel"]), gates, axis=1):
        np.testing.assert_allclose(block.T @ block, np.eye(width), atol=1e-5)  # orthogonal
    last, states = jax.jit(module.apply)(params, state0, xs, firsts)
    want_last, want = reference(params, state0, xs, firsts)
    np.testing.assert_allclose(states, want, **CLOSE)
    np.testing.assert_allclose(last, want_last, **CLOSE)
    np.testing.assert_array_equal(core.output(states), states[..., -width:])
    # the reset matters: without it, environment 0 from step 3 on is another sequence
    _, leaked = reference(params, state0, xs, jnp.zeros_like(firsts))
    assert np.abs(leaked[3:, 0] - want[3:, 0]).min() > 1e-4
    np.testing.assert_allclose(leaked[:, 1], want[:, 1], rtol=1e-5, atol=1e-6)  # no reset in 1
    # a sequence cut in two and continued from the state in between is the same sequence
    mid, first_half = module.apply(params, state0, xs[:4], firsts[:4])
    _, second_half = module.apply(params, mid, xs[4:], firsts[4:])
    np.testing.assert_allclose(jnp.concatenate([first_half, second_half]), states,
                               **(dict(rtol=1e-6, atol=1e-7) if jax.default_backend() == "cpu"
                                  else CLOSE))  # other programs: the chip may fuse otherwise


@pytest.mark.parametrize("core", ["gru", "lstm"])
@pytest.mark.parametrize("algo", ALGOS)
def test_each_policy_resets_at_episode_starts_and_the_update_recomputes_what_it_saw(algo, core):
    """The algorithm's own rollout policy on velocity-hidden CartPole, 64 steps (many automatic
    resets): at every step that starts an episode the core's state is the one from a zero
    state, not the one continuing the previous episode's state; and the whole rollout
    recomputed from the state stored at its start (as the update does) gives the states
    recorded while acting."""
    run = tiny_run(algo, core)
    env, env_params, spec = make_env(run.config.env_id)
    state = run.init(run.keys[0], run.hp)
    network = run.module.ActorCritic(spec, run.config.hidden_size, run.config.activation,
                                     False, core)
    policy = run.train.policy(state.params, state.obs_stats)

    def recording(key, obs, first, hidden):  # the algorithm's policy, its new state recorded
        action, info, hidden = policy(key, obs, first, hidden)
        return action, (info, hidden), hidden

    _, traj = jax.jit(lambda e, k: rollout(env, env_params, spec, recording, e, k, 64))(
        state.env, jax.random.PRNGKey(1))
    info, memory = traj.policy_info
    starts = np.argwhere(np.asarray(traj.first[1:])) + [1, 0]  # automatic resets only
    assert len(starts) >= 4

    apply = jax.jit(network.apply)
    fresh = apply(state.params, traj.obs, jnp.zeros_like(state.env.hidden),
                  jnp.ones_like(traj.first))[2]          # every step from a zero state
    steps, envs, width = memory.shape  # every step continuing the previous one (one step each)
    carried = apply(state.params, traj.obs[1:].reshape(1, (steps - 1) * envs, -1),
                    memory[:-1].reshape(-1, width), jnp.zeros((1, (steps - 1) * envs), bool))[2]
    carried = carried.reshape(steps - 1, envs, width)
    for t, n in starts:
        np.testing.assert_allclose(memory[t, n], fresh[t, n], rtol=1e-5, atol=1e-6)
        assert np.abs(memory[t, n] - carried[t - 1, n]).max() > 1e-3, "a reset changes nothing"

    pi, value, recomputed = apply(state.params, traj.obs, state.env.hidden, traj.first)
    np.testing.assert_allclose(recomputed, memory, rtol=1e-5, atol=1e-6)
    # What the policy recorded for the learner (`PolicyInfo`: PPO's old values and
    # log-probabilities, A2C's values, IMPALA's log mu(a|s)) is what the recomputation gives.
    recorded = {"value": value, "log_prob": pi.log_prob(traj.action)}
    assert {"value", "log_prob"} & set(info._fields), info._fields
    for name in set(recorded) & set(info._fields):
        np.testing.assert_allclose(recorded[name], getattr(info, name), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("algo,core", [("ppo", "gru"), ("impala", "gru"), ("impala", "lstm")])
def test_with_a_zero_learning_rate_the_learner_sees_the_policy_that_acted(algo, core):
    """No step changes the parameters, so the learner's recomputed policy over every minibatch
    of whole sequences must be the one that acted: KL(acting || learner) = 0 in every update
    (a recurrent state not reset, or not recomputed from the stored start, would show here).
    All the run's updates in one call: the program `test_algorithms.py` compiles too."""
    run = tiny_run(algo, core)
    frozen = run.hp._replace(learning_rate=jnp.float32(0))
    state = run.init(run.keys[0], frozen)
    sharper = {f: jax.tree.map(lambda x: 4.0 * x, getattr(state, f))  # far from uniform: a
               for f in ("params", "past_params") if hasattr(state, f)}  # mistake would show
    _, metrics = run.run_updates(state._replace(**sharper), frozen,
                                 jnp.arange(run.config.num_updates))
    assert np.abs(np.asarray(metrics["approx_kl"])).max() < 1e-6
    if algo == "ppo":
        np.testing.assert_array_equal(metrics["clipfrac"], 0.0)
    else:
        np.testing.assert_allclose(metrics["mean_clipped_rho"], 1.0, atol=1e-5)


def test_evaluate_and_record_episode_carry_the_policy_state_between_steps():
    """A policy whose memory counts the steps since the episode's start and pushes left,
    right, left, ... balances CartPole for 22-58 steps; reset at every step (its memory not
    carried, or `first` wrongly set) it pushes one way and falls within 8-11."""
    env, env_params, spec = make_env("CartPole-v1")

    def alternate(obs, first, hidden):
        hidden = jnp.where(first[:, None], 0.0, hidden) + 1.0
        return (hidden[:, 0] % 2).astype(jnp.int32), hidden

    _, lengths = jax.jit(lambda k: evaluate(alternate, env, env_params, spec, k, 16,
                                            hidden=jnp.zeros((16, 1))))(jax.random.PRNGKey(3))
    assert lengths.min() >= 20, lengths
    _, _, done = jax.jit(lambda k: record_episode(alternate, env, env_params, spec, k,
                                                  hidden=jnp.zeros((1, 1))))(jax.random.PRNGKey(3))
    assert np.argmax(done) + 1 >= 20, np.argmax(done) + 1


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_evaluation_carries_the_state_through_the_episode(core):
    run = tiny_run("ppo", core)
    env, env_params, spec = make_env(run.config.env_id)
    state = run.init(run.keys[0], run.hp)
    obs = jax.random.normal(jax.random.PRNGKey(2), (5, 3, 2))
    first = jnp.zeros((5, 3), bool).at[0].set(True)
    # act step by step == the network over the whole sequence
    hidden, actions, act = run.train.initial_hidden(3), [], jax.jit(run.train.act)
    for t in range(5):
        action, hidden = act(state, obs[t], first[t], hidden)
        actions.append(action)
    network = run.module.ActorCritic(spec, run.config.hidden_size, run.config.activation,
                                     False, core)
    pi, _, memory = network.apply(state.params, obs, run.train.initial_hidden(3), first)
    np.testing.assert_array_equal(np.stack(actions), pi.mode())
    np.testing.assert_allclose(hidden, memory[-1], rtol=1e-6)

    returns, lengths = jax.jit(lambda k: evaluate(
        lambda o, f, h: run.train.act(state, o, f, h), env, env_params, spec, k, 6,
        hidden=run.train.initial_hidden(6)))(jax.random.PRNGKey(3))
    np.testing.assert_array_equal(returns, lengths)  # whole CartPole episodes, 1 per step
    assert (lengths >= 8).all()
    _, rewards, done = jax.jit(lambda k: record_episode(
        lambda o, f, h: run.train.act(state, o, f, h), env, env_params, spec, k,
        hidden=run.train.initial_hidden(1)))(jax.random.PRNGKey(3))
    assert np.asarray(done).any() and np.isfinite(rewards).all()
