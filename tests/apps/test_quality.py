"""runtime/quality/measure.py: the figures that compare two models' next-token distributions on the same text."""

import numpy as np
import pytest
from edgelm.runtime import load
from edgelm.runtime.quality.measure import (
    LogitAgreement,
    Plan,
    compare_engines,
    greedy_agreement,
    greedy_prompts,
    log_softmax,
    looks_random,
    text_windows,
)


def test_identical_logits_agree_exactly():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(300, 50)).astype(np.float32)  # more than one slice of POSITIONS_AT_ONCE
    targets = rng.integers(0, 50, size=300)
    agreement = LogitAgreement()
    agreement.add(logits, logits, targets)
    summary = agreement.summary()
    assert summary["tokens"] == 300
    assert summary["top1_agreement"] == 1.0
    assert summary["mean_kl_divergence"] == pytest.approx(0.0, abs=1e-6)
    assert summary["perplexity_change"] == pytest.approx(0.0, abs=1e-6)
    expected = np.exp(-log_softmax(logits)[np.arange(300), targets].mean())
    assert summary["perplexity"] == pytest.approx(expected, rel=1e-5)


def test_kl_and_top1_against_a_hand_computed_case():
    reference = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=np.float32))
    ours = np.log(np.array([[0.2, 0.7, 0.1], [0.1, 0.1, 0.8]], dtype=np.float32))
    agreement = LogitAgreement()
    agreement.add(reference, ours, np.array([0, 2]))
    kl_first = 0.7 * np.log(0.7 / 0.2) + 0.2 * np.log(0.2 / 0.7)
    summary = agreement.summary()
    assert summary["mean_kl_divergence"] == pytest.approx(kl_first / 2, rel=1e-5)
    assert summary["top1_agreement"] == 0.5
    assert summary["perplexity_reference"] == pytest.approx(np.exp(-(np.log(0.7) + np.log(0.8)) / 2), rel=1e-5)
    assert summary["perplexity"] == pytest.approx(np.exp(-(np.log(0.2) + np.log(0.8)) / 2), rel=1e-5)


def test_greedy_agreement_counts_first_differences():
    reference = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
    ours = np.array([[1, 2, 3, 4], [1, 9, 3, 4], [0, 6, 7, 8]])
    figures = greedy_agreement(reference, ours)
    assert figures == {
        "continuations": 3,
        "tokens_each": 4,
        "identical": 1,
        "prefix_agreement": pytest.approx((4 + 1 + 0) / 12),
        "token_agreement": pytest.approx(10 / 12),
    }


def test_windows_and_prompts_cover_the_text():
    ids = list(range(1000))
    windows = text_windows(ids, 300)
    assert [len(w) for w in windows] == [300, 300, 300, 100]
    assert np.concatenate(windows).tolist() == ids
    assert text_windows([1, 2, 3, 4, 5], 4)[-1].tolist() == [1, 2, 3, 4]  # a lone last token scores nothing
    prompts = greedy_prompts(ids, 32, 16)
    assert len(prompts) == 32 and all(len(p) == 16 for p in prompts)
    assert prompts[0][0] == 0 and prompts[-1][-1] == 999
    assert greedy_prompts([1, 2], 32, 16) == [[1, 2]]


def test_random_weights_are_recognised():
    assert looks_random(30_000.0, 50_257)
    assert not looks_random(60.0, 50_257)


def test_a_package_compared_with_itself_agrees_and_int8_differs(tiny_package, tiny_package_int8):
    reference = load(tiny_package)
    ids = np.random.default_rng(1).integers(0, reference.arch.vocab_size, size=200)
    plan = Plan(64, prompts=4, prompt_tokens=8, new_tokens=8)
    same = compare_engines(reference.engine, load(tiny_package).engine, ids, plan)
    assert same["top1_agreement"] == 1.0 and same["mean_kl_divergence"] == pytest.approx(0.0, abs=1e-6)
    assert same["greedy"]["identical"] == 4 and same["tokens"] == 199 - 3  # four windows, one target lost at each edge
    assert same["cache_path"]["mean_kl_divergence"] == pytest.approx(0.0, abs=1e-6)
    assert same["cache_path"]["tokens"] == 3 * 32  # the three full windows' last 32 positions, through the cache
    int8 = compare_engines(reference.engine, load(tiny_package_int8).engine, ids, plan)
    assert int8["mean_kl_divergence"] > 0 and int8["tokens"] == same["tokens"]


def test_windows_and_prompts_start_with_the_tokenizers_prefix():
    windows = text_windows(list(range(10, 20)), 4, prefix=[1])
    assert [w.tolist() for w in windows] == [[1, 10, 11, 12], [1, 13, 14, 15], [1, 16, 17, 18], [1, 19]]
    assert greedy_prompts(list(range(100)), 2, 5, prefix=[1]) == [[1, 0, 1, 2, 3], [1, 96, 97, 98, 99]]


def test_the_plan_fits_the_context():
    assert Plan.for_context(2048) == Plan(1024, 32, 32, 64, 4, 32)
    assert Plan.for_context(64) == Plan(64, 32, 16, 48, 4, 32)
