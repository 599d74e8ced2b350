"""Prompt lookup's off-switch on text that refuses its proposals: it starts short, judges its window as soon as
enough of it was refused, and pauses longer after each window that fails again (runtime/speculative/ngram.py)."""

from edgelm.runtime.speculative import ngram
from edgelm.runtime.speculative.ngram import NgramProposer

REPEATING = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]  # a match of 3 ids, and a copy as long as any limit asks


def test_prompt_lookup_starts_with_a_two_token_draft_and_grows_by_two_while_accepted_whole():
    proposer = NgramProposer()
    assert proposer.propose(REPEATING, limit=16) == [3, 1]
    proposer.accepted(2, 2)
    assert proposer.propose(REPEATING, limit=16) == [3, 1, 2, 3]


def test_refused_tokens_pause_prompt_lookup_before_its_window_is_full():
    """Passes whose drafts are refused whole (2 tokens, then 1 each): PATIENCE refused tokens, of WINDOW's 24
    proposed, and it pauses."""
    proposer, refused = NgramProposer(), 0
    while not proposer.paused:
        drafted = len(proposer.propose(REPEATING, limit=16))
        proposer.accepted(drafted, 0)
        refused += drafted
    assert refused == ngram.PATIENCE < ngram.WINDOW
    assert proposer.paused == ngram.PAUSE and proposer.draft == ngram.START_DRAFT


def test_refused_tokens_do_not_pause_prompt_lookup_while_it_accepts_enough():
    """A window judged early for its refused tokens, but with a third of it accepted, keeps proposing; a full
    window that pays makes the next pause PAUSE again."""
    proposer = NgramProposer(pause=2 * ngram.PAUSE)
    for _ in range(4):
        proposer.accepted(4, 2)  # 8 refused of 16: judged, 50% accepted
        assert not proposer.paused
    assert proposer.pause == 2 * ngram.PAUSE  # a window judged before it is full: the pause length is kept
    proposer.accepted(8, 4)  # the window full (24 tokens), half accepted
    assert not proposer.paused and proposer.pause == 0


def test_prompt_lookup_pauses_twice_as_long_after_each_window_that_fails_again_up_to_max_pause():
    proposer, lengths = NgramProposer(), []
    for _ in range(4):
        proposer.accepted(ngram.PATIENCE, 0)
        lengths.append(proposer.paused)
        proposer.paused = 0
    assert lengths == [ngram.PAUSE, 2 * ngram.PAUSE, 4 * ngram.PAUSE, ngram.MAX_PAUSE]
    assert ngram.MAX_PAUSE == 4 * ngram.PAUSE
