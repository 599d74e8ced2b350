"""Generation options: one validated GenerationConfig built once and passed down, the sampler chain built once
per request from the active filters, rows finished in the engine, typed errors for bad arguments, and
non-finite logits that still give an answer."""

import json

import edgelm.runtime as rt
import numpy as np
import pytest
from click.testing import CliRunner
from edgelm.runtime import GenerationOptionError, PackageError, PromptError, sampling
from edgelm.runtime.batching import step as stepping
from edgelm.runtime.cli.main import main
from edgelm.runtime.engine.decode import decode_steps
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling import filters
from pass_counter import count_passes

PROMPT = "The quick brown fox"


# --- one validated config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, param",
    [
        ({"top_p": 0}, "top_p"),
        ({"temprature": 0.5}, "temprature"),
        ({"do_sample": True, "temperature": 0}, "temperature"),
        ({"min_new_tokens": 99}, "min_new_tokens"),
        ({"logit_bias": {100000: 5.0}}, "logit_bias"),
        ({"logit_bias": {-1: 5.0}}, "logit_bias"),
        ({"bad_words_ids": [[3, 100000]]}, "bad_words_ids"),
        ({"eos_token_id": 100000}, "eos_token_id"),
        ({"stop": [""]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"vocab_size": 10**9}, "vocab_size"),  # a fact of the package, not an option
    ],
)
def test_every_bad_option_names_itself(model, options, param):
    with pytest.raises(GenerationOptionError) as raised:
        model.settings(**options)
    assert raised.value.param == param
    assert "\n" not in str(raised.value)


def test_token_ids_are_checked_against_the_vocabulary_when_the_config_is_built(model):
    with pytest.raises(GenerationOptionError, match=r"logit_bias names token id\(s\) \[320\].*ids 0 to 319"):
        model.settings(logit_bias={320: 1.0})
    with pytest.raises(GenerationOptionError, match=r"bad_words_ids names token id\(s\) \[999\]"):
        model.settings(bad_words_ids=[[5], [6, 999]])
    assert model.settings(logit_bias={"319": 1}).logit_bias == {319: 1.0}  # JSON-style keys and ints normalized


def test_a_config_is_valid_by_construction():
    with pytest.raises(GenerationOptionError, match="top_k") as raised:
        GenerationConfig(top_k=-3)
    assert raised.value.param == "top_k"
    config = GenerationConfig(stop="END", bad_words_ids=[[1, 2]], logit_bias={"7": 2})
    assert (config.stop, config.bad_words_ids, config.logit_bias) == (("END",), ((1, 2),), {7: 2.0})


def test_no_range_check_runs_per_decode_step(model, monkeypatch):
    checked = []
    monkeypatch.setattr(filters, "check_token_ids", lambda *a: checked.append(a))
    model.generate(PROMPT, max_new_tokens=6, logit_bias={5: 3.0}, bad_words_ids=[[7]])
    assert checked == []  # the config checked its ids once; the chain does not check again


def test_a_built_config_is_passed_down(model):
    config = model.settings(max_new_tokens=6, do_sample=True, seed=3, stop=["zz"])
    assert model.generate(PROMPT, config=config).token_ids == model.generate(PROMPT, **config_options()).token_ids
    assert "".join(model.stream(PROMPT, config)) == model.generate(PROMPT, config).text
    (completion,) = model.batch([PROMPT], config=config).run()
    assert completion.token_ids == model.generate(PROMPT, config).token_ids
    with pytest.raises(GenerationOptionError, match="not both") as raised:
        model.generate(PROMPT, config=config, top_k=3)
    assert raised.value.param == "top_k"
    with pytest.raises(GenerationOptionError, match="GenerationConfig") as raised:
        model.generate(PROMPT, config={"max_new_tokens": 3})
    assert raised.value.param == "config"


def config_options():
    return {"max_new_tokens": 6, "do_sample": True, "seed": 3, "stop": ["zz"]}


def test_a_config_built_without_a_vocabulary_is_checked_against_the_model(model):
    with pytest.raises(GenerationOptionError, match="outside this model's vocabulary"):
        model.generate(PROMPT, config=GenerationConfig(max_new_tokens=3, logit_bias={5000: 1.0}))


