"""The Python API as a user meets it: streaming, stop strings, finish reasons, threads, pipeline().
Its error messages for bad input are in test_runtime_errors.py, package verification in test_load_verification.py."""

import threading
from concurrent.futures import ThreadPoolExecutor

import edgelm.runtime as rt
import pytest
from edgelm.runtime import GenerationOptionError, PromptError
from pass_counter import count_passes
from user_prompts import PROMPTS

EOS = 0
REPLACEMENT_CHAR = "\ufffd"


@pytest.fixture(scope="module")
def gpt2_vocab_model(gpt2_vocab_package):
    return rt.load(gpt2_vocab_package)


# --- streaming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"max_new_tokens": 30},
        {"max_new_tokens": 30, "do_sample": True, "seed": 3},
        {"max_new_tokens": 25, "ignore_eos": True, "no_repeat_ngram_size": 2},
    ],
)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_stream_pieces_join_to_the_completion_text(model, prompt, options):
    stream = model.stream(prompt, **options)
    pieces = list(stream)
    assert stream.completion is not None
    assert "".join(pieces) == stream.completion.text
    assert all(pieces)  # no empty pieces are yielded
    assert stream.completion.text == model.generate(prompt, **options).text
    if REPLACEMENT_CHAR not in stream.completion.text:
        assert not any(REPLACEMENT_CHAR in p for p in pieces)


@pytest.mark.parametrize(
    "prompt", ["I ❤️ emoji 😀😃 and", "日本語のテキスト、中文文本，한국어", "Crème brûlée 🚀", "👩🏽‍💻"]
)
def test_stream_with_the_real_gpt2_vocabulary(gpt2_vocab_model, prompt):
    for options in ({"max_new_tokens": 40}, {"max_new_tokens": 40, "do_sample": True, "seed": 11, "top_k": 0}):
        stream = gpt2_vocab_model.stream(prompt, **options)
        pieces = list(stream)
        text = stream.completion.text
        assert "".join(pieces) == text
        assert text == gpt2_vocab_model.tokenizer.decode(stream.completion.token_ids, skip_special_tokens=False)
        if REPLACEMENT_CHAR not in text:
            assert not any(REPLACEMENT_CHAR in p for p in pieces)


@pytest.mark.parametrize("target", [" 日本語のテキスト", " 中文 🚀 café", " 👩🏽 한국어", " 한국어 😀"])
def test_stream_never_shows_half_a_character(gpt2_vocab_model, target):
    """Force the model to spell `target` token by token (characters split across byte-level tokens):
    every streamed piece is whole text, and together they are exactly `target`."""
    ids = gpt2_vocab_model.encode(target)
    assert len(set(ids)) == len(ids)  # the trick below needs distinct ids
    assert any(
        REPLACEMENT_CHAR in gpt2_vocab_model.tokenizer.decode([i]) for i in ids
    )  # some token is half a character
    # no_repeat_ngram_size=1 bans each token once used, so the next-largest bias wins at the next step.
    bias = {token: 2000.0 - 50 * i for i, token in enumerate(ids)}
    stream = gpt2_vocab_model.stream("A", max_new_tokens=len(ids), logit_bias=bias, no_repeat_ngram_size=1)
    pieces = list(stream)
    assert stream.completion.token_ids == ids
    assert "".join(pieces) == target == stream.completion.text
    assert not any(REPLACEMENT_CHAR in p for p in pieces)
    assert len(pieces) > 1  # it did stream


def test_continuing_token_ids_that_end_mid_character(gpt2_vocab_model):
    """Continuing from ids that stop inside a character (e.g. a previous completion cut by max_new_tokens):
    the text is still the decode of the generated ids, as Completion.token_ids documents."""
    ids = gpt2_vocab_model.encode(" 😀 ok")  # [' \xf0\x9f\x98', '\x80', ' ok']
    assert REPLACEMENT_CHAR in gpt2_vocab_model.tokenizer.decode(ids[:1])
    (completion,) = gpt2_vocab_model.generate(
        [ids[:1]], max_new_tokens=3, logit_bias={ids[1]: 1000.0}, no_repeat_ngram_size=1
    )
    assert completion.token_ids[0] == ids[1]
    assert completion.text == gpt2_vocab_model.tokenizer.decode(completion.token_ids, skip_special_tokens=False)


