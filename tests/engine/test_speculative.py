"""Several tokens per pass (runtime/speculative/): the verify pass's logits and rollback, and outputs identical to
one token per pass for greedy, seeded sampling, stop strings, end-of-text, lengths, penalties, logit bias,
log-probs, constraints and streaming, on fp32, int8 and int4 packages of the GPT-2 and Llama families."""

import numpy as np
import pytest
from edgelm.runtime import load
from edgelm.runtime.engine.decode import GrowingDecoder
from edgelm.runtime.engine.verify_pass import VerifyPasses
from edgelm.runtime.errors import GenerationOptionError

# Prompts that repeat themselves (prompt lookup finds spans to propose) and one that does not.
PROMPTS = [
    "one two three four one two three four one two",
    "the cat sat on the mat. the cat sat on",
    "Hello, my name is",
]
PACKAGES = [
    "tiny_package",
    "tiny_package_int8",
    "tiny_package_int8_rows",
    "tiny_package_int4",
    "llama_package",
    "llama_package_int8",
    "llama_package_int4",
]


@pytest.fixture(scope="module", params=PACKAGES)
def any_model(request):
    return load(request.getfixturevalue(request.param))


@pytest.fixture(scope="module")
def fp32(tiny_package):
    return load(tiny_package)


def _steps(model, ids: list, decoder, feeds: list) -> list:
    """The logits of each fed token: the prompt, then `feeds` one list per verify pass, from the decoder."""
    passes = VerifyPasses(decoder)
    n = len(ids)
    prompt = np.array([ids])
    decoder.run(prompt, np.ones_like(prompt), np.arange(n)[None])
    out = []
    for tokens in feeds:
        out.append(np.array(passes.run(tokens, n)))
        n += len(tokens)
    return out