def test_the_cli_builds_the_settings_once(tiny_package, monkeypatch):
    built = []
    with_options = GenerationConfig.with_options
    monkeypatch.setattr(GenerationConfig, "with_options", lambda self, **o: built.append(o) or with_options(self, **o))
    for extra in ([], ["--json"], ["-n", "2", "--do-sample"]):
        built.clear()
        result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "Hi", "--max-new-tokens", "4", *extra])
        assert result.exit_code == 0, result.output
        assert len(built) == 1


def test_every_generate_option_has_help_text():
    command = main.get_command(None, "generate")
    assert all(option.help for option in command.params if isinstance(option, type(command.params[1])))


# --- the sampler chain ----------------------------------------------------------------------------------


def names(chain):
    return [f.__name__ for f, _ in chain.filters]


def test_the_chain_holds_only_the_active_filters_in_the_documented_order():
    assert names(sampling.SamplerChain(GenerationConfig(), 100)) == []
    # top_k=50 is transformers' default and it is active; 0 turns it off
    assert names(sampling.SamplerChain(GenerationConfig(do_sample=True), 100)) == ["top_k"]
    assert names(sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0), 100)) == []
    every = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        min_p=0.05,
        typical_p=0.9,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        logit_bias={3: 5.0},
        no_repeat_ngram_size=2,
        bad_words_ids=((9,),),
        min_new_tokens=5,
        eos_token_id=0,
    )
    order = ["repetition_penalty", "frequency_presence_penalty", "logit_bias", "no_repeat_ngram", "bad_words"]
    order += ["min_new_tokens", "temperature", "top_k", "top_p", "min_p", "typical_p"]
    assert names(sampling.SamplerChain(every, 100)) == order
    greedy = GenerationConfig(**{**every.__dict__, "do_sample": False, "vocab_size": None})
    assert names(sampling.SamplerChain(greedy, 100)) == order[:6]  # the warpers never move the argmax


def test_every_no_op_default_is_left_out_of_the_chain():
    defaults = GenerationConfig(do_sample=True, top_k=0, eos_token_id=0)
    chain = sampling.SamplerChain(defaults, 50)
    assert chain.filters == []
    logits = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    assert chain.process(logits, [[1], [2]], [[], []]) is logits


def test_the_chain_is_built_once_per_request(model, monkeypatch):
    built = []
    chain = stepping.SamplerChain
    monkeypatch.setattr(stepping, "SamplerChain", lambda *a: built.append(a) or chain(*a))
    model.generate([PROMPT, "Hi"], max_new_tokens=8, do_sample=True, seed=1, top_p=0.9, num_return_sequences=2)
    assert len(built) == 1


# --- a row that hits a stop string is finished in the engine --------------------------------------------


def test_decode_steps_feeds_what_its_pick_says_and_stops_when_no_row_runs(model, monkeypatch):
    """The engine's loop knows nothing of sampling or finishing: its pick gives each row's next id (-1: finished
    before this step) and how many rows still run, and the loop ends after the step that leaves none."""
    calls = count_passes(model, monkeypatch)
    rows = [model.encode(PROMPT), model.encode("Hi")]
    seen, fed = [], []

    def pick(logits):  # row 0 finishes at its first token, row 1 at its third
        assert logits.shape == (2, model.arch.vocab_size)
        step = len(seen)
        tokens = np.array([5 if step == 0 else -1, 7 + step])
        seen.append(tokens.tolist())
        return tokens, 1 if step < 2 else 0

    counted = model.engine.decoder

    class Fed:
        def __init__(self, inner):
            self.inner = inner

        def run(self, ids, *args):
            fed.append(ids.tolist())
            return self.inner.run(ids, *args)

    monkeypatch.setattr(model.engine, "decoder", lambda *a, **k: Fed(counted(*a, **k)))
    steps = list(decode_steps(model.engine, rows, pick, 0, max_new_tokens=10))
    assert [t.tolist() for t in steps] == seen == [[5, 7], [-1, 8], [-1, 9]]
    assert fed[1:] == [[[5], [7]], [[0], [8]]]  # a finished row is fed padding
    assert len(calls) == 3  # the prompt and two decode passes: none after the last row finished


