"""The samplers' sort-free paths: top_p's histogram cut and the block-wise inverse CDF of the pick.

Each is checked against the slow, obvious algorithm it replaces (transformers' sort for top_p, one float64
cumulative sum over the row for the pick) on the rows where a shortcut would go wrong: flat rows whose nucleus is
most of the vocabulary, ties at the cut, cuts that land exactly on 1 - p, rows with banned tokens.
"""

import numpy as np
import pytest
import torch
from edgelm.runtime import sampling
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling import nucleus
from edgelm.runtime.sampling.draw import REJECTION_TRIES
from transformers.generation import logits_process as hf

V = 50_257


def transformers_top_p(logits, p, min_tokens_to_keep=1, stable=False):
    """transformers' TopPLogitsWarper; stable=True: with a stable sort, the order our cut follows among ties."""
    sort = torch.sort
    if stable:
        torch.sort = lambda *args, **kwargs: sort(*args, **kwargs, stable=True)
    try:
        warper = hf.TopPLogitsWarper(p, min_tokens_to_keep=min_tokens_to_keep)
        return warper(torch.zeros((logits.shape[0], 1), dtype=torch.long), torch.from_numpy(logits.copy())).numpy()
    finally:
        torch.sort = sort


def kept(logits):
    return [np.flatnonzero(np.isfinite(row)).tolist() for row in logits]


@pytest.fixture
def split_small_sets(monkeypatch):
    # every set above 8 tokens goes through the histogram levels, so small vocabularies test them too
    monkeypatch.setattr(nucleus, "SORT_AT_MOST", 8)


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0])
@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_histogram_cut_matches_transformers(split_small_sets, scale, p):
    logits = (np.random.default_rng(int(scale * 100 + p * 1000)).standard_normal((3, 1500)) * scale).astype(np.float32)
    logits[1, ::3] = -np.inf  # banned tokens: probability 0, first in the ascending order
    assert kept(sampling.top_p(logits, p)) == kept(transformers_top_p(logits, p))


@pytest.mark.parametrize("keep", [1, 5, 400])
def test_histogram_cut_min_tokens_to_keep_matches_transformers(split_small_sets, keep):
    logits = (np.random.default_rng(5).standard_normal((3, 1000)) * 6).astype(np.float32)
    logits[2, 10:] = -np.inf
    for p in (0.01, 0.6):
        ours = sampling.top_p(logits, p, min_tokens_to_keep=keep)
        assert kept(ours) == kept(transformers_top_p(logits, p, min_tokens_to_keep=keep))


@pytest.mark.parametrize("p", [0.3, 0.9])
def test_ties_at_the_cut_follow_a_stable_sort(p):
    # five distinct logits over the whole vocabulary: the cut falls inside a group of thousands of equal logits
    logits = (np.random.default_rng(2).integers(0, 5, size=(2, V)) * 0.25).astype(np.float32)
    ours = sampling.top_p(logits, p)
    assert kept(ours) == kept(transformers_top_p(logits, p, stable=True))
    unstable = transformers_top_p(logits, p)  # torch's own tie order: the same number of tokens, other ids
    assert [len(k) for k in kept(ours)] == [len(k) for k in kept(unstable)]
    for row, out in zip(logits, ours):
        lowest = out[np.isfinite(out)].min()
        assert 0 < np.sum(out == lowest) < np.sum(row == lowest)  # the cut split a group of equal logits


def test_a_cut_exactly_at_one_minus_p_removes_the_token():
    # four equal tokens: cumulative 0.25, 0.5, 0.75, 1.0 exactly; "<= 1 - p" removes the first two (by id)
    assert kept(sampling.top_p(np.zeros((1, 4), dtype=np.float32), 0.5)) == [[2, 3]]
    flat = np.zeros((1, V), dtype=np.float32)
    assert kept(sampling.top_p(flat, 0.5)) == kept(transformers_top_p(flat, 0.5, stable=True))


def test_order_keys_sort_like_a_stable_sort():
    logits = np.array([0.5, -0.0, -1.0, 0.0, -np.inf, 0.5, 3.0, -1e-30, -np.inf], dtype=np.float32)
    ids = np.arange(logits.size)
    order = (np.sort(nucleus.order_keys(logits, ids)) & 0xFFFFFFFF).tolist()
    assert order == np.argsort(logits, kind="stable").tolist()


@pytest.mark.parametrize("scale", [0.02, 3.0])
def test_top_p_in_float32_agrees_with_float64(scale):
    logits = (np.random.default_rng(11).standard_normal((3, V)) * scale).astype(np.float32)
    for p in (0.2, 0.9):
        x = logits.astype(np.float64)
        probs = np.exp(x - x.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        order = np.argsort(x, axis=-1, kind="stable")
        removed = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1) <= 1 - p
        expected = [sorted(o[~r].tolist()) for o, r in zip(order, removed)]
        assert kept(sampling.top_p(logits, p)) == expected