@pytest.mark.parametrize("growing", [False, True])
def test_a_verify_pass_gives_the_logits_of_one_token_per_pass(fp32, growing):
    engine = fp32.engine
    ids = fp32.encode(PROMPTS[0])
    follow = [5, 17, 42, 99]
    make = (lambda: GrowingDecoder(engine, 1)) if growing else (lambda: engine.decoder(1, len(ids) + 8))
    one_by_one = np.concatenate(_steps(fp32, ids, make(), [[t] for t in follow]))
    together = _steps(fp32, ids, make(), [follow])[0]
    assert together.shape == (4, engine.vocab_size)
    np.testing.assert_allclose(together, one_by_one, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("growing", [False, True])
def test_a_rejected_draft_is_rolled_back(fp32, growing):
    """After a pass of [t, a, b] keeps only t, the next pass sees the cache as if a and b were never fed."""
    engine = fp32.engine
    ids = fp32.encode(PROMPTS[1])
    make = (lambda: GrowingDecoder(engine, 1)) if growing else (lambda: engine.decoder(1, len(ids) + 8))
    decoder = make()
    passes = VerifyPasses(decoder)
    prompt = np.array([ids])
    decoder.run(prompt, np.ones_like(prompt), np.arange(len(ids))[None])
    passes.run([7, 200, 201], len(ids))  # t = 7, then a draft the row rejects
    passes.rewind(len(ids) + 1)
    after_rollback = np.array(passes.run([8, 9], len(ids) + 1))
    clean = np.concatenate(_steps(fp32, ids, make(), [[7], [8], [9]])[1:])
    np.testing.assert_allclose(after_rollback, clean, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_prompt_lookup_is_token_identical(any_model, prompt):
    plain = any_model.generate(prompt, max_new_tokens=30, speculative="off")
    fast = any_model.generate(prompt, max_new_tokens=30, speculative="ngram")
    assert fast.token_ids == plain.token_ids
    assert fast.text == plain.text and fast.finish_reason == plain.finish_reason
    assert plain.speculation is None and fast.speculation["passes"] >= 1


class Oracle:
    """A proposer that knows the greedy output (and gets every `wrong`-th id of its drafts wrong): it makes the
    verify passes accept whole drafts, end-of-draft bonus tokens and rejections at known places."""

    def __init__(self, prompt: list, output: list, wrong: int = 0, length: int = 5):
        self.full, self.wrong, self.length, self.calls = list(prompt) + list(output), wrong, length, 0

    def propose(self, seen: list, limit: int) -> list:
        self.calls += 1
        draft = self.full[len(seen) : len(seen) + min(limit, self.length)]
        if self.wrong and self.calls % self.wrong == 0 and draft:
            draft[len(draft) // 2] = (draft[len(draft) // 2] + 1) % 100
        return draft

    def accepted(self, drafted: int, accepted: int) -> None:
        pass


@pytest.mark.parametrize("wrong", [0, 2, 3])
def test_accepted_and_rejected_drafts_keep_the_output(any_model, monkeypatch, wrong):
    from edgelm.runtime import speculative

    for prompt in PROMPTS:
        ids = any_model.encode(prompt)
        plain = any_model.generate(prompt, max_new_tokens=30, speculative="off")
        oracle = Oracle(ids, plain.token_ids, wrong)
        monkeypatch.setattr(speculative, "proposer", lambda *args: oracle)
        fast = any_model.generate(prompt, max_new_tokens=30, speculative="ngram")
        assert fast.token_ids == plain.token_ids
        stats = fast.speculation
        assert stats["accepted"] > 0 and stats["passes"] < len(fast.token_ids)
        if wrong:
            assert stats["accepted"] < stats["drafted"]


@pytest.mark.parametrize(
    "options",
    [
        dict(do_sample=True, seed=3, top_k=0),
        dict(do_sample=True, seed=5, temperature=0.7, top_p=0.9),
        dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3),
        dict(logit_bias={11: 4.0, 13: -100}),
        dict(no_repeat_ngram_size=3),
        dict(min_new_tokens=5, logprobs=3),
        dict(stop=[" two"]),
        dict(max_new_tokens=3),
        dict(ignore_eos=True),
    ],
)
@pytest.mark.parametrize("proposer", ["ngram", "oracle"])
def test_options_behave_as_without_speculation(fp32, monkeypatch, options, proposer):
    """With the oracle every draft is the output itself, so each option meets wide passes of accepted tokens
    (penalties, n-gram bans and min_new_tokens updated by each accepted token in order)."""
    from edgelm.runtime import speculative

    options = {"max_new_tokens": 25, **options}
    for prompt in PROMPTS[:2]:
        plain = fp32.generate(prompt, speculative="off", **options)
        if proposer == "oracle":
            oracle = Oracle(fp32.encode(prompt), plain.token_ids)
            monkeypatch.setattr(speculative, "proposer", lambda *args: oracle)
        fast = fp32.generate(prompt, speculative="ngram", **options)
        if proposer == "oracle" and len(plain.token_ids) > 2:
            assert fast.speculation["accepted"] > 0
        assert fast.token_ids == plain.token_ids, options
        assert (fast.text, fast.finish_reason, fast.stop_string) == (plain.text, plain.finish_reason, plain.stop_string)
        if "logprobs" in options:
            assert len(fast.logprobs) == len(fast.token_ids)
            for a, b in zip(fast.logprobs, plain.logprobs):
                assert a["token_id"] == b["token_id"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)


def test_prompt_lookup_proposes_nothing_that_no_repeat_ngram_size_bans(fp32):
    """Under no_repeat_ngram_size 3 a copied span repeats a 3-gram at its first id: prompt lookup proposes
    nothing (no refused drafts widening the passes), and the output is the same."""
    plain = fp32.generate(PROMPTS[0], max_new_tokens=20, speculative="off", no_repeat_ngram_size=3)
    fast = fp32.generate(PROMPTS[0], max_new_tokens=20, speculative="ngram", no_repeat_ngram_size=3)
    assert fast.token_ids == plain.token_ids
    assert fast.speculation["drafted"] == 0
    wider = fp32.generate(PROMPTS[0], max_new_tokens=20, speculative="ngram", no_repeat_ngram_size=5)
    assert wider.token_ids == fp32.generate(PROMPTS[0], max_new_tokens=20, no_repeat_ngram_size=5).token_ids


def test_streaming_gives_the_same_pieces(fp32):
    plain = list(fp32.stream(PROMPTS[0], max_new_tokens=25, speculative="off"))
    stream = fp32.stream(PROMPTS[0], max_new_tokens=25, speculative="ngram")
    assert list(stream) == plain
    assert stream.completion.speculation["drafted"] >= 0


def test_a_batch_of_several_rows_decodes_one_token_per_pass(fp32):
    completions = fp32.generate(PROMPTS[:2], max_new_tokens=10, speculative="ngram")
    assert all(c.speculation is None for c in completions)
    assert [c.token_ids for c in completions] == [c.token_ids for c in fp32.generate(PROMPTS[:2], max_new_tokens=10)]


def test_a_bad_value_is_one_clear_error(fp32):
    with pytest.raises(GenerationOptionError, match="speculative must be one of auto, ngram, draft, off"):
        fp32.settings(speculative="fast")


FORCED_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["crimson red", "forest green"]},
        "status": {"const": "unchanged"},
        "size": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "status", "size"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    dict(json_schema=FORCED_SCHEMA),
    dict(json_object=True),
    dict(regex=r"(abc){3}[0-9]+"),
    dict(choices=["forest green", "crimson red"]),
    dict(grammar='start: "key=" /[a-z]{2}/ ";"'),
]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: next(iter(c)))
@pytest.mark.parametrize("sampled", [False, True])
def test_constrained_output_is_the_same_with_forced_tokens_in_one_pass(fp32, constraint, sampled):
    options = dict(max_new_tokens=60, **constraint) | (dict(do_sample=True, seed=7) if sampled else {})
    plain = fp32.generate("A:", speculative="off", **options)
    for mode in ("auto", "ngram"):
        fast = fp32.generate("A:", speculative=mode, **options)
        assert (fast.token_ids, fast.text, fast.parsed) == (plain.token_ids, plain.text, plain.parsed), mode


