"""`common/pbt.py`: population-based training in one program.

Two training programs: PPO's tiny CartPole run (`helpers.TINY_RUNS`) as a PBT population with
exploitation on, whole and in two chunks of intervals; IMPALA's with exploitation and
perturbation off, which must be the plain `jit(vmap(train))` run bit for bit. The step itself
is checked on their trained states (the copy, field by field, IMPALA's `past_params`
included) and, for the distributions, on a small stand-in state in one jitted, vmapped call
over many keys. Bad input: each `ValueError`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from common import pbt
from common.pbt import Range, SearchSpace
from helpers import tiny_run

KEY = jax.random.PRNGKey(7)
PPO_SPACE = SearchSpace((Range("learning_rate", 1e-4, 1e-2, log=True),
                         Range("ent_coef", 0.0, 0.02)), population=4, interval=4)
"""PPO's tiny run has 16 updates: 4 intervals of 4, one member of 4 replaced per step."""
IMPALA_OFF = SearchSpace((Range("learning_rate", 1e-3, 3e-2, log=True),
                          Range("rho_bar", 0.5, 1.5)), population=3, interval=3,
                         perturb=0.0, exploit=False)
"""IMPALA's 6 updates, 2 intervals; no copy, no perturbation: 3 independent runs."""


def equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def member(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def ranked(scores) -> list:
    """The members best first, from the rule's words: numbers before NaN, higher first, ties
    the lower index first."""
    return sorted(range(len(scores)), key=lambda i: (np.isnan(scores[i]), -scores[i], i))


def assert_step_copies(before, after, source, replaced):
    """Replaced member i holds `before[source[i]]` in every field but env and key, which are
    its own; every other member is `before[i]` bit for bit."""
    for i in range(len(source)):
        for field in before._fields:
            own = field in ("env", "key") or not replaced[i]
            equal(member(getattr(after, field), i),
                  member(getattr(before, field), i if own else source[i]))


# --------------------------------------------------------------------------------------------
# PPO with exploitation: whole, chunked, the lineage, the copy on trained states
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ppo():
    tiny = tiny_run("ppo")
    pbt_train = pbt.make_pbt_train(tiny.train, tiny.config.num_updates, PPO_SPACE)
    whole = jax.jit(pbt_train)  # hparams=None: the config's values as the base
    run = jax.jit(pbt_train.run_intervals)
    start = jax.jit(pbt_train.init)(KEY)
    middle, *first = run(start, jnp.array([0, 1]))
    end, *second = run(middle, jnp.array([2, 3]))
    # NumPy from here on: slicing JAX arrays outside jit would compile a program per shape
    return dict(tiny=tiny, middle=middle, **jax.device_get(dict(
        whole=whole(KEY), again=whole(KEY), start=start, end=end, chunks=(first, second))))


def test_pbt_train_is_init_then_its_intervals_in_chunks_and_same_key_same_population(ppo):
    states, metrics, lineage = ppo["whole"]
    equal(ppo["again"], ppo["whole"])
    equal(states, ppo["end"].states)
    (m1, l1), (m2, l2) = ppo["chunks"]
    equal(metrics, jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), m1, m2))
    equal(lineage, jax.tree.map(lambda a, b: np.concatenate([a, b]), l1, l2))
    assert metrics["episodic_return"].shape == (4, ppo["tiny"].config.num_updates)


def test_lineage_the_bottom_member_copies_the_best_and_lr_schedules_carry_on(ppo):
    _, metrics, lineage = ppo["whole"]
    hp0, base, n = ppo["start"].hparams, ppo["tiny"].hp, ppo["tiny"].config.num_updates
    # None took the config's values as the base: unsearched fields are the config's
    for name in set(base._fields) - {"learning_rate", "ent_coef"}:
        np.testing.assert_array_equal(getattr(hp0, name), np.full(4, getattr(base, name)))
    assert len(set(np.asarray(hp0.learning_rate).tolist())) == 4  # drawn per member
    members = np.arange(4)
    previous = hp0
    for k in range(4):
        score, source = np.asarray(lineage.score[k]), np.asarray(lineage.source[k])
        np.testing.assert_allclose(score, np.nanmean(metrics["episodic_return"]
                                                     [:, 4 * k:4 * k + 4], axis=1), rtol=1e-6)
        replaced = source != members
        if k == 3:  # no step after the last interval
            assert not replaced.any()
            equal(member(lineage.hparams, k), previous)
        else:  # one of 4: the worst member (NaN: lowest) takes the best one's state
            order = ranked(score)
            np.testing.assert_array_equal(source, np.where(members == order[-1], order[0],
                                                           members))
        for name, r in (("learning_rate", PPO_SPACE.ranges[0]), ("ent_coef",
                                                                 PPO_SPACE.ranges[1])):
            new, old = np.asarray(getattr(lineage.hparams, name)[k]), np.asarray(
                getattr(previous, name))
            np.testing.assert_array_equal(new[~replaced], old[~replaced])
            ratio = new[replaced] / old[source[replaced]]
            at_bound = np.isin(new[replaced], np.float32([r.low, r.high]))
            assert ((np.abs(ratio - 1) <= 0.2 + 1e-6) | at_bound).all(), (name, ratio)
        # the annealed rate of update u is the member's base rate * (1 - u / n), whatever
        # it was copied from: the update count is the population's, not the optimiser's
        updates = 4 * k + np.arange(4)
        np.testing.assert_allclose(
            metrics["learning_rate"][:, updates],
            np.asarray(previous.learning_rate)[:, None] * (1 - updates / n), rtol=1e-6)
        previous = member(lineage.hparams, k)


