"""Prompt lookup: propose the tokens that followed the last occurrence of the row's latest n-gram (Saxena's
prompt-lookup decoding; transformers' prompt_lookup_num_tokens, llama.cpp's lookup).

Work grounded in the prompt (quote, rewrite, extract, edit code, answer from a document) repeats its spans, so
the tokens after an earlier match are often the model's next tokens; one verify pass then emits several.
Open-ended text rarely matches, and a proposal the model rejects costs a wider pass for one token: the proposer
adapts its draft length to what was accepted, and switches itself off for a while when acceptance falls low.
"""

from dataclasses import dataclass, field

import numpy as np

MAX_NGRAM = 3  # the longest suffix looked up; longer matches are tried first (a longer match predicts better)
MIN_NGRAM = 2  # a single repeated token (" the") predicts little and would keep proposing
# Tokens proposed per pass at most. Copying a passage or a repeating run accepts long runs, and a verify pass of
# 17 positions costs far less than 17 one-token steps; the draft grows to it only while drafts are accepted whole.
MAX_DRAFT = 16
# The first draft after the start and after each pause: short, since each refused token widens the pass
# (benchmarks/speculative.py --pass-cost measures by how much) and open text refuses most; it grows by 2 a pass
# while accepted whole, so a quote reaches 16 in its 8th pass.
START_DRAFT = 2
# The off-switch: over the last WINDOW proposed tokens, an acceptance under MIN_ACCEPTANCE stops proposing for
# PAUSE generated tokens, after which the proposer tries again (a text may turn to quoting later). The window is
# judged as soon as PATIENCE of its tokens were refused, before it is full: on open text a window of 24 tokens
# takes a dozen passes to fill, each refused token costing a wider pass, and in 64 new tokens that is what the
# switch would lose. A proposer given a longer max_pause makes each pause that follows another without a window
# of good acceptance between them twice as long, up to it: on text that never pays, the windows spent trying
# again become rare.
WINDOW = 24
PATIENCE = 8
MIN_ACCEPTANCE = 0.3
PAUSE = 48
MAX_PAUSE = 4 * PAUSE  # prompt lookup's longest pause: a quote that starts late waits this long at most


@dataclass
class Adaptive:
    """A proposer's draft length and off-switch, shared by prompt lookup and a draft model: the length grows by
    `grow` while whole drafts are accepted and shrinks to what was, and a window of low acceptance pauses the
    proposer for PAUSE generated tokens (one verify pass each while it proposes nothing), twice as long after each
    further low window, up to max_pause."""

    max_draft: int = MAX_DRAFT
    start: int = START_DRAFT  # the draft length at first and after each pause
    draft: int = START_DRAFT  # the current draft length, adapted after each verify pass
    grow: int = 2
    min_acceptance: float = MIN_ACCEPTANCE  # the off-switch's threshold over the window
    window: int = WINDOW  # proposed tokens the threshold is judged over
    patience: int = PATIENCE  # refused tokens after which the window is judged before it is full
    max_pause: int = PAUSE  # the longest pause (PAUSE: every pause is PAUSE long)
    paused: int = 0  # generated tokens left before proposing again (the off-switch)
    pause: int = 0  # the last pause's length, 0 after a window of good acceptance
    recent: list = field(default_factory=list)  # (drafted, accepted) of the last passes, `window` tokens at most

    def pausing(self) -> bool:
        """Whether the off-switch holds the proposer off for this pass (which counts it down)."""
        if self.paused > 0:
            self.paused -= 1
            return True
        return False

    def accepted(self, drafted: int, accepted: int) -> None:
        """After a verify pass: grow the draft when all of it was accepted, shrink it to what was, and pause
        after a window (or `patience` refused tokens) of low acceptance."""
        if drafted == 0:
            return
        grown = min(self.max_draft, self.draft + self.grow)
        self.draft = grown if accepted == drafted else max(1, accepted + 1)
        self.recent.append((drafted, accepted))
        while sum(d for d, _ in self.recent) > self.window and len(self.recent) > 1:
            self.recent.pop(0)
        total, good = sum(d for d, _ in self.recent), sum(a for _, a in self.recent)
        if total < self.window and total - good < self.patience:
            return
        if good >= self.min_acceptance * total:
            if total >= self.window:  # a whole window that pays: the next pause starts at PAUSE again
                self.pause = 0
            return
        self.pause = min(self.max_pause, 2 * self.pause if self.pause else PAUSE)
        self.paused, self.recent, self.draft = self.pause, [], self.start


@dataclass
class NgramProposer(Adaptive):
    """One row's prompt-lookup proposer: propose(seen, limit) -> draft ids, then accepted(drafted, accepted)."""

    max_pause: int = MAX_PAUSE
    max_ngram: int = MAX_NGRAM
    min_ngram: int = MIN_NGRAM
    # The row's no_repeat_ngram_size N (0: none). Copying after a match of n ids repeats an N-gram from the copy's
    # (N - n)th id on, which that filter bans: a match proposes N - 1 - n ids at most, none when n >= N - 1.
    no_repeat: int = 0

    def propose(self, seen: list, limit: int) -> list:
        """Up to min(limit, draft length) ids that followed the latest earlier occurrence of seen's last n ids
        (n from max_ngram down to min_ngram); [] when nothing matches or the proposer is paused."""
        limit = min(limit, self.draft)
        if self.pausing() or limit <= 0 or len(seen) <= self.min_ngram:
            return []
        ids = np.asarray(seen, dtype=np.int64)
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            allowed = self.no_repeat - 1 - n if self.no_repeat else limit
            start = latest_match(ids, n) if allowed > 0 else None
            if start is not None:
                return continuation(ids, start + n, min(limit, allowed))
        return []


def continuation(ids: np.ndarray, start: int, limit: int) -> list:
    """`limit` ids copied from `start` on, a copy that reaches the end going on over the ids it has copied (an
    overlapping copy, as LZ77's): a match one period back in a repeating run proposes the run's next `limit`
    ids, not the one id left before the end."""
    # [T] int64 -> list of `limit` ids at most (start < T)
    period = len(ids) - start  # the copy repeats ids[start:] while it runs past the end
    return [int(ids[start + j % period]) for j in range(limit)]


def latest_match(ids: np.ndarray, n: int) -> int | None:
    """Where the latest earlier occurrence of ids' last n ids starts (one that some id follows), or None."""
    # [T] int64 -> index
    suffix = ids[-n:]
    starts = np.flatnonzero(ids[: len(ids) - n] == suffix[0])  # candidate starts: an id follows each n-gram
    for offset in range(1, n):
        starts = starts[ids[starts + offset] == suffix[offset]]
    return int(starts[-1]) if len(starts) else None