def test_a_schema_s_forced_tokens_take_fewer_passes(fp32):
    done = fp32.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA)  # speculative="auto"
    stats = done.speculation
    assert done.parsed["status"] == "unchanged"
    assert stats["forced"] > 10 and stats["accepted"] >= stats["forced"]
    assert stats["passes"] < len(done.token_ids) / 2


@pytest.mark.parametrize(
    "target, draft", [("tiny_package", "tiny_package_int8"), ("llama_package", "llama_package_int8")]
)
def test_a_draft_model_s_guesses_keep_the_output(request, target, draft):
    model = load(request.getfixturevalue(target), draft=request.getfixturevalue(draft))
    for options in (dict(), dict(repetition_penalty=1.2, logit_bias={11: 2.0})):
        for prompt in PROMPTS:
            plain = model.generate(prompt, max_new_tokens=30, speculative="off", **options)
            fast = model.generate(prompt, max_new_tokens=30, speculative="draft", **options)
            assert fast.token_ids == plain.token_ids, (prompt, options)
            if not options:  # a quantized copy of the same weights agrees on most greedy tokens
                assert fast.speculation["accepted"] > fast.speculation["drafted"] / 2
                assert fast.speculation["passes"] < len(fast.token_ids) / 2


@pytest.mark.parametrize("options", [dict(top_k=0), dict(temperature=0.8, top_p=0.9, repetition_penalty=1.2)])
def test_a_sampled_row_s_draft_draws_and_the_target_accepts_by_rejection_sampling(tiny_package, options):
    """A draft identical to the target draws from the target's own distribution: rejection sampling accepts nearly
    every draw (min(1, p / q) is 1 but for the last bits of a wider pass). The same seed gives the same tokens."""
    model = load(tiny_package, draft=tiny_package)
    runs = [model.generate(PROMPTS[2], max_new_tokens=30, do_sample=True, seed=4, speculative="draft", **options)]
    runs.append(model.generate(PROMPTS[2], max_new_tokens=30, do_sample=True, seed=4, speculative="draft", **options))
    assert runs[0].token_ids == runs[1].token_ids
    stats = runs[0].speculation
    assert stats["acceptance_rate"] > 0.95 and stats["passes"] < len(runs[0].token_ids) / 2


def test_a_draft_under_a_constraint_keeps_the_output(tiny_package, tiny_package_int8):
    model = load(tiny_package, draft=tiny_package_int8)
    plain = model.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA, speculative="off")
    fast = model.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA, speculative="draft")
    assert (fast.token_ids, fast.parsed) == (plain.token_ids, plain.parsed)


def test_a_draft_of_another_tokenizer_is_refused_in_one_line(tiny_package, gpt2_vocab_package):
    from edgelm.runtime.errors import PackageError

    with pytest.raises(PackageError, match="has another tokenizer than .*a draft must share") as error:
        load(tiny_package, draft=gpt2_vocab_package)
    assert "\n" not in str(error.value)


