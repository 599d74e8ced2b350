"""Each sampler filter against transformers' own logits processor, and by hand."""

import numpy as np
import pytest
from edgelm.runtime import sampling
from sampler_logits import SEEDS, VOCABS, assert_same, random_ids, random_logits, reference
from transformers.generation import logits_process as hf


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_transformers(seed, n_vocab, penalty):
    logits, ids = random_logits(seed, n_vocab), random_ids(seed, n_vocab, high=20)
    ours = sampling.repetition_penalty(logits, list(ids), penalty)
    assert_same(ours, reference(hf.RepetitionPenaltyLogitsProcessor(penalty), logits, ids))


def test_repetition_penalty_by_hand():
    logits = np.array([[2.0, -2.0, 1.0, 0.0]], dtype=np.float32)
    out = sampling.repetition_penalty(logits, [np.array([0, 1, 1, 3])], 2.0)
    np.testing.assert_array_equal(out, [[1.0, -4.0, 1.0, 0.0]])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_matches_transformers(seed, n_vocab, n):
    logits, ids = random_logits(seed, n_vocab), random_ids(seed, n_vocab, length=30, high=4)
    ours = sampling.no_repeat_ngram(logits, list(ids), n)
    assert_same(ours, reference(hf.NoRepeatNGramLogitsProcessor(n), logits, ids))


def test_no_repeat_ngram_by_hand():
    logits = np.zeros((2, 6), dtype=np.float32)
    seen = [np.array([1, 2, 3, 1, 2, 4, 1, 2]), np.array([5])]  # "1 2" was followed by 3 and by 4
    out = sampling.no_repeat_ngram(logits, seen, 3)
    assert np.isneginf(out[0]).nonzero()[0].tolist() == [3, 4]
    assert not np.isneginf(out[1]).any()  # shorter than n: nothing to repeat


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
def test_bad_words_matches_transformers(seed, n_vocab):
    logits, ids = random_logits(seed, n_vocab), random_ids(seed, n_vocab, high=5)
    ids[1, -2:] = [3, 4]  # make sure at least one multi-token prefix matches
    words = ((7,), (3, 4, 9), (4, 11), (0, 1, 2, 3, 12), (2,))
    ours = sampling.bad_words(logits, list(ids), words)
    theirs = reference(hf.NoBadWordsLogitsProcessor([list(w) for w in words]), logits, ids)
    assert_same(ours, theirs)
    assert np.isneginf(ours[1, 9])


def test_bad_words_prefix_filling_the_whole_row_still_bans():
    # transformers skips a sequence longer than the context, so it would allow 7 here; we follow the rule as stated
    out = sampling.bad_words(np.zeros((1, 10), dtype=np.float32), [np.array([5])], ((5, 7),))
    assert np.isneginf(out[0]).nonzero()[0].tolist() == [7]


def test_id_lists_may_be_plain_and_empty():
    logits = np.ones((2, 5), dtype=np.float32)
    out = sampling.frequency_presence_penalty(logits, [[], [2, 2]], 1.0, 0.0)
    out = sampling.repetition_penalty(out, [[], [4]], 2.0)
    out = sampling.no_repeat_ngram(out, [[], [1, 1]], 1)
    np.testing.assert_array_equal(out, [[1, 1, 1, 1, 1], [1, -np.inf, -1, 1, 0.5]])


def test_bad_words_by_hand():
    logits = np.zeros((2, 5), dtype=np.float32)
    out = sampling.bad_words(logits, [np.array([0, 1, 2]), np.array([2, 1, 0])], ((4,), (1, 2, 3)))
    assert np.isneginf(out[:, 4]).all()
    assert np.isneginf(out[0, 3]) and not np.isneginf(out[1, 3])
    assert np.isfinite(out[:, :3]).all()


@pytest.mark.parametrize("eos", [(7,), (7, 20)])
@pytest.mark.parametrize("n_generated", [0, 2, 3, 5])
def test_min_new_tokens_matches_transformers(n_generated, eos):
    logits = random_logits(0, 50)
    prompt = 4
    ids = random_ids(0, 50, length=prompt + n_generated)
    ours = sampling.min_new_tokens(logits, n_generated, 3, eos)
    theirs = reference(hf.MinNewTokensLengthLogitsProcessor(prompt, 3, list(eos)), logits, ids)
    assert_same(ours, theirs)
    assert np.isneginf(ours[:, list(eos)]).all() == (n_generated < 3)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", [0.3, 1.7])