# ---- the pick ---------------------------------------------------------------------------------------


def float64_inverse_cdf(row, u):
    weights = np.exp(row - row.max()).astype(np.float32)  # the float32 weights pick draws from
    cdf = np.cumsum(weights, dtype=np.float64)
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


@pytest.mark.parametrize("scale", [0.02, 4.0])
def test_pick_equals_one_float64_cumulative_sum(scale):
    # the block-wise search must pick exactly the token one float64 cumulative sum over the row picks, for the
    # same uniform draw; a float32 cumulative sum would not (its rounding moves the cuts between flat tokens)
    logits = (np.random.default_rng(3).standard_normal((8, V)) * scale).astype(np.float32)
    logits[1, 100:40_000] = -np.inf
    for draw in range(12):
        picks = sampling.pick(logits, True, [np.random.default_rng([draw, r]) for r in range(8)])
        uniforms = [np.random.default_rng([draw, r]).random() for r in range(8)]
        assert picks.tolist() == [float64_inverse_cdf(row, u) for row, u in zip(logits, uniforms)]


def test_pick_at_the_ends_of_the_row():
    logits = np.full((2, V), -np.inf, dtype=np.float32)
    logits[0, [0, V - 1]] = 0.0  # the first and the last token, in the padded last block
    logits[1, 300] = 1.0
    for u, expected in ((0.0, [0, 300]), (0.4999, [0, 300]), (0.5, [V - 1, 300]), (1 - 2**-53, [V - 1, 300])):
        rngs = [type("Fixed", (), {"random": lambda self, u=u: u})() for _ in range(2)]
        assert sampling.pick(logits, True, rngs).tolist() == expected


def test_chain_with_top_p_last_picks_what_filtering_then_picking_picks():
    # the chain hands top_p's weights to the pick: the removed tokens must be 0 there, never drawn
    logits = (np.random.default_rng(4).standard_normal((3, V)) * 0.02).astype(np.float32)
    config = GenerationConfig(do_sample=True, top_k=0, temperature=0.7, top_p=0.3)
    chain = sampling.SamplerChain(config, V)
    filtered = chain.process(logits, [[1]] * 3, [[]] * 3)
    for draw in range(10):
        rngs = lambda: [np.random.default_rng([draw, r]) for r in range(3)]  # noqa: E731
        picks = chain(logits, [[1]] * 3, [[]] * 3, rngs())
        assert picks.tolist() == sampling.pick(filtered, True, rngs()).tolist()
        assert np.isfinite(filtered[np.arange(3), picks]).all()


# ---- the chain's draw from the nucleus by rejection -------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_keeps_answers_for_each_token_what_the_cut_keeps(seed):
    logits = (np.random.default_rng(seed).standard_normal((1, 600)) * 2).astype(np.float32)
    logits[0, ::7] = np.round(logits[0, ::7])  # ties
    logits[0, 5:30] = -np.inf
    w = np.exp(logits[0] - logits[0].max())
    probs64 = (w / w.sum()).astype(np.float64)
    for p in (0.5, 0.9, 0.99):
        expected = np.isfinite(sampling.top_p(logits, p)[0])
        answers = [nucleus.keeps(logits[0], probs64, np.float32(1 - p), t) for t in range(600)]
        assert answers == expected.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_the_verdict_is_keeps_answer_or_none(seed):
    rng = np.random.default_rng(seed)
    work, flags = np.empty(600, dtype=np.float32), np.empty(600, dtype=bool)
    for scale in (0.05, 1.0, 4.0):
        logits = (rng.standard_normal(600) * scale).astype(np.float32)
        logits[::7] = np.round(logits[::7] * 4) / 4  # ties
        logits[5:30] = -np.inf
        w = np.exp(logits - logits.max())
        total = float(w.astype(np.float64).sum())
        probs64 = np.divide(w, w.sum(), dtype=np.float32).astype(np.float64)
        answered = {True: 0, False: 0}
        for p in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999):
            for t in range(600):
                said = nucleus.verdict(w, total, t, p, work, flags)
                if said is not None:
                    answered[said] += 1
                    assert said == nucleus.keeps(logits, probs64, np.float32(1 - p), t), (scale, p, t)
        assert min(answered.values()) > 100  # it answers, both ways


