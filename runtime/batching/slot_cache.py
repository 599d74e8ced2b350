"""The key/value cache of a running batch (continuous batching, runtime/batching/scheduler.py): rows join and leave it
between steps, each with its own length, all decoded by one forward pass per step.

    buffers     one [row_capacity, H, capacity, D] array per cache tensor, written in place by the graph
    rows 0..n-1 in use, right-aligned at one shared width W: row r holds its lengths[r] positions in
                columns [W - lengths[r], W); columns left of them belong to no one and are masked
    step        attention_mask [n, W + 1], 1 over each row's positions and the new one; position_ids [n, 1] =
                lengths (each row counts its own); the graph writes every row's new key and value at column W

    verify      (several tokens per pass, runtime/speculative/) one row alone: attention_mask [1, W + k] over its
                slot, k new tokens written at columns [W, W + k); settle() then keeps each row's accepted ones and
                moves the rows that kept fewer right, so that all are right-aligned at the new W

This is the graph contract's own layout for a left-padded batch (every row holds W positions, the padding masked
by the attention bias: export/graph/attention.py's cache_lengths), so the same graph runs it. A masked column adds
exp(MASKED) = exactly 0 to a row's attention, whatever it holds, so a row's logits do not depend on its
neighbours' positions (fp32 graphs; int8 graphs quantize activations per pass, over every row at once).

A joining row is prefilled alone (batch 1) and its cache copied in at [W - L, W), after moving every row right when L >
W; it takes the next slot. A leaving row's slot takes the last row. A step runs the n rows in use, no more. When W + 1 would pass the capacity, or
when every row leaves more than half of W masked, the columns all rows have masked are dropped (every row moves left);
if that is not enough the buffers grow, doubling up to the model's context. The buffers go as soon as the batch is
empty.
"""

import numpy as np

from ..engine.verify_pass import VerifyPasses


