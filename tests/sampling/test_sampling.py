"""Sampler tests: the whole chain against transformers', no-op values, seeds, statistics, bad input, log-probs."""

import numpy as np
import pytest
import torch
from edgelm.runtime import sampling
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from sampler_logits import B, SEEDS, assert_same, random_ids, random_logits, reference, rngs
from transformers.generation import logits_process as hf


# ---- the whole chain -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_process_logits_matches_transformers_chain(seed):
    n_vocab = 500
    logits, ids = random_logits(seed, n_vocab), random_ids(seed, n_vocab, length=20, high=30)
    config = GenerationConfig(
        do_sample=True,
        temperature=0.8,
        top_k=60,
        top_p=0.9,
        min_p=0.02,
        typical_p=0.95,
        repetition_penalty=1.2,
        no_repeat_ngram_size=2,
        bad_words_ids=((5,), (7, 8)),
        min_new_tokens=10,
        eos_token_id=3,
    )
    chain = hf.LogitsProcessorList(
        [
            hf.RepetitionPenaltyLogitsProcessor(1.2),
            hf.NoRepeatNGramLogitsProcessor(2),
            hf.NoBadWordsLogitsProcessor([[5], [7, 8]]),
            hf.MinNewTokensLengthLogitsProcessor(15, 10, 3),
            hf.TemperatureLogitsWarper(0.8),
            hf.TopKLogitsWarper(60),
            hf.TopPLogitsWarper(0.9),
            hf.MinPLogitsWarper(0.02),
            hf.TypicalLogitsWarper(0.95),
        ]
    )
    ours = sampling.process_logits(logits, config, list(ids), [row[15:] for row in ids])
    assert_same(ours, reference(chain, logits, ids))


def test_repetition_penalty_applies_before_top_k():
    logits = np.array([[3.0, 2.9, 0.0, -1.0]], dtype=np.float32)
    config = GenerationConfig(do_sample=True, top_k=1, repetition_penalty=1.5)
    out = sampling.process_logits(logits, config, [np.array([0])], [np.array([], dtype=np.int64)])
    # penalty first: 3.0 -> 2.0 drops below 2.9, so top_k=1 keeps token 1 (top_k first would have kept token 0)
    assert np.isfinite(out[0]).nonzero()[0].tolist() == [1]


def test_warpers_skipped_when_greedy():
    logits = random_logits(0, 100)
    config = GenerationConfig(
        do_sample=False, temperature=0.5, top_k=1, top_p=0.1, min_p=0.5, typical_p=0.2, bad_words_ids=((4,),)
    )
    out = sampling.process_logits(logits, config, [np.array([1])] * B, [np.array([], dtype=np.int64)] * B)
    expected = logits.copy()
    expected[:, 4] = -np.inf
    np.testing.assert_array_equal(out, expected)


def test_min_new_tokens_counts_each_row():
    logits = np.zeros((2, 4), dtype=np.float32)
    config = GenerationConfig(min_new_tokens=2, eos_token_id=3)
    out = sampling.process_logits(logits, config, [np.arange(5), np.arange(5)], [np.array([1]), np.array([1, 2])])
    assert np.isneginf(out[0, 3]) and np.isfinite(out[1, 3])


def test_process_logits_never_modifies_its_input():
    logits = random_logits(1, 200)
    before = logits.copy()
    config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        min_p=0.05,
        typical_p=0.9,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.5,
        logit_bias={3: 5.0},
        no_repeat_ngram_size=2,
        bad_words_ids=((9,),),
        min_new_tokens=5,
        eos_token_id=0,
    )
    ids = list(random_ids(1, 200, high=10))
    sampling.process_logits(logits, config, ids, ids)
    np.testing.assert_array_equal(logits, before)


# ---- no-op values ----------------------------------------------------------------------------------


def test_no_op_values_are_no_ops():
    logits = random_logits(3, 300)
    ids = list(random_ids(3, 300, high=10))
    results = [
        sampling.repetition_penalty(logits, ids, 1.0),
        sampling.frequency_presence_penalty(logits, ids, 0.0, 0.0),
        sampling.logit_bias(logits, {}),
        sampling.no_repeat_ngram(logits, ids, 0),
        sampling.bad_words(logits, ids, ()),
        sampling.min_new_tokens(logits, 0, 0, (5,)),
        sampling.min_new_tokens(logits, 0, 10, None),
        sampling.temperature(logits, 1.0),
        sampling.top_k(logits, 0),
        sampling.top_p(logits, 1.0),
        sampling.min_p(logits, 0.0),
        sampling.typical_p(logits, 1.0),
    ]
    for out in results:
        np.testing.assert_array_equal(out, logits)
        assert out is not logits  # filters return a new array unless inplace=True


