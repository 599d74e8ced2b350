"""The distinct ids of each row's history and how often each occurs, kept up to date as the rows grow.

The repetition filters need, per row and per step, the set of ids seen (repetition_penalty) and the count of each
generated id (frequency and presence penalties). Recounting the whole history every step costs O(length) in
list-to-array conversions and np.unique; a Tally follows one row's id list and counts only the ids appended since
the step before, so a step costs O(1) in the history's length (and O(distinct ids) to apply the penalties).
"""

import numpy as np


class Tally:
    """The distinct ids of one list of token ids (in order of first appearance) and how often each occurs.

    The list is followed as it grows: each update counts the ids appended since the last. A list that shrank, or
    whose last counted id changed, is counted again from the start.
    """

    def __init__(self, source):
        self.source = source  # held: its id() cannot be reused while this tally follows it
        self.length = 0
        self.last = None  # the last id counted, to notice a list rewritten in place
        self.where: dict[int, int] = {}  # id -> its index in ids
        self.ids = np.empty(64, dtype=np.int64)
        self.counts = np.empty(64, dtype=np.int64)

    def update(self) -> tuple[np.ndarray, np.ndarray]:
        """([n] int64 distinct ids, [n] int64 counts) of the list as it is now; views, valid until the next update."""
        source = self.source
        if len(source) < self.length or (self.length and source[self.length - 1] != self.last):
            self.length, self.where = 0, {}
        n = len(self.where)
        for token in source[self.length :]:
            index = self.where.setdefault(int(token), n)
            if index == n:
                if n == self.ids.size:
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                    self.counts = np.concatenate([self.counts, np.empty_like(self.counts)])
                self.ids[n], self.counts[n] = token, 0
                n += 1
            self.counts[index] += 1
        self.length = len(source)
        self.last = source[-1] if self.length else None
        return self.ids[:n], self.counts[:n]


class Tallies:
    """One Tally per row list, for the lists of the latest call only (a finished row's is dropped)."""

    def __init__(self):
        self.by_list: dict[int, Tally] = {}

    def update(self, lists: list) -> list[tuple[np.ndarray, np.ndarray]]:
        # [B] id lists -> [B] (distinct ids, counts)
        followed = {}
        for ids in lists:
            tally = followed.get(id(ids)) or self.by_list.get(id(ids))
            if tally is None or tally.source is not ids:
                tally = Tally(ids)
            followed[id(ids)] = tally
        self.by_list = followed
        return [followed[id(ids)].update() for ids in lists]
