"""The requests lm-evaluation-harness's `local-completions` model sends, replayed against `edgelm serve`.

lm-eval (0.4.x, lm_eval/models/openai_completions.py and api_models.py) tokenizes with the Hugging Face
tokenizer named by `tokenizer=` (here: the package folder) and sends token-id prompts, batched:
    loglikelihood:  {"model", "prompt": [[ids], ...], "temperature": 0, "max_tokens": 1, "logprobs": 1,
                     "seed": 1234, "echo": true}; it reads, per choice sorted by index,
                     logprobs.token_logprobs[ctxlen:-1] (their sum) and logprobs.top_logprobs[ctxlen:-1]
                     (greedy when each token's log-prob equals its position's largest, compared exactly)
    generate_until: {"model", "prompt": [[ids], ...] (or strings), "max_tokens", "temperature": 0,
                     "stop": [..., eos text], "seed": 1234}; it reads choices[i].text by index
lm-eval itself is not needed: its two readers are restated below, and the answers are checked against
Model.score and Model.generate in this process.
"""

from operator import itemgetter

import pytest
from server_harness import HTTP, InProcessServer

NAME = "edgelm-local"
PAIRS = [  # (context, continuation) as an lm-eval task gives them
    ("The quick brown", " fox"),
    ("Once upon a", " time there was"),
    ("Hello", ","),
    ("", "Numbers: 1 2 3"),  # an empty context: lm-eval puts its prefix token (end-of-text) first
    ("import numpy as", " np"),
]


def parse_logprobs(outputs: list, ctxlens: list) -> list:
    """lm-eval's LocalCompletionsAPI.parse_logprobs, restated."""
    res = []
    for out in outputs:
        for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
            assert ctxlen > 0
            tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
            top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
            is_greedy = all(tok == max(top.values()) for tok, top in zip(tokens_logprobs, top_logprobs))
            res.append((sum(tokens_logprobs), is_greedy))
    return res


def parse_generations(outputs: list) -> list:
    """lm-eval's LocalCompletionsAPI.parse_generations, restated."""
    res = []
    for out in outputs:
        tmp = [None] * len(out["choices"])
        for choice in out["choices"]:
            tmp[choice["index"]] = choice["text"]
        res += tmp
    return res


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, model_names=(NAME,))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_package):
    """What lm-eval loads with tokenizer_backend=huggingface,tokenizer=PACKAGE_FOLDER."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_package))


def post(server, payload) -> dict:
    response = HTTP.post(server.url + "/v1/completions", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_package_folder_is_a_tokenizer_lm_eval_can_load(hf_tokenizer, model):
    text = "The quick brown fox, and numbers: 1 2 3"
    assert hf_tokenizer(text, add_special_tokens=False).input_ids == model.encode(text)
    assert hf_tokenizer.eos_token_id == model.arch.eos_token_id


@pytest.mark.parametrize("max_tokens", [1, 0])  # lm-eval 0.4 sends 1 and drops that token; older versions sent 0
def test_loglikelihood_requests(server, model, hf_tokenizer, max_tokens):
    inputs, ctxlens = [], []
    for context, continuation in PAIRS:
        context_enc = hf_tokenizer(context, add_special_tokens=False).input_ids or [hf_tokenizer.eos_token_id]
        continuation_enc = hf_tokenizer(continuation, add_special_tokens=False).input_ids
        inputs.append(context_enc + continuation_enc)
        ctxlens.append(len(context_enc))
    payload = {
        "model": NAME,
        "prompt": inputs,
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    out = post(server, payload)
    assert [len(c["logprobs"]["token_logprobs"]) for c in out["choices"]] == [len(i) + max_tokens for i in inputs]
    # with max_tokens 0 there is no generated token to drop: read one position further
    answers = parse_logprobs([out], ctxlens) if max_tokens else parse_logprobs([_extended(out)], ctxlens)
    for ids, ctxlen, (logprob, is_greedy) in zip(inputs, ctxlens, answers):
        score = model.score(ids, top_logprobs=1)
        assert logprob == pytest.approx(sum(score.logprobs[ctxlen:]), abs=1e-4)
        greedy = all(
            value == tops[0]["logprob"] for value, tops in zip(score.logprobs[ctxlen:], score.top_logprobs[ctxlen:])
        )
        assert is_greedy == greedy


def _extended(out: dict) -> dict:
    """A max_tokens-0 answer with one placeholder entry appended, for the reader that drops the last one."""
    for choice in out["choices"]:
        for field in ("token_logprobs", "top_logprobs"):
            choice["logprobs"][field] = choice["logprobs"][field] + [None]
    return out


def test_loglikelihood_of_the_greedy_continuation_is_greedy(server, model, hf_tokenizer):
    """lm-eval's is_greedy compares floats exactly: the prompt token's log-prob and its top_logprobs come
    from the same numbers."""
    context_enc = hf_tokenizer("Once upon a", add_special_tokens=False).input_ids
    greedy = model.generate([context_enc], max_new_tokens=3, do_sample=False, ignore_eos=True)[0].token_ids
    other = [(t + 1) % model.arch.vocab_size for t in greedy]
    payload = {"model": NAME, "prompt": [context_enc + greedy, context_enc + other], "temperature": 0}
    out = post(server, {**payload, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
    (_, first), (_, second) = parse_logprobs([out], [len(context_enc)] * 2)
    assert first is True and second is False


def test_generate_until_requests(server, model, hf_tokenizer):
    eos = hf_tokenizer.eos_token
    contexts = ["Question: what comes next?\nAnswer:", "The quick brown", "Hello"]
    stop = ["\n\n", "Question:", eos]
    encodings = [hf_tokenizer(c, add_special_tokens=False).input_ids for c in contexts]
    expected = [c.text for c in model.generate(encodings, max_new_tokens=16, do_sample=False, stop=stop)]
    payload = {"model": NAME, "max_tokens": 16, "temperature": 0, "stop": stop, "seed": 1234}
    assert parse_generations([post(server, {**payload, "prompt": encodings})]) == expected
    # tokenized_requests=False: strings, one request each at batch_size 1
    texts = [parse_generations([post(server, {**payload, "prompt": c})])[0] for c in contexts]
    assert texts == [c.text for c in model.generate(contexts, max_new_tokens=16, do_sample=False, stop=stop)]