def test_a_stopped_row_is_not_sampled_and_the_batch_ends_with_its_last_row(model, monkeypatch):
    full = model.generate(PROMPT, max_new_tokens=20, ignore_eos=True)
    stop = full.text[4:7]
    assert full.text.find(stop) == 4 and full.text.strip()
    calls = count_passes(model, monkeypatch)
    sampled = []
    chain_call = sampling.SamplerChain.__call__
    monkeypatch.setattr(
        sampling.SamplerChain, "__call__", lambda self, x, *a: sampled.append(len(x)) or chain_call(self, x, *a)
    )
    # row 0 stops early; row 1 ("never there") runs to max_new_tokens
    completions = model.batch([PROMPT, PROMPT], max_new_tokens=20, ignore_eos=True, stop=[stop]).run()
    assert completions[0].stop_string == stop == completions[1].stop_string
    calls.clear(), sampled.clear()
    a, b = model.batch([PROMPT, "Hi"], max_new_tokens=20, ignore_eos=True, stop=[stop]).run()
    assert a.finish_reason == "stop" and a.text == full.text[:4]
    assert b.completion_tokens == 20 or b.finish_reason == "stop"
    assert sampled[0] == 2 and sampled[-1] == 1  # after the stop only the other row is sampled
    assert len(calls) == max(a.completion_tokens, b.completion_tokens)  # prefill + one pass per later step
    # one row: no pass after the step whose text reached the stop string
    calls.clear()
    alone = model.generate(PROMPT, max_new_tokens=20, ignore_eos=True, stop=[stop])
    assert len(calls) == alone.completion_tokens < 20


# --- typed errors from the Python API -------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [5, None, 3.5, {"a": 1}])
def test_a_prompt_of_the_wrong_type_is_a_prompt_error(model, prompt):
    with pytest.raises(PromptError, match="prompt must be"):
        model.generate(prompt, max_new_tokens=3)
    with pytest.raises(PromptError, match="prompt must be"):
        model.stream(prompt, max_new_tokens=3)


@pytest.mark.parametrize(
    "options, param, fragment",
    [
        ({"stop": 5}, "stop", "stop must be a list of non-empty strings"),
        ({"stop": [5]}, "stop", "stop must be"),
        ({"logit_bias": 5}, "logit_bias", "logit_bias must be a mapping"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "logit_bias keys must be token ids"),
        ({"logit_bias": {3: "a lot"}}, "logit_bias", "logit_bias values must be finite numbers"),
        ({"logit_bias": {3: float("inf")}}, "logit_bias", "finite"),
        ({"bad_words_ids": 5}, "bad_words_ids", "bad_words_ids must be a list of non-empty token-id lists"),
        ({"bad_words_ids": [5]}, "bad_words_ids", "bad_words_ids must be"),
        ({"bad_words_ids": [[]]}, "bad_words_ids", "bad_words_ids must be"),
        ({"max_new_tokens": "5"}, "max_new_tokens", "max_new_tokens must be an integer"),
    ],
)
def test_an_option_of_the_wrong_type_is_a_generation_option_error(model, options, param, fragment):
    with pytest.raises(GenerationOptionError) as raised:
        model.generate("Hi", **{"max_new_tokens": 3, **options})
    assert raised.value.param == param and fragment in str(raised.value)


def test_load_and_pipeline_refuse_wrong_types(model):
    with pytest.raises(PackageError, match="takes a package folder .* or an installed package.s name"):
        rt.load(5)
    generator = rt.pipeline(model=model)
    for prompt in (5, None, [5], [[1, 2]]):
        with pytest.raises(PromptError, match="text prompt"):
            generator(prompt, max_new_tokens=3)
    with pytest.raises(PromptError, match="list of prompts"):
        model.batch("Hi")