def test_the_copy_is_exact_and_env_and_key_stay_the_members_own(ppo):
    """On PPO's trained states (after two intervals): the worst member (a NaN score) takes
    the best one's parameters and optimiser state bit for bit; env and key stay its own."""
    step = jax.jit(pbt.exploit_and_explore, static_argnames="space")
    scores = jnp.array([1.0, jnp.nan, 3.0, 2.0])
    after, new_hparams, source = jax.device_get(step(
        KEY, ppo["middle"].states, ppo["middle"].hparams, scores, space=PPO_SPACE))
    before, hparams = jax.device_get((ppo["middle"].states, ppo["middle"].hparams))
    np.testing.assert_array_equal(source, [0, 2, 2, 3])
    replaced = np.array([False, True, False, False])
    assert_step_copies(before, after, source, replaced)
    # the members differ where it matters, so a copy from the wrong member shows
    for field in ("params", "opt_state", "env", "key"):
        leaves = jax.tree.leaves(getattr(before, field))
        assert any(not np.array_equal(x[1], x[2]) for x in leaves), field
    np.testing.assert_array_equal(new_hparams.vf_coef, hparams.vf_coef)
    assert new_hparams.learning_rate[1] != hparams.learning_rate[2]  # perturbed


# --------------------------------------------------------------------------------------------
# IMPALA, nothing exploited or perturbed: the plain vmapped run; its past_params copied
# --------------------------------------------------------------------------------------------
def test_impala_without_exploitation_is_the_plain_vmapped_run_and_copies_past_params():
    tiny = tiny_run("impala")
    pbt_train = pbt.make_pbt_train(tiny.train, tiny.config.num_updates, IMPALA_OFF)
    result = jax.jit(pbt_train)(KEY)
    keys, _, _ = pbt.population_keys(KEY, 3)
    hparams = jax.tree.map(lambda x: x[0], result[2].hparams)  # drawn once, then unchanged
    plain = tiny.batched(keys, hparams)
    states, metrics, lineage = result = jax.device_get(result)
    equal(member(lineage.hparams, 1), member(lineage.hparams, 0))
    np.testing.assert_array_equal(lineage.source, [[0, 1, 2]] * 2)
    assert len(set(lineage.hparams.rho_bar[0].tolist())) == 3
    equal(result[:2], jax.device_get(plain))

    # the step on IMPALA's trained states copies the actors' lagged parameters too
    space = SearchSpace(IMPALA_OFF.ranges, population=3, interval=3)
    after, _, source = jax.device_get(jax.jit(pbt.exploit_and_explore, static_argnames="space")(
        KEY, plain[0], hparams, jnp.array([jnp.nan, 2.0, 1.0]), space=space))
    np.testing.assert_array_equal(source, [1, 1, 2])
    assert_step_copies(states, after, source, np.array([True, False, False]))
    lagged = jax.tree.leaves(states.past_params)
    assert any(not np.array_equal(x[0], x[1]) for x in lagged)


# --------------------------------------------------------------------------------------------
# The rule's distributions and ranking, on a stand-in state, one jitted vmapped call
# --------------------------------------------------------------------------------------------
class HP(NamedTuple):
    lin: jax.Array
    log: jax.Array
    fixed: jax.Array


class State(NamedTuple):
    params: jax.Array
    opt_state: jax.Array
    env: jax.Array
    key: jax.Array


RANGES = (Range("lin", 0.1, 10.0), Range("log", 1e-3, 10.0, log=True))
P, DRAWS = 8, 4000
STATE = State(np.arange(P * 3.0).reshape(P, 3), -np.arange(P * 1.0), np.arange(P),
              np.arange(P) + 100)
SCORES = np.array([[3.0, np.nan, 5.0, 5.0, 1.0, 1.0, 7.0, 3.0],       # ties at both ends
                   [3.0, np.nan, 5.0, 4.0, 1.0, -np.inf, 7.0, 3.0]])  # NaN below -inf
