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
"""

import json
import re


def engine_tokenizer(lg, tokenizer_json: str, vocab_size: int, eos_ids: tuple) -> tuple:
    """(an llguidance LLTokenizer (module `lg`) over `vocab_size` ids for the package tokenizer `tokenizer_json`
    (its text), whose end-of-text ids are `eos_ids` (the tokenizer's own where empty); the texts of its special
    tokens, longest first)."""
    eos = list(eos_ids) or None
    # llguidance's own reading, for the bytes of the vocabulary and for tokenizing; no mask is computed with it, so
    # it needs none of the slices that speed masks up
    read = lg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos, slices=[])
    added = added_tokens(tokenizer_json)
    text_ids = {i: content for i, (content, special) in added.items() if not special and i < vocab_size}
    tokens = [text_ids[i].encode() if i in text_ids else read.decode_bytes([i]) for i in range(vocab_size)]
    special = [i for i in range(vocab_size) if i not in text_ids and read.is_special_token(i)]
    special_texts = sorted({content for content, is_special in added.values() if is_special and content}, key=len)
    spelling = Spelling(read, tokens, special, read.eos_token, special_texts[::-1])
    return lg.LLTokenizer(lg.TokenizerWrapper(spelling), n_vocab=vocab_size, eos_token=eos), spelling.special_texts


def added_tokens(tokenizer_json: str) -> dict:
    """{id: (content, special)} of tokenizer.json's added_tokens."""
    found = {}
    for entry in json.loads(tokenizer_json).get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            found[entry["id"]] = (entry["content"], bool(entry.get("special")))
    return found


class Spelling:
    """llguidance's TokenizerWrapper protocol: `tokens` (bytes per id), `special_token_ids`, `eos_token_id`,
    `bos_token_id`, and a call that tokenizes UTF-8 bytes."""

    def __init__(self, read, tokens: list, special_ids: list, eos: int, special_texts: list):
        self.tokens, self.special_token_ids, self.eos_token_id, self.bos_token_id = tokens, special_ids, eos, None
        self.special_texts = special_texts
        self._read = read  # tokenizes as the package's tokenizer does (in Rust), special texts included
        pattern = b"|".join(re.escape(t.encode()) for t in special_texts)
        self._split = re.compile(b"(" + pattern + b")") if special_texts else None

    def __call__(self, data: bytes) -> list:
        if self._split is None:
            return self._read.tokenize_bytes(data)
        ids = []
        for i, piece in enumerate(self._split.split(data)):
            if piece:  # odd pieces are a special token's text: spelled with text tokens (the greedy trie walk)
                ids += self._read.greedy_tokenize(piece.decode()) if i % 2 else self._read.tokenize_bytes(piece)
        return ids