def test_breaking_out_of_a_stream_stops_generation(model, monkeypatch):
    calls = count_passes(model, monkeypatch)
    stream = model.stream(PROMPTS[0], max_new_tokens=50, ignore_eos=True)
    for piece in stream:
        break
    assert piece
    steps = stream.batch._steps
    assert steps is not None and steps.gi_frame is None  # the engine's generator was closed
    assert 1 <= len(calls) < 10
    assert stream.completion is None
    assert stream.batch.completions == []
    # a stream that is never iterated never runs the model
    calls.clear()
    model.stream(PROMPTS[0], max_new_tokens=50)
    assert calls == []


def test_stream_refuses_several_sequences(model):
    with pytest.raises(GenerationOptionError, match="batch"):
        model.stream("Hi", num_return_sequences=2, do_sample=True)


# --- stop strings ------------------------------------------------------------------------------------


def stop_string_across_tokens(model, completion):
    """A printable stop string from the middle of the completion's text that starts in one token and ends in another."""
    ids, text = completion.token_ids, completion.text
    ends = [len(model.tokenizer.decode(ids[: k + 1], skip_special_tokens=False)) for k in range(len(ids))]
    for k in range(2, len(ids) - 2):
        boundary = ends[k]
        if model.tokenizer.decode(ids[: k + 1], skip_special_tokens=False) != text[:boundary]:
            continue  # a character split across tokens: no clean boundary here
        for start, stop in ((boundary - 2, boundary + 2), (boundary - 1, boundary + 2), (boundary - 2, boundary + 1)):
            candidate = text[start:stop]
            if candidate.isprintable() and REPLACEMENT_CHAR not in candidate and text.find(candidate) == start:
                return start, candidate
    return None


@pytest.mark.parametrize("prompt", ["", "lighthouses", "import numpy as np\n"])
def test_stop_string_cuts_the_text_before_it(model, prompt):
    full = model.generate(prompt, max_new_tokens=25, ignore_eos=True)
    found = stop_string_across_tokens(model, full)
    assert found is not None, f"no usable stop string in {full.text!r}"
    start, stop = found
    completion = model.generate(prompt, max_new_tokens=25, ignore_eos=True, stop=stop)
    assert completion.text == full.text[:start]
    assert completion.finish_reason == "stop"
    assert completion.stop_string == stop
    assert completion.token_ids == full.token_ids[: completion.completion_tokens]
    assert completion.completion_tokens < full.completion_tokens
    # the stream shows the same cut, and never the start of the stop string
    stream = model.stream(prompt, max_new_tokens=25, ignore_eos=True, stop=[stop, "never there"])
    assert "".join(stream) == full.text[:start]
    assert stream.completion.stop_string == stop
    # the earliest of several stop strings wins
    later = full.text[start + len(stop) :][:3]
    if later and full.text.find(later) > start:
        assert model.generate(prompt, max_new_tokens=25, ignore_eos=True, stop=[later, stop]).stop_string == stop


def test_stop_string_that_never_appears_changes_nothing(model):
    full = model.generate(PROMPTS[0], max_new_tokens=20)
    same = model.generate(PROMPTS[0], max_new_tokens=20, stop=["\u2603\u2603"])
    assert (same.text, same.token_ids, same.finish_reason, same.stop_string) == (
        full.text,
        full.token_ids,
        full.finish_reason,
        None,
    )


# --- finish reasons, counts, prompts -----------------------------------------------------------------


def test_finish_reason_length(model):
    completion = model.generate(PROMPTS[0], max_new_tokens=7, ignore_eos=True)
    assert completion.finish_reason == "length"
    assert completion.completion_tokens == len(completion.token_ids) == 7
    assert completion.prompt_tokens == len(model.encode(PROMPTS[0]))
    assert completion.stop_string is None