def test_temperature_matches_transformers(seed, t):
    logits = random_logits(seed, 257)
    assert_same(sampling.temperature(logits, t), reference(hf.TemperatureLogitsWarper(t), logits))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("k", [1, 5, 40])
def test_top_k_matches_transformers(seed, n_vocab, k):
    logits = random_logits(seed, n_vocab)
    assert_same(sampling.top_k(logits, k), reference(hf.TopKLogitsWarper(k), logits))


def test_top_k_keeps_ties_like_transformers():
    logits = np.array([[1.0, 3.0, 2.0, 3.0, 2.0, 0.0]], dtype=np.float32)
    ours = sampling.top_k(logits, 3)
    assert_same(ours, reference(hf.TopKLogitsWarper(3), logits))
    assert np.isfinite(ours[0]).nonzero()[0].tolist() == [1, 2, 3, 4]  # both 2.0s tie with the 3rd largest


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_matches_transformers(seed, n_vocab, p):
    logits = random_logits(seed, n_vocab)
    assert_same(sampling.top_p(logits, p), reference(hf.TopPLogitsWarper(p), logits))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", [0.3, 0.9])
def test_top_p_after_top_k_and_min_tokens_to_keep_match_transformers(seed, p):
    # top_k leaves few finite logits, so top_p only sorts those: the result must not change
    logits = sampling.top_k(random_logits(seed, 1000), 20)
    logits[0, :] = np.where(np.arange(1000) < 3, logits[0], -np.inf)  # a row with fewer finite tokens than the others
    logits[0, :3] = [1.0, 2.0, 3.0]
    for keep in (1, 3):
        ours = sampling.top_p(logits, p, min_tokens_to_keep=keep)
        assert_same(ours, reference(hf.TopPLogitsWarper(p, min_tokens_to_keep=keep), logits))


@pytest.mark.parametrize("scale", [4.0, 0.02])
@pytest.mark.parametrize("p", [0.5, 0.95])
def test_top_p_full_gpt2_vocab_matches_transformers(scale, p):
    # scale 4: a peaked row, a small nucleus; 0.02 (as random weights give): the nucleus is most of the row
    logits = random_logits(9, 50_257, scale=scale)
    ours = sampling.top_p(logits, p)
    assert_same(ours, reference(hf.TopPLogitsWarper(p), logits))
    kept = np.isfinite(ours).sum(axis=-1)
    assert (kept > 10_000).all() == (scale < 1)  # flat rows: the nucleus holds a large part of the vocabulary


def test_top_p_by_hand():
    probs = np.array([[0.05, 0.1, 0.15, 0.3, 0.4]])
    out = sampling.top_p(np.log(probs).astype(np.float32), 0.6)
    # ascending cumulative: .05 .15 .30 .60 1.0; removed where <= 0.4: the three smallest
    assert np.isfinite(out[0]).nonzero()[0].tolist() == [3, 4]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("p", [0.01, 0.1, 0.5])
def test_min_p_matches_transformers(seed, n_vocab, p):
    logits = random_logits(seed, n_vocab)
    assert_same(sampling.min_p(logits, p), reference(hf.MinPLogitsWarper(p), logits))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
@pytest.mark.parametrize("mass", [0.2, 0.5, 0.9, 0.98])
def test_typical_p_matches_transformers(seed, n_vocab, mass):
    logits = random_logits(seed, n_vocab)
    assert_same(sampling.typical_p(logits, mass), reference(hf.TypicalLogitsWarper(mass), logits))


def test_typical_p_with_banned_tokens_matches_transformers():
    logits = sampling.top_k(random_logits(5, 300), 30)
    assert_same(sampling.typical_p(logits, 0.7), reference(hf.TypicalLogitsWarper(0.7), logits))


def test_frequency_presence_penalty_by_hand():
    logits = np.zeros((2, 5), dtype=np.float32)
    out = sampling.frequency_presence_penalty(logits, [np.array([1, 1, 1, 3]), np.array([], dtype=np.int64)], 0.5, 0.25)
    np.testing.assert_allclose(out[0], [0, -1.75, 0, -0.75, 0])
    np.testing.assert_array_equal(out[1], 0)  # nothing generated yet: the prompt does not count


def test_logit_bias_adds():
    logits = np.ones((2, 4), dtype=np.float32)
    out = sampling.logit_bias(logits, {0: -100.0, 3: 2.5})
    np.testing.assert_allclose(out, [[-99, 1, 1, 3.5]] * 2)