BOTTOM = [{1, 5}, {1, 5}]  # 4 and 5 tie at 1.0: the lower index ranks higher
TOP = [{6, 2}, {6, 2}]  # 2 and 3 tie at 5.0


@pytest.fixture(scope="module")
def draws():
    """Many PBT steps (P = 8, 2 replaced) over many keys, and a large initial population,
    in one program: perturbation only, resampling always, resampling with p = 0.3, and
    exploration without exploitation."""
    hparams = HP(np.full(P, 1.0, np.float32), np.full(P, 0.05, np.float32),
                 np.full(P, 0.5, np.float32))
    spaces = [SearchSpace(RANGES, population=P, interval=1, resample=p)
              for p in (0.0, 1.0, 0.3)] + [SearchSpace(RANGES, P, 1, exploit=False)]

    def step(key, scores, space):
        return pbt.exploit_and_explore(key, STATE, hparams, scores, space)

    @jax.jit
    def all_draws(key):
        keys = jax.random.split(key, DRAWS)
        over_keys = lambda space, scores: jax.vmap(  # noqa: E731
            lambda k: step(k, scores, space))(keys)
        return ([over_keys(spaces[0], s) for s in SCORES],
                [over_keys(s, SCORES[0]) for s in spaces[1:]],
                pbt.initial_hparams(keys[0], HP(1.0, 1.0, 0.5), spaces[0], DRAWS))

    return jax.device_get(all_draws(KEY))


def test_ranking_replaces_the_bottom_from_the_top_only_and_uniformly(draws):
    for (states, hparams, source), scores, bottom, top in zip(draws[0], SCORES, BOTTOM, TOP):
        assert set(ranked(scores)[-2:]) == bottom and set(ranked(scores)[:2]) == top
        source = np.asarray(source)
        replaced = source != np.arange(P)
        # the same members every time (ties and NaN decided by rank, not by the key)
        assert (replaced == np.isin(np.arange(P), list(bottom))).all()
        assert set(source[replaced].tolist()) == top
        counts = np.bincount(source[replaced], minlength=P)[sorted(top)]
        assert stats.chisquare(counts).pvalue > 1e-3, counts
        np.testing.assert_array_equal(hparams.fixed, 0.5)  # unsearched: the source's
        np.testing.assert_array_equal(states.params, STATE.params[source])
        np.testing.assert_array_equal(states.opt_state, STATE.opt_state[source])
        np.testing.assert_array_equal(states.env, np.broadcast_to(STATE.env, source.shape))
        np.testing.assert_array_equal(states.key, np.broadcast_to(STATE.key, source.shape))


def test_perturbation_and_resampling_follow_the_rule(draws):
    (_, hparams, source), = draws[0][:1]
    replaced = np.asarray(source) != np.arange(P)
    # perturbed: (new / old - 1) / f ~ U(-1, 1), each hyperparameter on its own draw
    lin = (np.asarray(hparams.lin)[replaced] / 1.0 - 1) / 0.2
    log = (np.asarray(hparams.log)[replaced] / 0.05 - 1) / 0.2
    for u in (lin, log):
        assert stats.kstest(u, stats.uniform(-1, 2).cdf).pvalue > 1e-3
    assert abs(np.corrcoef(lin, log)[0, 1]) < 0.05
    np.testing.assert_array_equal(np.asarray(hparams.lin)[~replaced], 1.0)
    # resampled (p = 1): uniform on [0.1, 10], log-uniform on [1e-3, 10]
    _, always, source = draws[1][0]
    replaced = np.asarray(source) != np.arange(P)
    assert stats.kstest(np.asarray(always.lin)[replaced], stats.uniform(0.1, 9.9).cdf
                        ).pvalue > 1e-3
    assert stats.kstest(np.asarray(always.log)[replaced], stats.loguniform(1e-3, 10).cdf
                        ).pvalue > 1e-3
    # p = 0.3: values outside [0.8, 1.2] * old are redraws, 0.3 * P(draw outside) of them
    _, sometimes, source = draws[1][1]
    replaced = np.asarray(source) != np.arange(P)
    values = np.asarray(sometimes.lin)[replaced]
    outside = np.mean((values < 0.8) | (values > 1.2))
    expected = 0.3 * (1 - 0.4 / 9.9)
    assert abs(outside - expected) < 4 * np.sqrt(expected * (1 - expected) / values.size)
    # exploration alone: nobody copied, the bottom members perturb their own values
    states, alone, source = draws[1][2]
    np.testing.assert_array_equal(source, np.broadcast_to(np.arange(P), source.shape))
    equal(states, jax.tree.map(lambda x: np.broadcast_to(x, source.shape + x.shape[1:]), STATE))
    bottom = np.isin(np.arange(P), list(BOTTOM[0]))
    assert (np.abs(alone.lin[:, bottom] - 1) <= 0.2 + 1e-6).all()
    assert (alone.lin[:, bottom] != 1).mean() > 0.99 and (alone.lin[:, ~bottom] == 1).all()
    # the initial population: log-uniform, uniform, the base value elsewhere
    initial = draws[2]
    assert stats.kstest(np.asarray(initial.log), stats.loguniform(1e-3, 10).cdf).pvalue > 1e-3
    assert stats.kstest(np.asarray(initial.lin), stats.uniform(0.1, 9.9).cdf).pvalue > 1e-3
    np.testing.assert_array_equal(initial.fixed, np.full(DRAWS, 0.5, np.float32))
    for r in RANGES:
        values = np.concatenate([np.ravel(getattr(h, r.name)) for _, h, _ in
                                 draws[0] + draws[1]] + [np.asarray(getattr(initial, r.name))])
        assert (values >= np.float32(r.low)).all() and (values <= np.float32(r.high)).all()


