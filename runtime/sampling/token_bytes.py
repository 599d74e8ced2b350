"""The tokenizer llguidance constrains with: every id the model can emit, with the bytes it spells.

llguidance reads a tokenizer.json by itself, but takes every added token for a special one (its bytes behind the
0xFF marker, never text). Real tokenizers add tokens that are text: Qwen2.5's `<tool_call>` and `</tool_call>`,
`<|fim_prefix|>` ... `<|file_sep|>` are added with `"special": false`, and its model writes a call's `<tool_call>` as
that one token. Taken for specials, a grammar that forces the text `<tool_call>` tokenizes it to that id, then
refuses the id (its bytes are not `<`). So the table is built here:

    id                                       bytes it spells               special
    a vocabulary token (merges, byte
      fallback `<0x0A>`, `▁` for a space)   as llguidance decodes it      no
    an added token, "special": false        its content, UTF-8            no
    an added token, "special": true         its content                   yes: never text; a grammar reaches
                                                                          it only by name (`<|eot_id|>`)
    an id past the tokenizer's (the logits  none                          yes: never allowed
      padded to a round size)

Text a grammar forces is tokenized the way the package's tokenizer does it (added tokens that are text become
their ids), except that a special token's text is spelled with ordinary tokens: a forced `<|endoftext|>` is text,
never the end of the answer.

llguidance asks for that tokenizing from its own threads, through a Python call, while it builds a grammar's lexer
(the text every answer starts with). Two bounds keep that call from stalling the process:
- a text longer than the model can write (its context times the longest token's bytes) is left unread: no answer
  could ever hold it, and a pattern such as ^((a{100}){100}){100}$ forces megabytes. Its tokens are given as none
  (llguidance then fails the grammar, no panic: a panic's backtrace costs ~30 MB held for good) and the refusal
  is noted for the thread that asked (take_refused; llguidance calls back in the thread computing the mask);
- where the package's tokenizer reads a text alone as llguidance does (no space marker put in front: no Metaspace,
  Prepend or ByteLevel add_prefix_space), the text is tokenized by the tokenizers library with the GIL released;
  llguidance's own tokenize_bytes holds it for the whole call (tens of ms per 100 KB), which the server's event
  loop would wait out.
"""

import json
import re
import threading


def engine_tokenizer(
    lg, tokenizer_json: str, vocab_size: int, eos_ids: tuple, max_tokens: int | None = None, encoder=None
) -> tuple:
    """(an llguidance LLTokenizer (module `lg`) over `vocab_size` ids for the package tokenizer `tokenizer_json`
    (its text), whose end-of-text ids are `eos_ids` (the tokenizer's own where empty); its Spelling). It tokenizes
    no text longer than `max_tokens` (the model's context; None: no bound) of its longest tokens; `encoder`: the
    package's tokenizers.Tokenizer, which tokenizes forced text with the GIL released (without it, llguidance's
    own tokenize_bytes does)."""
    eos = list(eos_ids) or None
    # llguidance's own reading, for the bytes of the vocabulary and for tokenizing; no mask is computed with it, so
    # it needs none of the slices that speed masks up
    read = lg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos, slices=[])
    document = json.loads(tokenizer_json)  # parsed once: 2 MB of vocabulary and merges hold the GIL to parse
    added = added_tokens(document)
    text_ids = {i: content for i, (content, special) in added.items() if not special and i < vocab_size}
    tokens = [text_ids[i].encode() if i in text_ids else read.decode_bytes([i]) for i in range(vocab_size)]
    special = [i for i in range(vocab_size) if i not in text_ids and read.is_special_token(i)]
    special_texts = sorted({content for content, is_special in added.values() if is_special and content}, key=len)
    encode = released_encoder(document, encoder)
    max_text_bytes = None if max_tokens is None else max_tokens * max(map(len, tokens), default=1)
    spelling = Spelling(read, tokens, special, read.eos_token, special_texts[::-1], encode, max_text_bytes)
    return lg.LLTokenizer(lg.TokenizerWrapper(spelling), n_vocab=vocab_size, eos_token=eos), spelling