def test_a_huge_batch_is_refused_before_any_work(model, monkeypatch):
    calls = count_passes(model, monkeypatch)
    with pytest.raises(GenerationOptionError, match="limit of 262,144") as raised:
        model.generate("Hi", num_return_sequences=10**6, max_new_tokens=5, do_sample=True)
    assert raised.value.param == "num_return_sequences" and "Lower num_return_sequences" in str(raised.value)
    encoded = []
    monkeypatch.setattr(model, "encode", lambda *args, **kw: encoded.append(args) or [0])
    with pytest.raises(PromptError, match="Split the prompts"):
        model.generate(["Hi"] * 10**5, max_new_tokens=5)  # refused from its size alone, before tokenizing
    assert calls == [] and encoded == []


# --- non-finite logits ----------------------------------------------------------------------------------


def test_a_tiny_temperature_samples_the_most_likely_token(model):
    greedy = model.generate(PROMPT, max_new_tokens=12, ignore_eos=True)
    for t in (1e-42, 1e-300):
        sampled = model.generate(PROMPT, max_new_tokens=12, ignore_eos=True, do_sample=True, temperature=t, seed=0)
        assert sampled.token_ids == greedy.token_ids


@pytest.mark.parametrize("penalty", [1e-300, 1e-42, 1e300])
@pytest.mark.parametrize("do_sample", [False, True])
def test_an_extreme_repetition_penalty_still_gives_an_answer(model, penalty, do_sample):
    completion = model.generate(
        PROMPT, max_new_tokens=10, ignore_eos=True, repetition_penalty=penalty, do_sample=do_sample, seed=0
    )
    assert completion.completion_tokens == 10
    assert all(0 <= t < model.arch.vocab_size for t in completion.token_ids)


def test_a_huge_logit_bias_still_gives_an_answer(model):
    completion = model.generate(PROMPT, max_new_tokens=5, ignore_eos=True, logit_bias={7: 1e300}, do_sample=True)
    assert completion.token_ids == [7] * 5


def test_extreme_values_on_the_command_line(tiny_package, model):
    def run(*args):
        result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), PROMPT, "--max-new-tokens", "8", *args])
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        return result.stdout

    assert run("--temperature", "1e-42", "--seed", "0") == model.generate(PROMPT, max_new_tokens=8).text + "\n"
    data = json.loads(run("--repetition-penalty", "1e-300", "--do-sample", "--seed", "0", "--json"))
    assert len(data["token_ids"]) == data["completion_tokens"] >= 1


def test_pick_handles_nan_and_infinite_logits():
    logits = np.zeros((3, 5), dtype=np.float32)
    logits[0, [1, 3]] = np.inf
    logits[1] = [np.nan, 1.0, np.nan, 2.0, 0.0]
    logits[2, 4] = np.inf
    rngs = [np.random.default_rng([0, r]) for r in range(3)]
    assert sampling.pick(logits, False, rngs).tolist() == [1, 3, 4]
    draws = np.stack([sampling.pick(logits, True, rngs) for _ in range(200)])
    assert set(draws[:, 0]) == {1, 3} and set(draws[:, 1]) <= {1, 3, 4} and set(draws[:, 2]) == {4}
    with pytest.raises(GenerationOptionError, match="every token was banned"):
        sampling.pick(np.full((1, 4), np.nan, dtype=np.float32), True, rngs[:1])


def test_filters_keep_finite_logits_finite():
    logits = np.random.default_rng(1).standard_normal((2, 40)).astype(np.float32) * 5
    ids = [np.arange(10), np.arange(5, 15)]
    for out in (
        sampling.temperature(logits, 1e-42),
        sampling.temperature(logits, 1e-300),
        sampling.repetition_penalty(logits, ids, 1e-300),
        sampling.repetition_penalty(logits, ids, 1e300),
        sampling.logit_bias(logits, {3: 1e300, 4: -1e300}),
    ):
        assert not np.isnan(out).any() and not np.isposinf(out).any()
        assert np.isfinite(out.max(axis=-1)).all()  # the most likely token of each row stays finite
    cold = sampling.temperature(logits, 1e-42)
    np.testing.assert_array_equal(cold.argmax(axis=-1), logits.argmax(axis=-1))
    assert (cold.max(axis=-1) == 0).all()  # shifted by the maximum: softmax is unchanged by a shift
