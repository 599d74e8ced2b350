"""Sampler tests: every filter against transformers' own logits processor, no-ops, seeds, statistics, bad input."""

import numpy as np
import pytest
import torch
from edgelm.runtime import sampling
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from transformers.generation import logits_process as hf

SEEDS = [0, 1, 2, 3]
VOCABS = [50, 257, 1000]
B = 3


def random_logits(seed, n_vocab, scale=3.0):
    return (np.random.default_rng(seed).standard_normal((B, n_vocab)) * scale).astype(np.float32)


def random_ids(seed, n_vocab, length=12, high=None):
    # few distinct ids (high) make repeats, n-gram matches and bad-word matches likely
    return np.random.default_rng(seed + 100).integers(0, high or n_vocab, size=(B, length))


def reference(processor, logits, input_ids=None):
    """transformers' processor on the same logits; input_ids [B, L] (a dummy when the processor ignores it)."""
    ids = (
        torch.zeros((logits.shape[0], 1), dtype=torch.long)
        if input_ids is None
        else torch.as_tensor(input_ids, dtype=torch.long)
    )
    return processor(ids, torch.from_numpy(logits.copy())).numpy()


def assert_same(ours, theirs):
    """Same kept set (-inf where transformers has -inf) and the same values elsewhere."""
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


# ---- each filter against transformers -------------------------------------------------------------


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


def rngs(seed, n=B):
    return [np.random.default_rng([seed, r]) for r in range(n)]


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
