"""A job for the continuous-batching scheduler that records what it is handed."""

import threading


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
