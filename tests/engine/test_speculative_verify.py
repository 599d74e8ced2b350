"""The pure parts of speculation: the acceptance rules draw from exactly the target's distribution (a chi-square
test over many fixed seeds on a tiny vocabulary), and the prompt-lookup proposer's matches, draft length and
off-switch."""

import numpy as np
import pytest
from edgelm.runtime.speculative import ngram
from edgelm.runtime.speculative.ngram import NgramProposer, latest_match
from edgelm.runtime.speculative.verify import accepted_prefix, probabilities, rejection_sample, residual

# The 0.999 quantile of the chi-square distribution with 5 degrees of freedom (six tokens): a correct sampler
# exceeds it one time in a thousand, and the seeds are fixed, so the test is deterministic.
CHI2_999_DF5 = 20.515
DRAWS = 30_000


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


P = np.array([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
DRAFTS = {
    "close": np.array([0.3, 0.3, 0.15, 0.15, 0.05, 0.05]),
    "far": np.array([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]),
    "one-hot": np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0]),  # a fixed proposal: prompt lookup, forced tokens
    "missing a token": np.array([0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
}


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_rejection_sampling_draws_from_the_target(draft):
    q, rng = DRAFTS[draft], np.random.default_rng(1234)
    counts, accepted = np.zeros(len(P)), 0
    for _ in range(DRAWS):
        token = int(rng.choice(len(q), p=q))
        ok, emitted = rejection_sample(P, q, token, rng)
        counts[emitted] += 1
        accepted += ok
    assert chi_square(counts, P) < CHI2_999_DF5
    # the acceptance rate is sum(min(p, q)), the papers' expectation
    assert accepted / DRAWS == pytest.approx(np.minimum(P, q).sum(), abs=0.015)


def test_a_wrong_sampler_fails_the_same_test():
    """The test can fail: always accepting the draft draws from q, not p."""
    q, rng = DRAFTS["close"], np.random.default_rng(1234)
    counts = np.bincount(rng.choice(len(q), size=DRAWS, p=q), minlength=len(P)).astype(float)
    assert chi_square(counts, P) > CHI2_999_DF5


def test_residual_and_probabilities():
    np.testing.assert_allclose(residual(P, DRAFTS["one-hot"]), np.r_[P[:3], 0, P[4:]] / (1 - P[3]))
    np.testing.assert_allclose(probabilities(np.log(P)), P)
    assert probabilities(np.array([0.0, -np.inf]))[1] == 0


def test_accepted_prefix():
    assert accepted_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert accepted_prefix([5], []) == 0
    assert accepted_prefix([1, 2, 9], [1, 2]) == 2  # the third pick is the bonus token


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    seen = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3]
    assert latest_match(np.array(seen), 3) == 5
    assert NgramProposer(draft=4).propose(seen, limit=10) == [5, 6, 7, 1]  # the draft length
    assert NgramProposer(draft=4).propose(seen, limit=2) == [5, 6]
    assert NgramProposer().propose([1, 2, 3, 4], limit=4) == []  # no earlier occurrence
    assert NgramProposer(min_ngram=2).propose([7, 8, 9, 8], limit=4) == []  # a one-token match is not enough


def test_a_match_that_runs_into_the_end_keeps_copying_the_repeating_run():
    """In a run that repeats, the latest match is one period back: its continuation reaches the end, and the
    proposal goes on copying the run (an overlapping copy) instead of stopping at the last id."""
    assert NgramProposer(draft=4).propose([7, 1, 1, 1, 1], limit=4) == [1, 1, 1, 1]
    assert NgramProposer(draft=4).propose([9, 1, 2, 1, 2, 1, 2], limit=4) == [1, 2, 1, 2]
    assert NgramProposer(draft=4).propose([4, 5, 6, 7, 4, 5, 6], limit=3) == [7, 4, 5]


def test_prompt_lookup_proposes_only_what_no_repeat_ngram_size_allows():
    """Copying after a match of n ids repeats an N-gram from the (N - n)th copied id on: under
    no_repeat_ngram_size N the filter would ban it, so a match proposes N - 1 - n ids at most."""
    seen = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3]
    assert NgramProposer(draft=4).propose(seen, limit=4) == [4, 5, 6, 9]
    assert NgramProposer(no_repeat=3).propose(seen, limit=4) == []  # any match of 2 or 3 ids is banned at once
    assert NgramProposer(no_repeat=4).propose(seen, limit=4) == [4]  # the 2-id match, one id
    assert NgramProposer(no_repeat=6).propose(seen, limit=4) == [4, 5]  # the 3-id match, two ids


def test_the_draft_grows_when_accepted_and_shrinks_when_not():
    proposer = NgramProposer(draft=4)
    proposer.accepted(4, 4)
    assert proposer.draft == 6
    proposer.accepted(6, 1)
    assert proposer.draft == 2


def test_prompt_lookup_grows_to_16_tokens_while_its_copies_are_accepted_whole():
    proposer, run = NgramProposer(), [5, 9] * 20
    for _ in range(10):
        proposer.accepted(len(proposer.propose(run, limit=32)), proposer.draft)
    assert proposer.propose(run, limit=32) == [5, 9] * 8


