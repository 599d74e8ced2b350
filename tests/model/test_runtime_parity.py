"""Golden tests: the runtime's tokens and log-probs equal transformers' (PyTorch) on the same tiny random weights.

fp32 greedy must match token for token; int8 only has to agree with fp32 on the first tokens, as its
manifest's measured top-1 agreement promises.
"""

import json

import edgelm.runtime as rt
import numpy as np
import pytest
import torch
from edgelm.runtime import GenerationOptionError

EOS = 0  # the tiny tokenizer's <|endoftext|>, also GPT-2's start token
PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away",
    "import numpy as np\n",
    "Émile a visité Tokyo",
]
LONG_TEXT = " ".join(
    [
        "The quick brown fox jumps over the lazy dog.",
        "Once upon a time, in a land far away, there lived a keeper of lighthouses.",
        "Numbers: 0 1 2 3 4 5 6 7 8 9, and symbols !? ;:",
    ]
    * 3
)


def ids_of(model, text):
    return model.tokenizer.encode(text).ids


_HF_CACHE = {}  # transformers' generate is the slow half of these tests: run each reference once


def hf_generate(reference, prompt_ids, n, **options):
    """transformers' greedy continuation of one prompt: exactly n new token ids (end-of-text banned until n)."""
    key = (id(reference), tuple(prompt_ids), n, tuple(sorted(options.items())))
    if key not in _HF_CACHE:
        input_ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = reference.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=EOS,
                **options,
            )
        _HF_CACHE[key] = out[0, len(prompt_ids) :].tolist()
    return _HF_CACHE[key]


def edgelm_generate(model, prompt_ids, n, **options):
    (completion,) = model.generate([prompt_ids], max_new_tokens=n, min_new_tokens=n, **options)
    return completion.token_ids


def hf_logprobs(reference, ids):
    """log_softmax of transformers' logits at every position of ids: [len(ids), V]."""
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


# --- greedy parity -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 20])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_transformers(model, reference_model, prompt, n):
    prompt_ids = ids_of(model, prompt)
    expected = hf_generate(reference_model, prompt_ids, n)
    completion = model.generate(prompt, max_new_tokens=n, min_new_tokens=n)
    assert completion.token_ids == expected
    assert completion.completion_tokens == n
    assert completion.prompt_tokens == len(prompt_ids)
    assert completion.finish_reason == "length"
    assert completion.text == model.tokenizer.decode(expected, skip_special_tokens=False)


def test_greedy_from_one_token_prompt(model, reference_model):
    for token in (EOS, 294):
        assert edgelm_generate(model, [token], 20) == hf_generate(reference_model, [token], 20)


def test_greedy_with_a_prompt_near_the_context_limit(model, reference_model):
    prompt_ids = ids_of(model, LONG_TEXT)[:59]
    assert len(prompt_ids) == 59
    got = edgelm_generate(model, prompt_ids, 5)  # 59 + 5 = all 64 positions
    assert got == hf_generate(reference_model, prompt_ids, 5)
    assert len(got) == 5


def test_greedy_until_end_of_text_equals_transformers(model, reference_model):
    """Without min_new_tokens both stop at the same end-of-text (or both run to the limit)."""
    for prompt in PROMPTS[:2]:
        prompt_ids = ids_of(model, prompt)
        with torch.no_grad():
            out = reference_model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=30,
                pad_token_id=EOS,
            )
        expected = out[0, len(prompt_ids) :].tolist()
        completion = model.generate(prompt, max_new_tokens=30)
        if EOS in expected:
            assert completion.token_ids == expected[: expected.index(EOS)]
            assert completion.finish_reason == "stop"
        else:
            assert completion.token_ids == expected
            assert completion.finish_reason == "length"


@pytest.fixture(scope="module")
def other_shape(tmp_path_factory):
    """3 layers, 2 heads, width 48: the runtime reads the shape from the package, nothing is hard-coded."""
    from checkpoints import build_checkpoint
    from edgelm.export.stages import export_model
    from transformers import GPT2LMHeadModel

    folder = build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-3x2x48", n_layer=3, n_head=2, n_embd=48, seed=7)
    package = export_model(str(folder), tmp_path_factory.mktemp("pkg") / "tiny-3x2x48", validate=False).path
    reference = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    return rt.load(package), reference


def test_greedy_parity_for_another_shape(other_shape):
    model, reference = other_shape
    assert (model.arch.n_layer, model.arch.n_head, model.arch.head_size) == (3, 2, 24)
    for prompt in PROMPTS[:3]:
        prompt_ids = ids_of(model, prompt)
        assert edgelm_generate(model, prompt_ids, 20) == hf_generate(reference, prompt_ids, 20)
    batch = model.generate(PROMPTS[:3], max_new_tokens=20, min_new_tokens=20)  # padded: three prompt lengths
    assert [c.token_ids for c in batch] == [hf_generate(reference, ids_of(model, p), 20) for p in PROMPTS[:3]]


# --- batches -----------------------------------------------------------------------------------------


