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

Built once per process and held for its life, the table costs no more than it needs. llguidance's own reading of
the tokenizer (a second copy of the whole tokenizer, ~30 MB for a 50k vocabulary, most of which the heap keeps
after it is dropped) is made only where it is needed: for a tokenizer that is not byte-level BPE, whose bytes per
id llguidance knows how to read, or one that puts a space marker in front, which it tokenizes. A byte-level BPE
vocabulary (GPT-2's, Qwen2's, Llama 3's) is read here, as llguidance reads it; a special text is spelled by the
table's own trie, and bytes that are no UTF-8 by the few tokens that are none either, as llguidance spells them.
"""

import codecs
import json
import re
import threading

# A decoding error handler that writes each stretch of bytes that are no UTF-8 (UnicodeDecodeError's start:end, a
# cut character or one stray byte) as U+DC00 then U+DC00 + each byte: _NOT_UTF8 finds them apart from the text.
_UNITS = "edgelm-utf8-stretches"
codecs.register_error(_UNITS, lambda e: ("".join(chr(0xDC00 + b) for b in b"\0" + e.object[e.start : e.end]), e.end))
_NOT_UTF8 = re.compile("\udc00([\udc80-\udcff]+)")


def engine_tokenizer(
    lg, tokenizer_json: str, vocab_size: int, eos_ids: tuple, max_tokens: int | None = None, encoder=None
) -> tuple:
    """(an llguidance LLTokenizer (module `lg`) over `vocab_size` ids for the package tokenizer `tokenizer_json`
    (its text), whose end-of-text ids are `eos_ids` (the tokenizer's own where empty); its Spelling). It tokenizes
    no text longer than `max_tokens` (the model's context; None: no bound) of its longest tokens; `encoder`: the
    package's tokenizers.Tokenizer, which tokenizes forced text with the GIL released (without it, llguidance's
    own tokenize_bytes does)."""
    eos = list(eos_ids) or None
    document = json.loads(tokenizer_json)  # parsed once: 2 MB of vocabulary and merges hold the GIL to parse
    added = added_tokens(document)
    special_texts = sorted({content for content, is_special in added.values() if is_special and content}, key=len)
    encode = released_encoder(document, encoder)
    table = byte_level_table(document, added, vocab_size) if encode is not None and eos else None
    del document
    read = None
    if table is None:  # llguidance's own reading: no mask is computed with it, so it needs none of the slices
        read = lg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos, slices=[])
        text_ids = {i: content for i, (content, special) in added.items() if not special and i < vocab_size}
        tokens = [text_ids[i].encode() if i in text_ids else read.decode_bytes([i]) for i in range(vocab_size)]
        table = tokens, [i for i in range(vocab_size) if i not in text_ids and read.is_special_token(i)]
    tokens, special = table
    max_text_bytes = None if max_tokens is None else max_tokens * max(map(len, tokens), default=1)
    spelling = Spelling(
        read if encode is None else None, tokens, special, eos[0] if eos else read.eos_token, special_texts[::-1],
        encode, max_text_bytes, {} if encode is None else not_utf8(tokens, special),
    )  # fmt: skip
    if read is not None:  # a special text is spelled with text tokens (the trie walk)
        spelling.spelled = {text: read.greedy_tokenize(text) for text in special_texts}
    del read  # dropped (where not kept) before llguidance's table is made: the table reuses its memory
    wrapper = lg.TokenizerWrapper(spelling)
    made = lg.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)
    spelling.tokens = wrapper.tokens = ()  # copied into llguidance's table: read at construction only
    if not spelling.spelled:
        spelling.spelled = {text: made.greedy_tokenize(text) for text in special_texts}
    return made, spelling


def byte_level_table(document: dict, added: dict, vocab_size: int) -> tuple | None:
    """(bytes per id, special ids) of a byte-level BPE tokenizer (GPT-2's, Qwen2's, Llama 3's), read from its
    tokenizer.json (`document`, parsed; `added`: its added_tokens()) as llguidance's own reading gives them: a
    vocabulary token's characters each stand for a byte (GPT-2's bytes_to_unicode); an added token that is text
    spells its content; a special one, an id past the tokenizer (named `<[id]>`) and the token of byte 0xFF
    (llguidance's mark of a special token, spelled b"") are special. None for any other kind of tokenizer."""
    model, decoder = document.get("model"), document.get("decoder")
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("byte_fallback"):
        return None
    vocab = model.get("vocab")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel" or not isinstance(vocab, dict):
        return None
    tokens = [None] * vocab_size
    for token, i in vocab.items():
        if type(i) is int and 0 <= i < vocab_size:
            try:
                tokens[i] = bytes(map(_BYTE_OF.__getitem__, token))
            except KeyError:  # a character no byte stands for: not a byte-level vocabulary
                return None
    special = set()
    for i, (content, is_special) in added.items():
        if 0 <= i < vocab_size:
            tokens[i] = content.encode()
            if is_special:
                special.add(i)
    for i, data in enumerate(tokens):
        if data is None:
            tokens[i] = f"<[{i}]>".encode()
            special.add(i)
        elif data[:1] == b"\xff" and i not in special:
            tokens[i] = b""
            special.add(i)
    return tokens, sorted(special)


def _bytes_to_unicode() -> dict:
    """{character: the byte it stands for} of GPT-2's byte-level vocabularies: printable bytes stand for
    themselves, the others for the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


_BYTE_OF = _bytes_to_unicode()


def not_utf8(tokens: list, special: list) -> dict:
    """{bytes: id} of the text tokens whose bytes are no UTF-8 (a character's first or last bytes): what spells
    bytes that are none."""
    special = set(special)
    found = {}
    for i, data in enumerate(tokens):
        if data and i not in special:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                found.setdefault(data, i)
    return found


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
    """llguidance's TokenizerWrapper protocol: `tokens` (bytes per id, until llguidance has copied them),
    `special_token_ids`, `eos_token_id`, `bos_token_id`, and a call that tokenizes UTF-8 bytes (none past
    `max_text_bytes`, None: no bound). `read`: llguidance's own reading of the tokenizer, where `encode` (the
    package's tokenizer, the GIL released) is None; `special_texts`: the special tokens' texts, longest first, each
    spelled with text tokens as `spelled` says; `broken`: not_utf8's {bytes: id}, which spells the bytes of a text
    that are no UTF-8 where `encode` tokenizes."""

    def __init__(
        self, read, tokens: list, special_ids: list, eos: int, special_texts: list, encode=None, max_text_bytes=None,
        broken=None,
    ):  # fmt: skip
        self.tokens, self.special_token_ids, self.eos_token_id, self.bos_token_id = tokens, special_ids, eos, None
        self.special_texts, self.max_text_bytes = special_texts, max_text_bytes
        self.spelled = {}  # {special text: its ids as text}, set once the trie that spells them is built
        self._read, self._encode, self._broken = read, encode, broken or {}
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
            if piece:  # odd pieces are a special token's text: spelled with text tokens
                ids += self.spelled[piece.decode()] if i % 2 else self._text(piece)
        return ids

    def _text(self, data: bytes) -> list:
        """The ids of a text holding no special token's text."""
        if self._encode is None:
            return self._read.tokenize_bytes(data)
        try:
            return self._encode(data.decode("utf-8"))
        except UnicodeDecodeError:
            return self._mixed(data)

    def _mixed(self, data: bytes) -> list:
        """The ids of bytes that are not all UTF-8, as llguidance spells them: each run of UTF-8 tokenized alone, each
        stretch that is none (a cut character, a stray byte) by the longest tokens of its bytes first; a byte no
        token spells ends them."""
        ids = []
        for i, run in enumerate(_NOT_UTF8.split(data.decode("utf-8", _UNITS))):
            if i % 2 == 0:
                ids += self._encode(run) if run else []
                continue
            run, at = bytes(ord(c) - 0xDC00 for c in run), 0
            while at < len(run):
                end = next((end for end in range(len(run), at, -1) if run[at:end] in self._broken), None)
                if end is None:
                    return ids
                ids.append(self._broken[run[at:end]])
                at = end
        return ids

    def take_refused(self) -> tuple | None:
        """(bytes, max_text_bytes) of the last text left unread in this thread since the last call, or None."""
        length, self._refused.length = getattr(self._refused, "length", None), None
        return None if length is None else (length, self.max_text_bytes)