def test_draft_without_a_draft_model_says_what_to_do(fp32):
    with pytest.raises(GenerationOptionError, match="needs a draft model: load the package with draft="):
        fp32.generate("Hi", speculative="draft")


def test_the_cli_takes_speculative_and_prints_its_statistics(tiny_package, tiny_package_int8):
    import json

    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    args = ["generate", "-m", str(tiny_package), PROMPTS[1], "--max-new-tokens", "20", "--json"]
    plain = json.loads(CliRunner().invoke(main, [*args, "--speculative", "off"]).output)
    for mode in (["ngram"], ["draft", "--draft-model", str(tiny_package_int8)]):
        result = CliRunner().invoke(main, [*args, "--speculative", *mode])
        assert result.exit_code == 0, result.output
        fast = json.loads(result.output)
        assert fast["token_ids"] == plain["token_ids"] and "speculation" not in plain
        assert set(fast["speculation"]) == {"drafted", "accepted", "forced", "passes", "acceptance_rate"}
    result = CliRunner().invoke(main, [*args, "--speculative", "draft"])
    assert result.exit_code == 1 and "needs a draft model" in result.output
    result = CliRunner().invoke(main, [*args, "--speculative", "fast"])
    assert result.exit_code == 2 and "'fast' is not one of" in result.output


def test_a_forced_tool_call_is_the_same_with_its_forced_tokens_in_one_pass(gpt2_vocab_package):
    from edgelm.runtime import tool_format

    model = load(gpt2_vocab_package)
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    ask, named = [{"role": "user", "content": "Weather?"}], {"type": "function", "function": {"name": "get_weather"}}
    options = dict(tools=[weather], tool_choice=named, max_new_tokens=60, truncate=True)
    plain = model.chat(ask, speculative="off", **options)
    fast = model.chat(ask, **options)  # auto
    assert fast.token_ids == plain.token_ids
    assert fast.speculation["forced"] > 5 and fast.speculation["passes"] < len(fast.token_ids)
    assert {c.name for c in tool_format(model).parse(fast.text)[1]} == {"get_weather"}


def test_speculation_over_the_prefix_cache(tiny_package):
    model = load(tiny_package, prefix_cache_mb=4)
    plain = model.generate(PROMPTS[1], max_new_tokens=25, speculative="off")
    for _ in range(2):  # the second call restores the prompt's rows from the prefix cache
        assert model.generate(PROMPTS[1], max_new_tokens=25, speculative="ngram").token_ids == plain.token_ids


def test_a_prompt_file_line_takes_speculative(fp32):
    from edgelm.runtime.apps.prompt_records import generate_records

    config = fp32.settings(max_new_tokens=10)
    records = [{"prompt": PROMPTS[1], "speculative": "ngram"}, {"prompt": PROMPTS[1], "speculative": "sometimes"}]
    done, refused = generate_records(fp32, config, records)
    assert done["speculation"]["passes"] >= 1 and "speculative must be one of" in refused["error"]


def test_a_sampled_draft_under_a_constraint_keeps_the_output_valid(tiny_package, tiny_package_int8):
    """Drawn drafts are not cut to the grammar (their verification must see each draw): a draw the grammar
    forbids has target probability 0 and is always rejected."""
    model = load(tiny_package, draft=tiny_package_int8)
    for seed in range(3):
        done = model.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA, do_sample=True, seed=seed,
                              speculative="draft")  # fmt: skip
        assert done.finish_reason == "stop" and done.parsed["status"] == "unchanged"


@pytest.mark.parametrize("wrong", [0, 2])
def test_the_growing_cache_is_cut_back_on_rejection(fp32, monkeypatch, wrong):
    """Graphs without the in-place cache (optimum's, CUDA) grow a present per pass: a rejection slices it."""
    from edgelm.runtime import speculative
    from edgelm.runtime.engine.decode import Engine

    plain = fp32.generate(PROMPTS[0], max_new_tokens=30, speculative="off")
    monkeypatch.setattr(Engine, "writes_cache_in_place", property(lambda self: False))
    oracle = Oracle(fp32.encode(PROMPTS[0]), plain.token_ids, wrong)
    monkeypatch.setattr(speculative, "proposer", lambda *args: oracle)
    fast = fp32.generate(PROMPTS[0], max_new_tokens=30, speculative="ngram")
    assert fast.token_ids == plain.token_ids and fast.speculation["passes"] < len(plain.token_ids)