def test_perturbed_values_are_clipped_into_their_range():
    low, high = np.full(4000, 0.1, np.float32), np.full(4000, 10.0, np.float32)
    explore = jax.jit(pbt.explore, static_argnames=("r", "perturb", "resample"))
    clipped_low = explore(KEY, low, r=RANGES[0], perturb=0.5, resample=0.0)
    clipped_high = explore(KEY, high, r=RANGES[0], perturb=0.5, resample=0.0)
    assert np.isclose(np.mean(clipped_low == np.float32(0.1)), 0.5, atol=0.05)
    assert np.isclose(np.mean(clipped_high == np.float32(10.0)), 0.5, atol=0.05)
    assert clipped_low.min() >= np.float32(0.1) and clipped_high.max() <= np.float32(10.0)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
GOOD = dict(ranges=(Range("learning_rate", 1e-4, 1e-2, log=True),), population=4, interval=4)


@pytest.mark.parametrize("change, message", [
    (dict(ranges=(Range("learning_rate", 1e-2, 1e-4),)), r"low 0.01 > high 0.0001"),
    (dict(ranges=(Range("ent_coef", 0.0, 0.1, log=True),)), r"log-scaled range needs low > 0"),
    (dict(ranges=(Range("ent_coef", 0.0, float("inf")),)), r"high must be a finite number"),
    (dict(ranges=(Range("ent_coef", 0, 1), Range("ent_coef", 0, 2))), r"names 'ent_coef' 2"),
    (dict(ranges={"learning_rate": (1e-4, 1e-2)}), r"tuple of pbt.Range"),
    (dict(population=1), r"population must be an integer >= 2"),
    (dict(interval=0), r"interval must be a positive integer"),
    (dict(fraction=0.6), r"fraction must be in \(0, 0.5\]"),
    (dict(fraction=0.0), r"fraction must be in \(0, 0.5\]"),
    (dict(perturb=1.0), r"perturb must be in \[0, 1\)"),
    (dict(resample=1.5), r"resample must be a probability in \[0, 1\]"),
    (dict(exploit="no"), r"exploit must be True or False"),
])
def test_a_bad_space_is_refused_in_plain_python(change, message):
    with pytest.raises(ValueError, match=message):
        SearchSpace(**{**GOOD, **change})


def test_names_interval_and_shapes_are_checked_before_anything_compiles():
    tiny = tiny_run("ppo")
    with pytest.raises(ValueError, match=r"'lr', which is not .* use one of learning_rate, "
                                         r"opt_eps, gamma"):
        pbt.make_pbt_train(tiny.train, 16, SearchSpace(**{**GOOD, "ranges": (
            Range("lr", 1e-4, 1e-2),)}))
    with pytest.raises(ValueError, match=r"interval 5 does not divide the run's 16 updates"):
        pbt.make_pbt_train(tiny.train, 16, SearchSpace(**{**GOOD, "interval": 5}))
    space = SearchSpace(**GOOD)
    with pytest.raises(ValueError, match=r"field `gamma` has shape \(2,\), expected a scalar"):
        pbt.initial_hparams(KEY, tiny.hp._replace(gamma=jnp.ones(2)), space)
    state = State(*[jnp.zeros(4)] * 4)
    hp = HP(*[jnp.ones(4)] * 3)
    with pytest.raises(ValueError, match=r"`scores` has shape \(3,\), expected \[4\]"):
        pbt.exploit_and_explore(KEY, state, hp, jnp.zeros(3), SearchSpace(
            (Range("lin", 0.1, 1.0),), population=4, interval=1))
    with pytest.raises(ValueError, match=r"`states.params` has shape \(3,\), expected \[4, "):
        pbt.exploit_and_explore(KEY, state._replace(params=jnp.zeros(3)), hp, jnp.zeros(4),
                                SearchSpace((Range("lin", 0.1, 1.0),), population=4,
                                            interval=1))