def released_encoder(document: dict, encoder=None):
    """A function text -> ids for the tokenizer `encoder` (a tokenizers.Tokenizer; `document` its tokenizer.json,
    parsed) that tokenizes as llguidance's tokenize_bytes does, with the GIL released (the tokenizers library's
    batch call, without special tokens added around); None without an encoder, or for a tokenizer that puts a space
    marker in front of a text (a Metaspace or Prepend step, ByteLevel's add_prefix_space), which llguidance leaves
    off a text the answer continues with."""
    if _prepends(document) or not hasattr(encoder, "encode_batch"):  # the sampling layer builds no tokenizer
        return None
    batch = getattr(encoder, "encode_batch_fast", encoder.encode_batch)  # ids only (tokenizers >= 0.20)
    return lambda text: batch([text], add_special_tokens=False)[0].ids


def _prepends(document: dict) -> bool:
    """Whether tokenizer.json's normalizer or pre-tokenizer puts something in front of a text, at any depth."""
    stack = [document.get("normalizer"), document.get("pre_tokenizer")]
    while stack:
        step = stack.pop()
        if isinstance(step, list):
            stack += step
        elif isinstance(step, dict):
            kind = step.get("type")
            if kind in ("Metaspace", "Prepend") or kind == "ByteLevel" and step.get("add_prefix_space"):
                return True
            stack += [v for v in step.values() if isinstance(v, (dict, list))]
    return False


def added_tokens(document: dict) -> dict:
    """{id: (content, special)} of tokenizer.json's added_tokens (`document`: its JSON, parsed)."""
    found = {}
    for entry in document.get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            found[entry["id"]] = (entry["content"], bool(entry.get("special")))
    return found


class Spelling:
    """llguidance's TokenizerWrapper protocol: `tokens` (bytes per id), `special_token_ids`, `eos_token_id`,
    `bos_token_id`, and a call that tokenizes UTF-8 bytes (none past `max_text_bytes`, None: no bound)."""

    def __init__(
        self, read, tokens: list, special_ids: list, eos: int, special_texts: list, encode=None, max_text_bytes=None
    ):
        self.tokens, self.special_token_ids, self.eos_token_id, self.bos_token_id = tokens, special_ids, eos, None
        self.special_texts, self.max_text_bytes = special_texts, max_text_bytes
        self._read = read  # tokenizes as the package's tokenizer does (in Rust), special texts included
        self._encode = encode  # the same, with the GIL released (released_encoder), or None
        self._refused = threading.local()  # .length: the last text left unread in this thread
        pattern = b"|".join(re.escape(t.encode()) for t in special_texts)
        self._split = re.compile(b"(" + pattern + b")") if special_texts else None

    def __call__(self, data: bytes) -> list:
        if self.max_text_bytes is not None and len(data) > self.max_text_bytes:
            self._refused.length = len(data)
            return []
        if self._split is None:
            return self._text(data)
        ids = []
        for i, piece in enumerate(self._split.split(data)):
            if piece:  # odd pieces are a special token's text: spelled with text tokens (the greedy trie walk)
                ids += self._read.greedy_tokenize(piece.decode()) if i % 2 else self._text(piece)
        return ids

    def _text(self, data: bytes) -> list:
        """The ids of a text holding no special token's text."""
        if self._encode is not None:
            try:
                return self._encode(data.decode("utf-8"))
            except UnicodeDecodeError:  # llguidance's own reading spells a cut character with byte tokens
                pass
        return self._read.tokenize_bytes(data)

    def take_refused(self) -> tuple | None:
        """(bytes, max_text_bytes) of the last text left unread in this thread since the last call, or None."""
        length, self._refused.length = getattr(self._refused, "length", None), None
        return None if length is None else (length, self.max_text_bytes)
