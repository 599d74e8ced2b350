"""The distinct ids of each row's history and how often each occurs, kept up to date as the rows grow.

The repetition filters need, per row and per step, the set of ids seen (repetition_penalty) and the count of each
generated id (frequency and presence penalties). Recounting the whole history every step costs O(length) in
list-to-array conversions and np.unique; a Tally follows one row's id list and counts only the ids appended since
the step before, so a step costs O(1) in the history's length (and O(distinct ids) to apply the penalties).
A SeenTally follows a row's seen and generated lists together: its seen ids, and aligned with them one value per id
made from how often it was generated, so both penalties read and write the row at the same ids once.
"""

import numpy as np


class Tally:
    """The distinct ids of one list of token ids (in order of first appearance) and how often each occurs.

    The list is followed as it grows: each update counts the ids appended since the last. A list that shrank, or
    whose last counted id changed, is counted again from the start (and `recounts` goes up by one). counting=False
    keeps the ids alone (update gives None for the counts): each NumPy scalar write costs microseconds right after
    a model step.
    """

    def __init__(self, source, counting: bool = True):
        self.source = source  # held: its id() cannot be reused while this tally follows it
        self.length = 0
        self.last = None  # the last id counted, to notice a list rewritten in place
        self.recounts = 0
        self.where: dict[int, int] = {}  # id -> its index in ids
        self.ids = np.empty(64, dtype=np.int64)
        self.counts = np.empty(64, dtype=np.int64) if counting else None

    def follows(self, source) -> bool:
        return self.source is source

    def update(self) -> tuple[np.ndarray, np.ndarray | None]:
        """([n] int64 distinct ids, [n] int64 counts, or None when not counting) of the list as it is now; views,
        valid until the next update."""
        source = self.source
        if len(source) < self.length or (self.length and source[self.length - 1] != self.last):
            self.length, self.where, self.recounts = 0, {}, self.recounts + 1
        n, counts = len(self.where), self.counts
        for token in source[self.length :]:
            index = self.where.setdefault(int(token), n)
            if index == n:
                if n == self.ids.size:
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                    if counts is not None:
                        counts = self.counts = np.concatenate([counts, np.empty_like(counts)])
                self.ids[n] = token
                if counts is not None:
                    counts[n] = 0
                n += 1
            if counts is not None:
                counts[index] += 1
        self.length = len(source)
        self.last = source[-1] if self.length else None
        return self.ids[:n], None if counts is None else counts[:n]


class SeenTally:
    """One row's distinct seen ids (a Tally of its seen list) and, aligned with them, float32 weigh(count) for each
    id generated `count` times, 0 for an id never generated; weigh=None keeps no values.

    The generated list is followed as the seen list is (growing at its end; counted again when it shrank or its
    last id changed, or when the seen list was). update gives None while a generated id is missing from the seen
    ids: the values could not be aligned with them.
    """

    def __init__(self, seen, generated, weigh=None):
        self.seen, self.generated, self.weigh = Tally(seen, counting=False), generated, weigh
        self.length, self.last, self.recounts = 0, None, None
        self.counts: dict[int, int] = {}  # index in the seen ids -> how often that id was generated
        self.values = np.zeros(self.seen.ids.size, dtype=np.float32)

    def follows(self, seen, generated) -> bool:
        return self.seen.source is seen and self.generated is generated

    def index(self, token: int) -> int | None:
        """Where `token` is among the seen ids (and their values) of the last update; None if it was not seen."""
        return self.seen.where.get(token)

    def update(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """([n] int64 distinct seen ids, [n] float32 values or None), views valid until the next update; or None."""
        ids, _ = self.seen.update()
        if self.weigh is None:
            return ids, None
        generated = self.generated
        if (
            self.recounts != self.seen.recounts
            or len(generated) < self.length
            or (self.length and generated[self.length - 1] != self.last)
        ):
            self.length, self.last, self.recounts, self.counts = 0, None, self.seen.recounts, {}
            self.values[:] = 0
        if self.values.size < self.seen.ids.size:
            self.values = np.concatenate([self.values, np.zeros(self.seen.ids.size - self.values.size, np.float32)])
        where, counts, values = self.seen.where, self.counts, self.values
        for token in generated[self.length :]:
            index = where.get(int(token))
            if index is None:  # not a suffix of the seen list: count again from the start next time
                self.recounts = None
                return None
            count = counts[index] = counts.get(index, 0) + 1
            values[index] = self.weigh(count)  # rounded to float32 as .astype(np.float32) rounds
        self.length = len(generated)
        self.last = generated[-1] if self.length else None
        return ids, values[: ids.size]


class Tallies:
    """One tally per row list (or per row's pair of lists), for the rows of the latest call only (a finished row's
    is dropped). make(*lists of one row) starts a tally: Tally by default."""

    def __init__(self, make=Tally):
        self.make = make
        self.by_list: dict[tuple, Tally] = {}  # the id() of each of a row's lists -> its tally
        self.latest: list = []  # the rows' tallies at the latest update, in row order

    def update(self, lists: list, *more: list) -> list:
        # [B] id lists (, [B] id lists ...) -> [B] what each tally's update gives
        followed, keys = {}, []
        for row in zip(lists, *more):
            key = tuple(map(id, row))
            tally = followed.get(key) or self.by_list.get(key)
            if tally is None or not tally.follows(*row):
                tally = self.make(*row)
            followed[key] = tally
            keys.append(key)
        self.by_list, self.latest = followed, [followed[key] for key in keys]
        return [tally.update() for tally in self.latest]