def test_padded_batch_equals_each_prompt_alone(model):
    prompts = ["Hi", *PROMPTS, ""]
    batch = model.generate(prompts, max_new_tokens=15, min_new_tokens=15)
    assert [c.prompt_index for c in batch] == list(range(len(prompts)))
    for prompt, completion in zip(prompts, batch):
        alone = model.generate(prompt, max_new_tokens=15, min_new_tokens=15)
        assert completion.token_ids == alone.token_ids
        assert completion.text == alone.text


def test_padded_batch_equals_transformers_left_padded_batch(model, reference_model, tiny_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    prompts = ["Hi", *PROMPTS]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    assert encoded["attention_mask"].sum(dim=1).tolist() == [len(ids_of(model, p)) for p in prompts]
    with torch.no_grad():
        out = reference_model.generate(
            **encoded, do_sample=False, max_new_tokens=15, min_new_tokens=15, pad_token_id=tokenizer.pad_token_id
        )
    expected = out[:, encoded["input_ids"].shape[1] :].tolist()
    assert [c.token_ids for c in model.generate(prompts, max_new_tokens=15, min_new_tokens=15)] == expected


def test_greedy_return_sequences_are_identical(model):
    """Only on request (the server's n at temperature 0): transformers refuses them, and so does the default."""
    with pytest.raises(GenerationOptionError, match="Greedy methods without beam search"):
        model.generate(PROMPTS[0], max_new_tokens=12, num_return_sequences=3)
    rows = model.generate(PROMPTS[0], max_new_tokens=12, num_return_sequences=3, greedy_copies=True)
    assert isinstance(rows, list) and len(rows) == 3
    assert rows[0].token_ids == rows[1].token_ids == rows[2].token_ids
    assert rows[0].token_ids == model.generate(PROMPTS[0], max_new_tokens=12).token_ids
    assert [r.index for r in rows] == [0, 1, 2]


def test_sampled_return_sequences_differ_and_repeat_with_the_seed(model):
    options = dict(max_new_tokens=20, do_sample=True, seed=1234, num_return_sequences=4)
    first = model.generate(PROMPTS[0], **options)
    second = model.generate(PROMPTS[0], **options)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert len({tuple(r.token_ids) for r in first}) == 4  # every row drew its own tokens
    other_seed = model.generate(PROMPTS[0], **(options | {"seed": 99}))
    assert [r.token_ids for r in other_seed] != [r.token_ids for r in first]


def test_a_prompts_sampled_result_does_not_depend_on_its_batch(model):
    a, b = PROMPTS[1], "Hi"
    options = dict(max_new_tokens=20, do_sample=True, seed=7, temperature=1.3)
    alone = model.generate([a], **options)[0]
    assert model.generate([a, b], **options)[0].token_ids == alone.token_ids
    assert model.generate([b, a], **options)[1].token_ids == alone.token_ids
    assert model.generate([b, a, b], **options)[1].text == alone.text


# --- logits processors against transformers -----------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 2},
        {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3},
    ],
)
def test_repetition_options_equal_transformers(model, reference_model, options):
    changed = False
    for prompt in ["The quick brown fox", ""]:
        prompt_ids = ids_of(model, prompt) or [EOS]
        expected = hf_generate(reference_model, prompt_ids, 20, **options)
        assert edgelm_generate(model, prompt_ids, 20, **options) == expected
        changed |= expected != hf_generate(reference_model, prompt_ids, 20)
    assert changed, "the options should change at least one greedy completion, or this test proves nothing"


# --- int8 --------------------------------------------------------------------------------------------


def test_int8_package_generates_and_agrees_with_fp32(model, validated_package_int8):
    manifest = json.loads((validated_package_int8 / "manifest.json").read_text())
    assert manifest["weights"]["dtype"] == "int8"
    assert manifest["validation"]["int8"]["top1_agreement"] >= 0.85
    int8 = rt.load(validated_package_int8)
    agreeing_prefixes = []
    for prompt in PROMPTS:
        completion = int8.generate(prompt, max_new_tokens=10, min_new_tokens=10)
        assert completion.completion_tokens == len(completion.token_ids) == 10
        assert all(0 <= t < int8.arch.vocab_size for t in completion.token_ids)
        fp32 = model.generate(prompt, max_new_tokens=10, min_new_tokens=10).token_ids
        agreeing = next((i for i, (x, y) in enumerate(zip(completion.token_ids, fp32)) if x != y), 10)
        agreeing_prefixes.append(agreeing)
    assert max(agreeing_prefixes) >= 3, f"int8 greedy left fp32 at once for every prompt: {agreeing_prefixes}"