@pytest.mark.parametrize("seed", range(3))
def test_the_verdict_allows_for_weights_rounded_out_of_the_logits_order(seed):
    # the graph's weights order tokens as their logits do only up to rounding: equal logits may get weights a few
    # units in the last place apart, and a larger logit a weight a hair smaller. The verdict must still agree with
    # keeps(), which orders by logit and sums the probabilities made from these weights.
    rng = np.random.default_rng(seed)
    work, flags = np.empty(600, dtype=np.float32), np.empty(600, dtype=bool)
    answered = 0
    for scale in (1.0, 4.0, 8.0):
        logits = (rng.standard_normal(600) * scale).astype(np.float32)
        logits[1::2] = logits[::2]  # every token has a tie
        logits[2::4] = np.nextafter(logits[::4], np.float32(np.inf))  # and a neighbour one ulp above it
        exact = np.exp(logits.astype(np.float64) - logits.max())
        w = (exact * (1 + rng.uniform(-6e-7, 6e-7, 600))).astype(np.float32)  # out of order by a few ulps
        total = float(w.astype(np.float64).sum())
        probs64 = np.divide(w, w.sum(), dtype=np.float32).astype(np.float64)
        for p in (0.5, 0.8, 0.9, 0.95, 0.99):
            for t in range(600):
                said = nucleus.verdict(w, total, t, p, work, flags)
                if said is not None:
                    answered += 1
                    assert said == nucleus.keeps(logits, probs64, np.float32(1 - p), t), (scale, p, t)
    assert answered > 5000


def test_draws_are_the_same_with_and_without_the_shortcut(monkeypatch):
    logits = (np.random.default_rng(3).standard_normal((40, V)) * 3).astype(np.float32)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, top_p=0.9), V)
    with_shortcut = chain(logits, [[1]] * 40, [[]] * 40, [np.random.default_rng([4, r]) for r in range(40)])
    monkeypatch.setattr(nucleus, "verdict", lambda *args: None)
    without = chain(logits, [[1]] * 40, [[]] * 40, [np.random.default_rng([4, r]) for r in range(40)])
    assert with_shortcut.tolist() == without.tolist()


@pytest.mark.parametrize("tries", [REJECTION_TRIES, 0])  # 0: every row falls back to the cut at once
def test_rejection_draws_follow_the_nucleus_distribution(monkeypatch, tries):
    monkeypatch.setattr(nucleus.draw, "REJECTION_TRIES", tries)
    probs = np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    n = 3000
    logits = np.repeat(np.log(probs).astype(np.float32)[None, :], n, axis=0)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, top_p=0.8), 6)
    assert 0.8 >= nucleus.REJECT_FROM  # this chain draws by rejection
    picks = chain(logits, [[0]] * n, [[]] * n, [np.random.default_rng([7, r]) for r in range(n)])
    kept = np.array([True, True, True, True, False, False])  # cumulative from below: .05 .13 .25 .45 .70 1.0
    frequency = np.bincount(picks, minlength=6) / n
    assert frequency[~kept].sum() == 0
    assert np.abs(frequency - np.where(kept, probs, 0) / probs[kept].sum()).max() < 0.03


def test_rejection_draws_on_a_flat_vocabulary_are_all_in_the_nucleus():
    logits = (np.random.default_rng(8).standard_normal((6, V)) * 0.02).astype(np.float32)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, top_p=0.9), V)
    nucleus_rows = sampling.top_p(logits, 0.9)
    rngs = [np.random.default_rng([9, r]) for r in range(6)]
    for _ in range(3):
        picks = chain(logits, [[1]] * 6, [[]] * 6, rngs)
        assert np.isfinite(nucleus_rows[np.arange(6), picks]).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_mass_below_is_summed_over_prefixes_up_to_the_whole_row(seed):
    # the prefixes' sums only ever grow: an answer from a part of the row is the whole row's, and the last prefix
    # is the whole row (the smaller weights here sit at the end of the row, where only the whole row finds them)
    rng = np.random.default_rng(seed)
    w = np.exp(rng.standard_normal(1000)).astype(np.float32)
    w[900:] *= np.float32(1e-3)
    work, flags = np.empty(1000, dtype=np.float32), np.empty(1000, dtype=bool)
    answers = []
    for low in np.quantile(w, [0.05, 0.2, 0.5, 0.9, 0.99]).astype(np.float32):
        below = float(w[w < low].astype(np.float64).sum())
        for need in (below * 0.1, below * 0.9, below * 0.999, below * 1.001, below * 1.1):  # 0.1: a prefix answers
            said = nucleus._mass_below_exceeds(w, low, need, work, flags)
            assert said == (below > need), (low, need)
            answers.append(said)
    assert True in answers and False in answers
    for n in range(5):  # rows too short for every prefix to hold a token
        row = np.arange(1, n + 1, dtype=np.float32)
        for low in range(n + 2):
            below = float(row[row < low].sum())
            for need in (below - 0.5, below + 0.5):
                assert nucleus._mass_below_exceeds(row, np.float32(low), need, work[:n], flags[:n]) == (below > need)