class SlotCache:
    """Up to `max_rows` rows of cache; `rows` holds the caller's object for each slot, in slot order."""

    column_step = 64  # capacities are multiples of this: few reallocations while a batch widens

    def __init__(self, engine, max_rows: int, max_width: int):
        self.engine, self.max_rows, self.max_width = engine, max_rows, max_width
        self.rows: list = []  # the caller's row objects; slot i's cache is buffers[.][i]
        self.lengths: list = []  # positions each row holds (prompt + tokens fed so far)
        self.width = 0  # W: columns in use, the same for every row
        self.buffers: list | None = None
        self._decoders: dict = {}  # n -> a decoder over the first n rows; ("verify", slot) -> one row's passes

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[2] if self.buffers else 0

    @property
    def free(self) -> int:
        return self.max_rows - len(self.rows)

    def join(self, row, source: list, length: int, source_row: int = 0, source_start: int = 0) -> None:
        """Add `row`, whose `length` positions are in columns [source_start, source_start + length) of `source`'s
        row `source_row` (a prefill decoder's buffers, one per cache tensor: batch 1 from column 0, or a
        left-padded batch)."""
        if not self.free:
            raise ValueError(f"the running batch is full ({self.max_rows} rows)")
        self._fit(len(self.rows) + 1, joining=length)
        if length > self.width:  # every row moves right to make room on the left
            shift, n = length - self.width, len(self.rows)
            for buffer in self.buffers:
                buffer[:n, :, shift:length] = buffer[:n, :, : self.width]  # numpy copies overlapping ranges safely
            self.width = length
        slot, start = len(self.rows), self.width - length
        self.rows.append(row)
        self.lengths.append(length)
        for buffer, prefilled in zip(self.buffers, source):
            buffer[slot, :, start : self.width] = prefilled[source_row, :, source_start : source_start + length]

    def reserve(self, rows: int, width: int) -> None:
        """Make room for `rows` rows and a joining row of `width` positions in one go: rows that join together
        cost one reallocation of the buffers, not one per doubling (each a copy into freshly faulted memory)."""
        if rows > len(self.rows):
            self._fit(min(rows, self.max_rows), joining=width)

    def leave(self, slot: int) -> None:
        """Free `slot` at once: the last row moves into it (its object too, in `rows`)."""
        last = len(self.rows) - 1
        if slot != last:
            self._move(last, slot)
        self.rows.pop()
        self.lengths.pop()
        if not self.rows:  # nothing left to decode: the memory goes now
            self.buffers, self._decoders, self.width = None, {}, 0

    def step(self, token_ids: np.ndarray) -> np.ndarray:
        """Feed one token per row ([n] int64, slot order); returns the logits [n, V], valid until the next step."""
        n = len(self.rows)
        self._fit(n)
        lengths = np.asarray(self.lengths, dtype=np.int64)
        columns = np.arange(self.width + 1)
        attention_mask = (columns >= self.width - lengths[:, None]).astype(np.int64)  # [n, W + 1]
        logits = self._decoder(n).run(token_ids.reshape(n, 1), attention_mask, lengths.reshape(n, 1))
        self.width += 1
        self.lengths = [length + 1 for length in self.lengths]
        return logits[:, -1, :]

    def reserve_columns(self, columns: int) -> None:
        """Room for `columns` more columns after W, for verify passes (several tokens per row) before settle()."""
        self._fit(len(self.rows), joining=self.width + columns - 1)

    def verify(self, slot: int, tokens: list) -> np.ndarray:
        """Feed several tokens to row `slot` alone: a batch-1 verify pass over its slot (runtime/engine/verify_pass.py),
        its new keys and values written at columns W, W + 1, ... (reserve_columns first). Returns their logits
        [len(tokens), V], valid until the next pass. W and the row's length stay as they are until settle()."""
        key = ("verify", slot)
        if key not in self._decoders:
            views = [buffer[slot : slot + 1] for buffer in self.buffers]  # a row of a C-contiguous array: one block
            self._decoders[key] = VerifyPasses(self.engine.decoder(1, self.capacity, buffers=views))
        length = self.lengths[slot]
        return self._decoders[key].run(tokens, length, padding=self.width - length)

    def settle(self, kept: list) -> None:
        """After verify passes: row r keeps the first kept[r] of the columns its pass wrote at W, W + 1, ...; W grows by
        the most any row kept, and every row that kept fewer moves right to stay right-aligned."""
        most = max(kept, default=0)
        for slot, count in enumerate(kept):
            if count < most:  # numpy copies overlapping ranges safely
                start, shift = self.width - self.lengths[slot], most - count
                for buffer in self.buffers:
                    buffer[slot, :, start + shift : self.width + most] = buffer[slot, :, start : self.width + count]
            self.lengths[slot] += count
        self.width += most

    def _move(self, source: int, slot: int) -> None:
        """Row `source` into `slot`: its positions' cache, its object and its length (`source` is then free)."""
        start = self.width - self.lengths[source]
        for buffer in self.buffers:
            buffer[slot, :, start : self.width] = buffer[source, :, start : self.width]
        self.rows[slot], self.lengths[slot] = self.rows[source], self.lengths[source]

    def _fit(self, rows: int, joining: int = 0) -> None:
        """Make the buffers hold `rows` rows and one more column than max(W, joining), a joining row's length:
        drop the columns every row has masked when that is needed (or when they are most of W), then grow if
        it is not enough."""
        lead = self.width - max(self.lengths, default=0)  # columns masked for every row
        if lead and (max(self.width, joining) + 1 > self.capacity or 2 * lead > self.width):
            n = len(self.rows)
            for buffer in self.buffers:
                buffer[:n, :, : self.width - lead] = buffer[:n, :, lead : self.width]
            self.width -= lead
        width = max(self.width, joining) + 1
        if self.buffers is not None and width <= self.capacity and rows <= len(self.buffers[0]):
            return
        capacity, row_capacity = self.capacity, len(self.buffers[0]) if self.buffers else 0
        if width > capacity:  # doubling, in whole column steps, up to the model's context
            capacity = max(width, min(self.max_width, 2 * capacity))
            capacity = min(-(-capacity // self.column_step) * self.column_step, max(width, self.max_width))
        if rows > row_capacity:
            row_capacity = min(self.max_rows, max(rows, 2 * row_capacity))
        shape = (row_capacity, self.engine.kv_heads, capacity, self.engine.head_size)
        old, n = self.buffers, len(self.rows)
        # zeros, not empty: a masked column's value is multiplied by an attention weight of exactly 0, and 0 x NaN
        # (what uninitialised memory may hold) would not be 0
        tensors = self.engine.cache_tensors
        self.buffers = [np.zeros(shape, dtype=self.engine.io.cache_dtype) for _ in range(tensors)]
        if old is not None:
            for new, previous in zip(self.buffers, old):
                new[:n, :, : self.width] = previous[:n, :, : self.width]
        self._decoders = {}

    def _decoder(self, n: int):
        """The decoder over the first n rows (views of the buffers: the first rows of a C-contiguous array are one
        contiguous block), made once per n while these buffers last."""
        if n not in self._decoders:
            views = [buffer[:n] for buffer in self.buffers]
            self._decoders[n] = self.engine.decoder(n, self.capacity, buffers=views)
        return self._decoders[n]