def test_low_acceptance_switches_prompt_lookup_off_for_a_while():
    proposer, seen = NgramProposer(), [1, 2, 3, 1, 2, 3, 1, 2]
    while not proposer.paused:
        assert proposer.propose(seen, limit=8)
        proposer.accepted(proposer.draft, 0)
    assert proposer.paused == ngram.PAUSE
    for _ in range(ngram.PAUSE):
        assert proposer.propose(seen, limit=8) == []
    assert proposer.propose(seen, limit=8)  # and back on after the pause


def test_a_proposer_given_a_longer_max_pause_pauses_twice_as_long_after_each_window_that_fails_again():
    adapt = ngram.Adaptive(window=4, max_pause=ngram.PAUSE * 4)
    lengths = []
    for _ in range(4):
        adapt.accepted(4, 0)
        lengths.append(adapt.paused)
        adapt.paused = 0
    assert lengths == [ngram.PAUSE, 2 * ngram.PAUSE, 4 * ngram.PAUSE, 4 * ngram.PAUSE]
    adapt.accepted(4, 4)  # a window that pays: the next pause is PAUSE again
    adapt.accepted(4, 0)
    assert adapt.paused == ngram.PAUSE
    assert ngram.NgramProposer().max_pause == ngram.MAX_PAUSE  # prompt lookup: up to 4 x PAUSE
    short = ngram.Adaptive(window=4, max_pause=ngram.PAUSE // 4)  # no pause longer than max_pause, the first too
    short.accepted(4, 0)
    assert short.paused == ngram.PAUSE // 4


class MarkovEngine:
    """A stand-in engine on ids over 5 tokens: each position's logits are a fixed row of the previous id, so the
    exact distribution of every output is known. It keeps no cache (its rows depend on one id)."""

    vocab_size, device, runner = 5, "cpu", None

    def __init__(self, table: np.ndarray):
        self.table = table  # [V, V] logits of the next id given the previous one

    def forward(self, input_ids, attention_mask, position_ids, past, logits_to_keep=1):
        return self.table[np.asarray(input_ids)][:, -logits_to_keep:], []

    def decoder(self, batch, capacity):
        engine = self

        class Decoder:
            past = []

            def __init__(self):
                self.engine = engine

            def run(self, input_ids, attention_mask, position_ids):
                return engine.forward(input_ids, attention_mask, position_ids, [], 1)[0]

        return Decoder()


class DrawnDraft:
    """Draws k ids from another Markov table (q), as a sampled draft model does."""

    def __init__(self, table: np.ndarray, rng):
        self.table, self.rng, self.q = table, rng, None

    def propose(self, seen: list, limit: int) -> list:
        out, self.q, last = [], [], seen[-1]
        for _ in range(min(limit, 3)):
            q = probabilities(self.table[last])
            last = int(self.rng.choice(len(q), p=q))
            out.append(last)
            self.q.append(q)
        return out

    def accepted(self, drafted: int, accepted: int) -> None:
        pass


class FixedDraft:
    """Always proposes the same ids: a fixed proposal, as prompt lookup and forced tokens are."""

    q = None

    def propose(self, seen: list, limit: int) -> list:
        return [2, 3][:limit]

    def accepted(self, drafted: int, accepted: int) -> None:
        pass


@pytest.mark.parametrize("kind", ["drawn", "fixed"])
def test_the_row_loop_with_a_draft_samples_the_model_s_sequences(kind):
    """Whole outputs of 4 tokens through speculative_steps with drafts of 2, drawn from another distribution or
    fixed: the second, third and fourth tokens, and the pair of the drafted positions, follow the target's chain
    (chi-square over 3,000 fixed seeds)."""
    from edgelm.runtime.batching.rows import Rows
    from edgelm.runtime.batching.step import Step
    from edgelm.runtime.generation_config import GenerationConfig
    from edgelm.runtime.speculative import Speculation, speculative_steps

    target = np.log(np.random.default_rng(0).dirichlet(np.ones(5), size=5)).astype(np.float32)
    draft = np.log(np.random.default_rng(1).dirichlet(np.ones(5), size=5)).astype(np.float32)
    config = GenerationConfig(max_new_tokens=4, do_sample=True, top_k=0)
    outputs, stats = [], Speculation()
    for seed in range(3000):
        rng = np.random.default_rng(seed)
        proposer = DrawnDraft(draft, rng) if kind == "drawn" else FixedDraft()
        step = Step(Rows(None, [[0]], config), 5, rngs=[rng])
        for _ in speculative_steps(MarkovEngine(target), step, 0, proposer, stats):
            pass
        outputs.append(step.states[0].generated)
    outputs = np.array(outputs)
    p = probabilities(target)  # [V, V]: row a is the next id's distribution after a
    second, third = p[0] @ p, p[0] @ p @ p
    pair = (p[0] @ p)[:, None] * p  # P(t2 = a, t3 = b)
    assert chi_square(np.bincount(outputs[:, 1], minlength=5).astype(float), second) < 18.467  # df 4, 0.999
    assert chi_square(np.bincount(outputs[:, 2], minlength=5).astype(float), third) < 18.467
    assert chi_square(np.bincount(outputs[:, 3], minlength=5).astype(float), third @ p) < 18.467
    pairs = np.bincount(outputs[:, 1] * 5 + outputs[:, 2], minlength=25).astype(float)
    assert chi_square(pairs, pair.ravel()) < 51.179  # df 24, 0.999
    assert 0 < stats.accepted < stats.drafted  # drafts were drawn, some accepted, some rejected
