"""Streaming detokenization: generated token ids in, final text pieces out, stop strings cut.

The engine yields token ids; this layer turns them into text a caller can print as it arrives.
Two things hold text back. A byte-level BPE token can end in the middle of a UTF-8 character, so a
piece is released only once its decode no longer ends with U+FFFD (the `DecodeStream` rule). And a
tail that could be the start of a stop string waits until it either completes one or cannot.

Only a short window of ids is decoded per token, never the whole sequence: `ids[:read]` is
context already emitted, `ids[read:]` is what is pending. Decoding the context with the new ids and
subtracting its text lets decoders that care about the left neighbour (Metaspace, WordPiece) work too.
"""

from __future__ import annotations

import tokenizers

from ..generation_config import stop_strings
from .tokenizer import decode

REPLACEMENT_CHAR = "\ufffd"  # what a decoder shows for bytes that are not (yet) a whole character


class TextStream:
    """Turns one row of generated token ids into text pieces that are final and safe to show.

    The joined pieces (every `push` result, then `finish()`) equal
    `tokenizer.decode(all_ids, skip_special_tokens=False)` cut before the first stop string.
    `prefix_ids` are the prompt's last few ids: context for decoding the first pieces, never emitted.
    They must end on a character boundary, as any encoded prompt does.
    """

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, stop: tuple[str, ...] = (), prefix_ids: list[int] | None = None
    ):
        self._tokenizer = tokenizer
        self._stop = stop_strings(tuple(stop) if isinstance(stop, list) else stop)  # the config's own check
        self._ids = list(prefix_ids or [])
        self._read = len(self._ids)  # ids[:_read] is context, already emitted; ids[_read:] pending
        self._context_len = len(self._decode(self._ids))  # characters that the context decodes to
        self._held = ""  # final text that might be the start of a stop string
        self._finished = False
        self.stopped = False
        self.stop_string: str | None = None
        self.text = ""
        self.token_count = 0  # ids accepted by push, including the one that hit a stop

    def push(self, token_id: int) -> str:
        """Accepts the next generated id and returns the text that became final ("" if none did)."""
        if self.stopped or self._finished:
            raise RuntimeError(
                "TextStream is done (a stop string matched or finish() was called); "
                "start a new TextStream for a new generation"
            )
        self._ids.append(token_id)
        self.token_count += 1
        new_text = self._decode(self._ids)
        # Hold while a character is incomplete: its bytes decode to U+FFFD until the rest arrives.
        if len(new_text) <= self._context_len or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        piece = new_text[self._context_len :]
        # Slide the window: the ids just released become the context for the next piece.
        del self._ids[: self._read]
        self._read = len(self._ids)
        self._context_len = len(self._decode(self._ids))
        return self._emit(piece, final=False)

    def finish(self) -> str:
        """Flushes what is held back at the end of generation, incomplete bytes shown as decode() shows them."""
        if self.stopped or self._finished:
            return ""
        self._finished = True
        piece = self._decode(self._ids)[self._context_len :]
        self._ids.clear()
        return self._emit(piece, final=True)

    def _decode(self, ids: list[int]) -> str:
        return decode(self._tokenizer, ids, skip_special_tokens=False)

    def _emit(self, piece: str, final: bool) -> str:
        """Appends final text to the stop-string check and returns the part that can be shown."""
        held = self._held + piece
        match = self._earliest_stop(held)
        if match is not None:
            start, self.stop_string = match
            self.stopped = True
            out, self._held = held[:start], ""
        else:
            keep = 0 if final else self._stop_prefix_len(held)
            out, self._held = held[: len(held) - keep], held[len(held) - keep :]
        self.text += out
        return out

    def _earliest_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the stop string that starts first in text; ties go to the first listed."""
        found = [(i, n, s) for n, s in enumerate(self._stop) if (i := text.find(s)) >= 0]
        if not found:
            return None
        start, _, stop = min(found)
        return start, stop

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of text that some stop string starts with (0: nothing to hold)."""
        longest = max((len(s) for s in self._stop), default=1)
        for k in range(min(len(text), longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0