def test_default_config_is_a_no_op():
    logits = random_logits(3, 300)
    ids = list(random_ids(3, 300))
    assert sampling.process_logits(logits, GenerationConfig(), ids, ids) is logits
    sampling_defaults = GenerationConfig(do_sample=True, top_k=0)
    np.testing.assert_array_equal(sampling.process_logits(logits, sampling_defaults, ids, ids), logits)


# ---- picking ---------------------------------------------------------------------------------------


def test_greedy_is_argmax():
    logits = random_logits(0, 1000)
    picks = sampling.pick(logits, False, rngs(0))
    assert picks.dtype == np.int64
    np.testing.assert_array_equal(picks, logits.argmax(axis=-1))


def test_same_seed_same_picks_different_seed_different_picks():
    logits = np.zeros((B, 1000), dtype=np.float32)  # uniform: a repeat by chance is 1 in 1000 per row
    draws = lambda seed: np.stack([sampling.pick(logits, True, r) for r in [rngs(seed)] for _ in range(5)])
    np.testing.assert_array_equal(draws(7), draws(7))
    assert not np.array_equal(draws(7), draws(8))


def test_a_row_does_not_depend_on_the_rest_of_the_batch():
    logits = random_logits(2, 500)
    alone = sampling.pick(logits[1:2], True, [np.random.default_rng(42)])
    batched = sampling.pick(
        logits, True, [np.random.default_rng(1), np.random.default_rng(42), np.random.default_rng(3)]
    )
    assert batched[1] == alone[0]


def test_sampling_follows_the_filtered_distribution():
    probs = np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    logits = np.log(probs).astype(np.float32)[None, :]
    filtered = sampling.top_p(sampling.top_k(logits, 5), 0.8)  # keeps 0.30 0.25 0.20 0.12
    kept = np.isfinite(filtered[0])
    assert kept.tolist() == [True, True, True, True, False, False]
    expected = np.where(kept, probs, 0) / probs[kept].sum()
    n = 20_000
    rng = np.random.default_rng(123)
    picks = sampling.pick(np.repeat(filtered, n, axis=0), True, [rng] * n)
    frequency = np.bincount(picks, minlength=6) / n
    assert frequency[~kept].sum() == 0  # banned tokens are never drawn
    assert np.abs(frequency - expected).max() < 0.02


# ---- bad input -------------------------------------------------------------------------------------


def test_logit_bias_out_of_range_raises():
    with pytest.raises(GenerationOptionError, match=r"logit_bias .*\[50, 99\].*\(ids 0 to 49\)"):
        sampling.logit_bias(np.zeros((1, 50), dtype=np.float32), {99: 1.0, 50: -1.0, 3: 1.0})


def test_bad_words_out_of_range_raises():
    with pytest.raises(GenerationOptionError, match=r"bad_words_ids .*\[60\]"):
        sampling.bad_words(np.zeros((1, 50), dtype=np.float32), [np.array([1])], ((1, 60),))


@pytest.mark.parametrize("do_sample", [False, True])
def test_every_token_banned_raises(do_sample):
    logits = np.zeros((2, 4), dtype=np.float32)
    logits[1] = -np.inf
    with pytest.raises(GenerationOptionError, match=r"every token was banned for row\(s\) \[1\]"):
        sampling.pick(logits, do_sample, rngs(0, 2))


@pytest.mark.filterwarnings("error")
def test_all_banned_through_process_logits_raises():
    config = GenerationConfig(
        do_sample=True, bad_words_ids=((0,), (1,), (2,)), top_k=2, top_p=0.5, min_p=0.1, typical_p=0.5
    )
    out = sampling.process_logits(np.zeros((1, 3), dtype=np.float32), config, [[0]], [[]])
    with pytest.raises(GenerationOptionError, match="every token was banned"):
        sampling.pick(out, True, rngs(0, 1))


# ---- log-probs -------------------------------------------------------------------------------------


def test_log_softmax_matches_torch_and_is_stable():
    logits = random_logits(4, 1000, scale=50.0)
    logits[0, 0] = 1e4  # would overflow a naive exp
    ours = sampling.log_softmax(logits)
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    np.testing.assert_allclose(ours, torch.log_softmax(torch.from_numpy(logits), -1).numpy(), rtol=1e-5, atol=1e-4)


def test_top_logprobs_sorted_descending():
    row = sampling.log_softmax(random_logits(6, 300))[0]
    ids, values = sampling.top_logprobs(row, 5)
    np.testing.assert_array_equal(ids, np.argsort(-row)[:5])
    np.testing.assert_array_equal(values, row[ids])
    assert (np.diff(values) <= 0).all()
    assert sampling.top_logprobs(row, 0)[0].size == 0
