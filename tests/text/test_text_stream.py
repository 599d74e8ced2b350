"""TextStream: streamed pieces join to tokenizer.decode(ids), never show half a character, and cut at stop strings."""

import random

import pytest
import tokenizers
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.text.stream import TextStream
from tokenizers import decoders, models, pre_tokenizers, trainers

REPLACEMENT_CHAR = "\ufffd"

UNICODE_TEXTS = [
    "Hello, world!",
    "😀",
    "I ❤️ emoji 😀😃😄 and more 🚀",
    "Family: 👨‍👩‍👧‍👦, technologist: 👩🏽‍💻",  # ZWJ sequences and a skin-tone modifier
    "Flags 🇯🇵🇫🇷🇺🇸 side by side",  # regional indicator pairs
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Crème brûlée, naïve façade, Ångström, Straße, ąćęłńóśźż",
    "mixed: naïve 日本 🚀 Ω≈ç√ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 <|endoftext|> done",
    "",
]

TRAINING_TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "User: hello there\nAssistant: hi, how can I help?",
    "User: what is the weather\nAssistant: sunny and warm",
    "brown bread and brown sugar for the brown fox",
]


@pytest.fixture(scope="module")
def gpt2(gpt2_tokenizer_dir):
    return tokenizers.Tokenizer.from_file(str(gpt2_tokenizer_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny():
    """A byte-level BPE trained here on a few sentences: runs without the shared folder."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    return tok


@pytest.fixture(params=["tiny", "gpt2"])
def tok(request):
    return request.getfixturevalue(request.param)


def run(tokenizer, ids, stop=(), prefix_ids=None):
    """Pushes ids one by one until done; returns (push pieces, finish piece, stream)."""
    stream = TextStream(tokenizer, stop=stop, prefix_ids=prefix_ids)
    pieces = []
    for token_id in ids:
        pieces.append(stream.push(token_id))
        if stream.stopped:
            break
    return pieces, stream.finish(), stream


# --- streaming decode -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_pieces_join_to_decode_and_never_show_half_a_character(tok, text):
    ids = tok.encode(text).ids
    pieces, last, stream = run(tok, ids)
    assert "".join(pieces) + last == tok.decode(ids, skip_special_tokens=False) == text
    assert stream.text == text
    assert stream.token_count == len(ids)
    assert not stream.stopped and stream.stop_string is None
    for piece in pieces + [last]:
        assert REPLACEMENT_CHAR not in piece


def test_a_character_split_across_tokens_is_held_until_complete(gpt2):
    ids = gpt2.encode("😀").ids
    assert len(ids) >= 2, "the split path is not exercised: 😀 should take several byte-level tokens"
    pieces, last, _ = run(gpt2, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "😀" and last == ""


def test_tiny_tokenizer_splits_unseen_characters_into_byte_tokens(tiny):
    text = "日本 😀"
    ids = tiny.encode(text).ids
    assert len(ids) > len(text)  # unseen characters fall back to one token per byte
    pieces, last, _ = run(tiny, ids)
    assert "" in pieces
    assert "".join(pieces) + last == text


@pytest.mark.parametrize("seed", range(8))
def test_random_ids_join_to_decode_even_with_replacement_chars(tok, seed):
    rng = random.Random(seed)
    vocab_size = tok.get_vocab_size()
    # Single-byte tokens (the 256 base symbols) make incomplete and invalid UTF-8 far more often.
    byte_ids = [tok.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet()]
    ids = [rng.choice(byte_ids) if rng.random() < 0.6 else rng.randrange(vocab_size) for _ in range(300)]
    pieces, last, stream = run(tok, ids)
    assert "".join(pieces) + last == stream.text == tok.decode(ids, skip_special_tokens=False)


def test_incomplete_character_at_the_end_is_flushed_as_decode_shows_it(gpt2):
    ids = gpt2.encode("ok 😀").ids[:-1]  # drop the token that completes the emoji
    pieces, last, _ = run(gpt2, ids)
    assert "".join(pieces) == "ok"
    assert last == gpt2.decode(ids)[len("ok") :] and REPLACEMENT_CHAR in last


def test_prefix_ids_give_context_but_are_never_emitted(tok):
    prompt_ids = tok.encode("User: hello there\nAssistant:").ids
    ids = tok.encode(" hi 😀 brown").ids
    pieces, last, stream = run(tok, ids, prefix_ids=prompt_ids[-3:])
    assert "".join(pieces) + last == stream.text == " hi 😀 brown"


def test_each_push_decodes_a_short_window_not_the_whole_sequence(tiny):
    class CountingTokenizer:
        longest = 0

        def decode(self, ids, skip_special_tokens=False):
            self.longest = max(self.longest, len(ids))
            return tiny.decode(ids, skip_special_tokens=skip_special_tokens)

    counting = CountingTokenizer()
    ids = tiny.encode(" ".join(TRAINING_TEXT * 20)).ids
    pieces, last, _ = run(counting, ids)
    assert "".join(pieces) + last == tiny.decode(ids)
    assert counting.longest <= 4


# --- stop strings --------------------------------------------------------------------------------


def token_starts(tokenizer, text):
    return [start for start, _ in tokenizer.encode(text).offsets]


def test_stop_string_that_is_one_whole_token(gpt2):
    text = "Hello world, goodbye"
    ids = gpt2.encode(text).ids
    assert gpt2.decode([ids[1]]) == " world"
    pieces, last, stream = run(gpt2, ids, stop=(" world",))
    assert "".join(pieces) + last == stream.text == "Hello"
    assert stream.stopped and stream.stop_string == " world"
    assert stream.token_count == 2


def test_stop_string_spanning_several_tokens(tok):
    text = "User: hello there\nAssistant: hi"
    ids = tok.encode(text).ids
    assert len(tok.encode("\nAssistant:").ids) >= 2
    pieces, last, stream = run(tok, ids, stop=("\nAssistant:",))
    assert "".join(pieces) + last == stream.text == "User: hello there"
    assert stream.stopped and stream.stop_string == "\nAssistant:"
    assert stream.token_count < len(ids)  # the tokens after the stop were never pushed


def test_stop_string_starting_mid_token(tok):
    text = "the brown fox"
    stop = "rown f"
    assert text.index(stop) not in token_starts(tok, text), "stop should begin inside a token"
    pieces, last, stream = run(tok, tok.encode(text).ids, stop=(stop,))
    assert "".join(pieces) + last == "the b"
    assert stream.stop_string == stop


def test_earliest_of_several_stop_strings_wins(tok):
    text = "User: what is the weather\nAssistant: sunny"
    pieces, last, stream = run(tok, tok.encode(text).ids, stop=("sunny", "weather", "\nAssistant:"))
    assert "".join(pieces) + last == "User: what is the "
    assert stream.stop_string == "weather"


def test_stop_strings_starting_at_the_same_place_go_to_the_first_listed(tok):
    assert tok.encode("the brown fox").tokens[1] == "Ġbrown"  # both stops complete with this one token
    _, _, stream = run(tok, tok.encode("the brown fox").ids, stop=("brown", "bro"))
    assert stream.text == "the " and stream.stop_string == "brown"


def test_a_shorter_stop_string_completing_first_stops_before_a_longer_one(tok):
    _, _, stream = run(tok, tok.encode("the brown fox").ids, stop=("brown fox", "brown"))
    assert stream.text == "the " and stream.stop_string == "brown"  # "brown fox" was never seen whole


def test_stop_string_at_the_very_start(tok):
    pieces, last, stream = run(tok, tok.encode("User: hi").ids, stop=("User:",))
    assert pieces + [last] == [""] * (len(pieces) + 1)
    assert stream.stopped and stream.text == ""


def test_stop_string_never_completed_is_released_by_finish(tok):
    text = "sunny and warm\nAssist"
    pieces, last, stream = run(tok, tok.encode(text).ids, stop=("\nAssistant:",))
    assert "".join(pieces) == "sunny and warm"  # "\nAssist" could still become the stop string
    assert last == "\nAssist"
    assert stream.text == text and not stream.stopped


def test_stop_string_matching_partly_then_diverging_comes_out(tok):
    text = "hello\nAssisted by the brown fox"
    ids = tok.encode(text).ids
    stream = TextStream(tok, stop=("\nAssistant:",))
    held_back = False
    for i, token_id in enumerate(ids):
        stream.push(token_id)
        held_back |= len(stream.text) < len(tok.decode(ids[: i + 1]))
    assert held_back
    assert stream.text.startswith("hello\nAssisted")  # released before the end, once it diverged
    stream.finish()
    assert stream.text == text and not stream.stopped


def test_stop_string_made_of_a_character_split_across_tokens(gpt2):
    text = "Done 😀 and more"
    pieces, last, stream = run(gpt2, gpt2.encode(text).ids, stop=("😀",))
    assert "".join(pieces) + last == "Done "
    assert stream.stop_string == "😀"


def test_push_after_stop_raises(tok):
    ids = tok.encode("User: hi\nAssistant: hello").ids
    _, _, stream = run(tok, ids, stop=("\nAssistant:",))
    assert stream.stopped
    with pytest.raises(RuntimeError, match="new TextStream"):
        stream.push(ids[-1])


def test_push_after_finish_raises(tiny):
    stream = TextStream(tiny)
    stream.push(tiny.encode("hi").ids[0])
    stream.finish()
    assert stream.finish() == ""
    with pytest.raises(RuntimeError):
        stream.push(0)


@pytest.mark.parametrize("stop", [("",), ("ok", ""), "###"])
def test_bad_stop_strings_are_refused(tiny, stop):
    with pytest.raises(GenerationOptionError, match="stop"):
        TextStream(tiny, stop=stop)
