"""A job for the continuous-batching scheduler that records what it is handed."""

import threading

import pytest


class Job:
    """The scheduler's job interface, recording what it is handed. `at_boundary(count)` runs in the scheduler's
    thread at every step boundary the job sees (count from 1): a deterministic place to submit more jobs."""

    def __init__(self, batch, at_boundary=None):
        self.batch, self.at_boundary = batch, at_boundary
        self.pieces, self.error, self.boundaries, self.stop = [], None, 0, None
        self.ended = threading.Event()

    def start(self):
        pass

    def check(self):
        self.boundaries += 1
        if self.at_boundary:
            self.at_boundary(self.boundaries)
        if self.stop:
            raise RuntimeError(self.stop)

    def piece(self, piece):
        self.pieces.append(piece)

    def finish(self, error):
        self.error = error
        self.ended.set()

    def wait(self):
        assert self.ended.wait(30), "the job did not end"
        return self


def same(batched, alone) -> None:
    """Batched completions are the ones each prompt gets alone: tokens, text, finish and log-probs."""
    assert [c.token_ids for c in batched] == [c.token_ids for c in alone]
    assert [(c.text, c.finish_reason, c.stop_string) for c in batched] == [
        (c.text, c.finish_reason, c.stop_string) for c in alone
    ]
    for b, a in zip(batched, alone):
        if a.logprobs is not None:  # the same distribution; summed over more (masked) columns, so to rounding
            assert [e["token_id"] for e in b.logprobs] == [e["token_id"] for e in a.logprobs]
            assert [e["logprob"] for e in b.logprobs] == pytest.approx([e["logprob"] for e in a.logprobs], abs=1e-5)
