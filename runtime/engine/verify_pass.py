"""The verify pass: one row's next token and k proposed tokens after it in one pass over the weights, with the
logits of all k + 1 positions, and the cache rolled back to the tokens that were accepted.

    # input_ids [1, k + 1] over `cached` positions -> logits [k + 1, V]: position i's distribution of token i + 1
    logits = passes.run(tokens, cached)
    passes.rewind(cached + accepted)  # the rows after are garbage the next pass overwrites (in place) or cut off

Batch 1 only: GroupQueryAttention takes several new tokens over an existing cache for one row (decode.py).
The cache length is what the attention mask says, so a rollback of the in-place cache is a length reset with
no copy: the rejected rows stay in the buffer until the next pass writes over them. The growing cache
(GrowingDecoder) is cut to the kept rows instead.
"""

import numpy as np

from ..package.format import LOGITS


class VerifyPasses:
    """Verify passes over one batch-1 decoder (an InPlaceDecoder or a GrowingDecoder from Engine.decoder)."""

    def __init__(self, decoder):
        self.decoder, self.engine = decoder, decoder.engine
        self.check = getattr(decoder, "check", lambda: None)  # a server job's stop check, asked before each pass
        self.in_place = hasattr(decoder, "buffers")
        self._runs = {}  # in place: tokens per pass -> (run, keep OrtValue, logits [1, n, V], arrays they borrow)
        self.length = None  # growing: the positions its cache holds after the last pass here (None: the prompt's)

    def run(self, tokens: list, cached: int, padding: int = 0) -> np.ndarray:
        """Feed `tokens` at positions cached, cached + 1, ...; returns their logits [len(tokens), V] (valid until
        the next pass). The cache must hold exactly `cached` positions of this row (rewind says so), after
        `padding` masked columns (in place only: a row of the running batch's slot cache, right-aligned)."""
        n = len(tokens)
        # [1, n] ids, [1, padding + cached + n] mask (0 over the padding), [1, n] positions: one row
        input_ids = np.asarray([tokens], dtype=np.int64)
        attention_mask = np.ones((1, padding + cached + n), dtype=np.int64)
        attention_mask[:, :padding] = 0
        position_ids = np.arange(cached, cached + n, dtype=np.int64)[None]
        self.length = cached + n
        if n == 1:  # one token: the decoder's own step, the same pass a plain decode makes
            return self.decoder.run(input_ids, attention_mask, position_ids)[0]
        self.check()
        if not self.in_place:
            logits, self.decoder.past = self.engine.forward(
                input_ids, attention_mask, position_ids, self.decoder.past, logits_to_keep=n
            )
            return logits[0]
        run, keep, logits, _ = self._runs.get(n) or self._bind(n)
        arrays = [
            self.engine.token_input(input_ids),
            *(attention_mask, position_ids)[: self.decoder.id_inputs - 1],
        ]  # the OrtValues below borrow them until the run is over
        run([*(self.engine.runner.value(a) for a in arrays), keep, *self.decoder.cache, *self.decoder.idle])
        return logits[0]

    def rewind(self, cached: int) -> None:
        """Keep the first `cached` positions of the cache: in place nothing moves (the next mask is shorter);
        a growing cache is cut to them."""
        if self.in_place or self.length in (None, cached):  # nothing to cut: the whole draft was accepted
            return
        self.length = cached
        # the OrtValues borrow the arrays: kept until the next rewind, when the graph has made its own present
        self._kept = [np.ascontiguousarray(value.numpy()[:, :, :cached]) for value in self.decoder.past]
        self.decoder.past = [self.engine.runner.value(array, self.engine.device) for array in self._kept]

    def _bind(self, n: int) -> tuple:
        """The in-place run of n tokens that keeps all n positions' logits, bound once per n."""
        decoder, runner = self.decoder, self.engine.runner
        logits = np.zeros((1, n, self.engine.vocab_size), dtype=np.float32)
        keep_array = np.array(n, dtype=np.int64)
        outputs = decoder.outputs | {LOGITS: logits}
        self._runs[n] = (runner.bind(decoder.names, outputs), runner.value(keep_array), logits, keep_array)
        return self._runs[n]