def test_forced_tokens_keep_greedy_output_on_every_recipe(any_model):
    plain = any_model.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA, speculative="off")
    fast = any_model.generate("A:", max_new_tokens=60, json_schema=FORCED_SCHEMA)  # auto
    assert (fast.token_ids, fast.parsed) == (plain.token_ids, plain.parsed)
    assert fast.speculation["forced"] > 0


def test_a_loaded_draft_is_used_by_default_and_off_turns_it_off(tiny_package, tiny_package_int8):
    model = load(tiny_package, draft=tiny_package_int8)
    plain = model.generate(PROMPTS[2], max_new_tokens=20, speculative="off")
    fast = model.generate(PROMPTS[2], max_new_tokens=20)  # auto
    assert fast.token_ids == plain.token_ids and plain.speculation is None
    assert fast.speculation["drafted"] > 0


def test_a_draft_model_refused_again_and_again_pauses_then_proposes_from_where_the_row_is(
    tiny_package, tiny_package_int8, monkeypatch
):
    """The draft's off-switch (ngram.Adaptive with draft.py's window): a window of refused drafts pauses it for
    PAUSE passes, during which its cache falls behind; its next proposal, caught up in one pass, is a fresh
    draft's. The row's ids never repeat a pair, so prompt lookup has nothing to propose in their place."""
    from edgelm.runtime import speculative
    from edgelm.runtime.speculative import draft as draft_module
    from edgelm.runtime.speculative import ngram

    monkeypatch.setattr(draft_module, "WINDOW", 8)  # the tiny model's 64 positions hold a window and a pause
    monkeypatch.setattr(ngram, "PAUSE", 12)
    model = load(tiny_package, draft=tiny_package_int8)
    config = model.settings(max_new_tokens=40, speculative="draft", do_sample=False)
    seen = model.encode("The quick brown fox")
    proposer = speculative.proposer(config, model.draft, len(seen))
    passes = 0
    while not proposer.adapt.paused:
        draft = proposer.propose(seen, limit=8)
        assert draft
        proposer.accepted(len(draft), 0)  # every guess refused: the row takes one token of its own
        seen = seen + [(draft[0] + 1) % 100]
        passes += 1
    assert passes <= draft_module.WINDOW
    for i in range(ngram.PAUSE):
        assert proposer.propose(seen, limit=8) == []
        seen = seen + [40 + i]
    fresh = speculative.proposer(config, model.draft, len(seen))
    assert proposer.propose(seen, limit=4) == fresh.propose(seen, limit=4) != []


def test_a_draft_takes_prompt_lookup_s_copy_where_there_is_one(tiny_package, tiny_package_int8):
    """Where the row's last ids occurred before, the draft model's proposer proposes their continuation as prompt
    lookup does, without a pass of the draft (its cache stays empty) and as a fixed sequence (no q); elsewhere
    the draft guesses. The output is the same either way."""
    from edgelm.runtime import speculative
    from edgelm.runtime.speculative.ngram import NgramProposer

    model = load(tiny_package, draft=tiny_package_int8)
    config = model.settings(max_new_tokens=20, speculative="draft", do_sample=False)
    seen = model.encode(PROMPTS[0])
    proposer = speculative.proposer(config, model.draft, len(seen))
    assert proposer.propose(seen, limit=4) == NgramProposer().propose(seen, limit=4) != []
    assert proposer.q is None and proposer.fed == []
    fresh = model.encode(PROMPTS[2])
    assert proposer.propose(fresh, limit=4) and proposer.fed  # no earlier match: the draft guessed
    for prompt in PROMPTS:
        plain = model.generate(prompt, max_new_tokens=20, speculative="off")
        assert model.generate(prompt, max_new_tokens=20, speculative="draft").token_ids == plain.token_ids


def test_a_draft_model_s_threads_do_not_spin(tiny_package, tiny_package_int8):
    """The draft's passes alternate with the target's: its workers spinning after each pass would hold the cores
    the target's next pass needs."""
    def spins(model) -> bool:
        try:
            options = model.engine.session.get_session_options()
            entry = options.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: onnxruntime's default, spinning
            return True
        return entry != "0"

    model = load(tiny_package, draft=tiny_package_int8)
    assert spins(model) and not spins(model.draft)