# --- log-probabilities -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["The quick brown fox jumps over the lazy dog.", "É", "print(np.arange(10))"])
def test_score_equals_transformers_log_softmax(model, reference_model, text):
    score = model.score(text)
    ids = [EOS] + score.token_ids
    assert score.token_ids == ids_of(model, text)
    logprobs = hf_logprobs(reference_model, ids)
    expected = logprobs[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(score.logprobs, expected, atol=1e-4, rtol=0)
    assert score.perplexity == pytest.approx(float(np.exp(-expected.mean())), rel=1e-4)
    with torch.no_grad():
        loss = reference_model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert score.perplexity == pytest.approx(np.exp(loss), rel=1e-4)
    assert len(score.tokens) == len(score.logprobs) == len(score.token_ids)


def test_generate_logprobs_equal_transformers(model, reference_model):
    prompt = PROMPTS[1]
    completion = model.generate(prompt, max_new_tokens=12, ignore_eos=True, logprobs=3)
    prompt_ids = ids_of(model, prompt)
    assert len(completion.logprobs) == len(completion.token_ids) == 12
    logprobs = hf_logprobs(reference_model, prompt_ids + completion.token_ids)
    for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = logprobs[len(prompt_ids) - 1 + step]
        assert entry["token_id"] == token
        assert entry["logprob"] == pytest.approx(row[token], abs=1e-4)
        top = entry["top_logprobs"]
        assert len(top) == 3
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, np.sort(row)[::-1][:3], atol=1e-4)
        assert top[0]["token_id"] == token and top[0]["logprob"] == pytest.approx(
            entry["logprob"]
        )  # greedy picks the top-1
        assert entry["token"] == model.tokenizer.decode([token])


def test_logprobs_are_the_models_own_even_when_a_filter_changed_the_pick(model, reference_model):
    """With repetition_penalty the chosen token need not be the top-1, but its log-prob is still the model's."""
    prompt_ids = ids_of(model, PROMPTS[0])
    (completion,) = model.generate(
        [prompt_ids], max_new_tokens=15, min_new_tokens=15, repetition_penalty=2.0, logprobs=1
    )
    logprobs = hf_logprobs(reference_model, prompt_ids + completion.token_ids)
    got = [e["logprob"] for e in completion.logprobs]
    expected = [logprobs[len(prompt_ids) - 1 + i, t] for i, t in enumerate(completion.token_ids)]
    np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize("fixture", ["tiny_package", "tiny_package_int8"])
def test_decode_steps_written_in_place_equal_fresh_inputs(fixture, request):
    """A decode step's tokens (ids, or an int8 package's embedding rows) and positions are written into arrays the
    decoder made once: every step's logits equal those of a decoder given fresh arrays for each pass."""
    import numpy as np
    from edgelm.runtime.engine.decode import InPlaceDecoder, left_pad, position_ids_from_mask

    model = rt.load(request.getfixturevalue(fixture))
    prompts = [model.encode("The quick brown fox"), model.encode("Once upon a time")]
    ids, mask = left_pad(prompts, 0)
    positions = position_ids_from_mask(mask)
    steps, fresh = (InPlaceDecoder(model.engine, 2, capacity=ids.shape[1] + 8) for _ in range(2))
    a = steps.run(ids, mask, positions)
    fresh.run(ids, mask, positions)
    for _ in range(8):
        token = a[:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        positions = positions[:, -1:] + 1
        a = steps.run(token, mask, positions).copy()
        fresh._pass(token, mask, positions)  # the prompt's path: new arrays and OrtValues for the pass
        np.testing.assert_array_equal(a, fresh.logits)


def test_in_place_cache_equals_the_growing_cache(tiny_package, monkeypatch):
    """Decoding with the preallocated in-place cache (the default on CPU), the prompt written into it (in
    chunks at batch 1), gives the logits of the plain contract, where the whole prompt is one pass and every
    present becomes the next past, for a padded batch too."""
    import numpy as np
    from edgelm.runtime.engine import decode as engine_module
    from edgelm.runtime.engine.decode import GrowingDecoder, InPlaceDecoder, left_pad, position_ids_from_mask

    model = rt.load(tiny_package)
    assert model.engine.io.kv_cache_in_place
    assert isinstance(model.engine.decoder(2, 16), InPlaceDecoder)
    monkeypatch.setattr(engine_module, "PREFILL_CHUNK", 3)  # several chunks, the last one short
    prompts = [model.encode("The quick brown fox"), model.encode("Once upon a time, in a land far away")]
    ids, mask = left_pad(prompts, 0)
    assert all(len(p) > 3 for p in prompts) and any(len(p) % 3 for p in prompts)
    positions = position_ids_from_mask(mask)
    growing, in_place = GrowingDecoder(model.engine, 2), InPlaceDecoder(model.engine, 2, capacity=ids.shape[1] + 12)
    a, b = growing.run(ids, mask, positions), in_place.run(ids, mask, positions)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    for row, prompt in enumerate(prompts):  # one row alone: its prompt goes in three tokens at a time
        alone = InPlaceDecoder(model.engine, 1, capacity=len(prompt) + 1)
        single = np.array([prompt])
        np.testing.assert_allclose(
            alone.run(single, np.ones_like(single), np.arange(len(prompt))[None]), a[row : row + 1], rtol=0, atol=1e-5
        )
    token = a[:, -1].argmax(-1)[:, None]
    for _ in range(12):
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        positions = positions[:, -1:] + 1
        a, b = growing.run(token, mask, positions), in_place.run(token, mask, positions)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        token = a[:, -1].argmax(-1)[:, None]