def test_finish_reason_stop_on_end_of_text(model):
    completion = model.generate(PROMPTS[0], max_new_tokens=20, logit_bias={EOS: 100})
    assert completion.finish_reason == "stop"
    assert completion.token_ids == [] and completion.completion_tokens == 0 and completion.text == ""
    assert completion.stop_string is None
    # end-of-text after some tokens: the tokens before it are kept, end-of-text itself is not
    later = model.generate(PROMPTS[0], max_new_tokens=20, min_new_tokens=3, logit_bias={EOS: 100})
    assert later.finish_reason == "stop" and later.completion_tokens == 3 and EOS not in later.token_ids
    # ignore_eos keeps going through it
    ignored = model.generate(PROMPTS[0], max_new_tokens=5, logit_bias={EOS: 100}, ignore_eos=True)
    assert ignored.finish_reason == "length" and ignored.token_ids == [EOS] * 5


def test_empty_prompt_starts_from_the_start_token(model):
    completion = model.generate("", max_new_tokens=10, min_new_tokens=10)
    assert completion.prompt_tokens == 1
    assert completion.token_ids == model.generate([[EOS]], max_new_tokens=10, min_new_tokens=10)[0].token_ids


def test_truncate_drops_the_oldest_prompt_tokens(model):
    prompt = "Once upon a time, in a land far away, there lived a keeper of lighthouses. " * 4
    ids = model.encode(prompt)
    assert len(ids) > 64
    completion = model.generate(prompt, max_new_tokens=10, truncate=True, ignore_eos=True)
    assert completion.prompt_tokens == 54
    assert completion.truncated_prompt_tokens == len(ids) - 54
    kept = model.generate([ids[-54:]], max_new_tokens=10, ignore_eos=True)[0]
    assert completion.token_ids == kept.token_ids
    with pytest.raises(PromptError, match="--truncate") as error:
        model.generate(prompt, max_new_tokens=10)
    assert str(len(ids)) in str(error.value) and "64" in str(error.value)


def test_a_prompt_that_fits_is_not_truncated(model):
    completion = model.generate(PROMPTS[0], max_new_tokens=10, truncate=True)
    assert completion.truncated_prompt_tokens == 0


def test_settings_apply_options_over_package_defaults(model):
    settings = model.settings(temperature=0.5, top_k=7, stop="END")
    assert (settings.temperature, settings.top_k, settings.stop) == (0.5, 7, ("END",))
    assert settings.eos_token_id == (EOS,)
    assert model.settings().max_new_tokens == model.defaults.max_new_tokens


# --- threads and pipeline ----------------------------------------------------------------------------


def test_threads_share_one_model(model):
    jobs = [
        (p, dict(max_new_tokens=15, do_sample=sampled, seed=i))
        for i, p in enumerate(PROMPTS * 2)
        for sampled in (False, True)
    ]
    serial = [model.generate(p, **o) for p, o in jobs]
    barrier = threading.Barrier(4)

    def run(start):
        barrier.wait()
        return [(j, model.generate(*jobs[j][:1], **jobs[j][1])) for j in range(start, len(jobs), 4)]

    with ThreadPoolExecutor(4) as pool:
        results = dict(pair for chunk in pool.map(run, range(4)) for pair in chunk)
    assert len(results) == len(jobs)
    for j, completion in results.items():
        assert (completion.token_ids, completion.text) == (serial[j].token_ids, serial[j].text)


def test_pipeline_returns_generated_text(tiny_package, model):
    generator = rt.pipeline("text-generation", model=str(tiny_package))
    completion = model.generate("The quick brown", max_new_tokens=5)
    assert generator("The quick brown", max_new_tokens=5) == [{"generated_text": "The quick brown" + completion.text}]
    assert generator("The quick brown", max_new_tokens=5, return_full_text=False) == [
        {"generated_text": completion.text}
    ]
    both = generator(["The quick brown", "Hi"], max_new_tokens=5)
    assert len(both) == 2 and both[0] == [{"generated_text": "The quick brown" + completion.text}]
    assert rt.pipeline(model=model)("Hi", max_new_tokens=5) == both[1]
    with pytest.raises(GenerationOptionError, match="text-generation"):
        rt.pipeline("summarization", model=model)
