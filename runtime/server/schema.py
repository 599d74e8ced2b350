"""The OpenAI wire format: request bodies in, runtime options out; Completions in, response bodies out.

Nothing here touches the network or threads. Parsing is strict: an unknown field, a wrong JSON type or an
out-of-range value raises ApiError (HTTP 400 in OpenAI's error shape) naming the field. Ranges are the
runtime's own (GenerationConfig.validated); this module checks only JSON types, the server's limits and
the fields whose OpenAI name differs from the runtime's.

OpenAI semantics on top of the runtime's transformers names:
    temperature 0 -> greedy (do_sample=False); temperature > 0 -> sampling; default 1.0 (sampling)
    top_k defaults to 0 (off): OpenAI has no top-k; the package's generation_config.json may say otherwise,
    but an OpenAI client expects plain temperature/top_p sampling. Send "top_k" to turn it on.
    max_tokens -> max_new_tokens (default 16, as OpenAI); n -> num_return_sequences; min_tokens -> min_new_tokens
"""

import math
import secrets
import time
from dataclasses import dataclass, field

from ..errors import GenerationOptionError

INT, NUMBER, BOOL, STRING, OBJECT = "an integer", "a number", "true or false", "a string", "an object"
STRINGS = "a string or a list of strings"

# field -> its JSON type. OpenAI's own fields first, then edgelm's extras under transformers' names.
COMPLETION_FIELDS = {
    "model": STRING,
    "prompt": STRINGS,
    "max_tokens": INT,
    "temperature": NUMBER,
    "top_p": NUMBER,
    "n": INT,
    "stream": BOOL,
    "stream_options": OBJECT,
    "stop": STRINGS,
    "seed": INT,
    "logprobs": INT,
    "echo": BOOL,
    "frequency_penalty": NUMBER,
    "presence_penalty": NUMBER,
    "logit_bias": OBJECT,
    "user": STRING,
    "best_of": INT,
    "suffix": STRING,
    "top_k": INT,
    "min_p": NUMBER,
    "typical_p": NUMBER,
    "repetition_penalty": NUMBER,
    "no_repeat_ngram_size": INT,
    "min_tokens": INT,
    "min_new_tokens": INT,
    "ignore_eos": BOOL,
    "truncate": BOOL,
}
# Fields passed to the runtime under the same name, when given.
PASSTHROUGH = (
    "top_p",
    "stop",
    "seed",
    "logprobs",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "ignore_eos",
    "truncate",
)
# OpenAI's defaults, applied over the package's generation_config.json.
OPENAI_DEFAULTS = {"top_p": 1.0, "top_k": 0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
DEFAULT_MAX_TOKENS = 16
RUNTIME_TO_FIELD = {"max_new_tokens": "max_tokens", "num_return_sequences": "n"}


class ApiError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a command-line option of `edgelm serve`."""

    max_tokens: int = 1024  # max_tokens above this is refused (default: the model's context)
    max_n: int = 8  # completions per prompt
    max_prompts: int = 16  # prompts in one request
    max_body_bytes: int = 1_000_000  # request body size (413 above)
    request_timeout: float = 300.0  # seconds from arrival, queue time included (408 above)


@dataclass
class CompletionRequest:
    """One parsed /v1/completions body: the prompts, the runtime options, and how to shape the answer."""

    prompts: list
    options: dict  # runtime option names (GenerationConfig)
    max_tokens: int  # 0: no generation (echo the prompt, with its log-probs if asked)
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: one last chunk with the usage
    echo: bool = False
    logprobs: int | None = None
    user: str | None = None
    id: str = field(default_factory=lambda: "cmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))


def parse_completion_request(body, model, limits: Limits) -> CompletionRequest:
    """Check a decoded JSON body against `model` (a runtime Model) and the limits; raises ApiError naming the bad field."""
    body = _fields(body, COMPLETION_FIELDS)
    _check_model(body.get("model"), model.package.name)
    prompts = body.get("prompt", "")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not prompts:
        raise ApiError(400, "prompt must not be an empty list", "prompt")
    if len(prompts) > limits.max_prompts:
        raise ApiError(
            400,
            f"{len(prompts)} prompts in one request; this server takes at most {limits.max_prompts} (--max-prompts)",
            "prompt",
        )
    echo = body.get("echo") or False
    max_tokens = body.get("max_tokens", min(DEFAULT_MAX_TOKENS, limits.max_tokens))
    if max_tokens < 0 or (max_tokens == 0 and not echo):
        raise ApiError(
            400,
            f"max_tokens must be >= 1 (0 only with echo, to get the prompt's log-probs), got {max_tokens}",
            "max_tokens",
        )
    if max_tokens > limits.max_tokens:
        raise ApiError(
            400,
            f"max_tokens is {max_tokens}; this server allows at most {limits.max_tokens} (--max-tokens-limit)",
            "max_tokens",
        )
    n = body.get("n", 1)
    if not 1 <= n <= limits.max_n:
        raise ApiError(400, f"n must be from 1 to {limits.max_n} on this server (--max-n), got {n}", "n")
    if body.get("best_of") not in (None, n):
        raise ApiError(
            400, "best_of is not supported (every completion is returned); leave it out or set it equal to n", "best_of"
        )
    if body.get("suffix"):
        raise ApiError(400, "suffix is not supported: GPT-2 models cannot fill in the middle", "suffix")
    stream = body.get("stream") or False
    stream_options = _fields(body.get("stream_options") or {}, {"include_usage": BOOL}, "stream_options.")
    if stream_options and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    if "min_tokens" in body and "min_new_tokens" in body:
        raise ApiError(400, "give min_tokens or min_new_tokens, not both (they are the same option)", "min_tokens")

    temperature = body.get("temperature", 1.0)
    options = {**OPENAI_DEFAULTS, **{k: body[k] for k in PASSTHROUGH if k in body}}
    options.update(max_new_tokens=max(max_tokens, 1), num_return_sequences=n, do_sample=temperature != 0)
    if temperature != 0:
        options["temperature"] = temperature  # a negative one is refused by the runtime's check
    if "logit_bias" in body:
        options["logit_bias"] = _logit_bias(body["logit_bias"], model.arch.vocab_size)
    for name in ("min_tokens", "min_new_tokens"):
        if name in body:
            options["min_new_tokens"] = body[name]
    try:
        model.settings(**options)
    except GenerationOptionError as error:
        raise ApiError(400, str(error), param_of(str(error), body)) from None
    return CompletionRequest(
        prompts,
        options,
        max_tokens,
        n,
        stream,
        stream_options.get("include_usage", False),
        echo,
        body.get("logprobs"),
        body.get("user"),
    )


def parse_score_request(body, model_id: str) -> str:
    """The text of a /v1/score body {"text": ..., "model"?: ...}."""
    body = _fields(body, {"text": STRING, "model": STRING})
    _check_model(body.get("model"), model_id)
    if "text" not in body:
        raise ApiError(400, "text is required: the text to score", "text")
    return body["text"]


def _fields(body, spec: dict, prefix: str = "") -> dict:
    """The body's fields with nulls dropped, after checking names and JSON types."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the {'request body' if not prefix else prefix[:-1]} must be a JSON object")
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise ApiError(
            400,
            f"unknown field {prefix}{unknown[0]!r}; this endpoint takes: {', '.join(sorted(spec))}",
            prefix + unknown[0],
            "unknown_field",
        )
    given = {k: v for k, v in body.items() if v is not None}
    for name, value in given.items():
        if not _is(value, spec[name]):
            raise ApiError(
                400,
                f"{prefix}{name} must be {spec[name]}, got {_json_type(value)} {value!r:.60}",
                prefix + name,
                "invalid_type",
            )
    return given


def _is(value, kind: str) -> bool:
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == STRING:
        return isinstance(value, str)
    if kind == OBJECT:
        return isinstance(value, dict)
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))  # STRINGS


def _json_type(value) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _check_model(name: str | None, model_id: str) -> None:
    if name is not None and name != model_id:
        raise ApiError(
            404,
            f"the model {name!r} does not exist here; this server runs {model_id!r} (GET /v1/models)",
            "model",
            "model_not_found",
        )


def _logit_bias(bias: dict, vocab_size: int) -> dict:
    """OpenAI's {"token id as a string": bias in [-100, 100]} -> {int: float}."""
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise ApiError(
                400,
                f"logit_bias keys must be token ids from 0 to {vocab_size - 1} written as strings, like \"42\"; got {key!r}",
                "logit_bias",
            )
        if not _is(value, NUMBER) or not -100 <= value <= 100:
            raise ApiError(
                400, f"logit_bias values must be numbers from -100 to 100; {key!r} has {value!r}", "logit_bias"
            )
        out[int(key)] = float(value)
    return out


def param_of(message: str, body: dict) -> str | None:
    """The request field a runtime error message is about: its first word, in the request's own name."""
    word = message.split(" ", 1)[0]
    if word == "min_new_tokens":
        return "min_tokens" if "min_tokens" in body else "min_new_tokens"
    if word == "logit_bias":
        return "logit_bias"
    word = RUNTIME_TO_FIELD.get(word, word)
    return word if word in COMPLETION_FIELDS else None


# Responses -------------------------------------------------------------------------------------------


def choices(request: CompletionRequest, completions: list | None, scores: list | None) -> list:
    """One choice per (prompt, sequence), index = prompt_index * n + sequence, as OpenAI numbers them.

    completions: the Batch's, or None when max_tokens is 0; scores: each prompt's Score when
    echo and logprobs are both asked for (the prompt's own log-probs come first), else None.
    """
    out = []
    for index in range(len(request.prompts) * request.n):
        prompt_index = index // request.n
        completion = completions[index] if completions else None
        text = (request.prompts[prompt_index] if request.echo else "") + (completion.text if completion else "")
        finish_reason = completion.finish_reason if completion else "length"
        out.append(
            choice(index, text, logprobs(request, completion, scores[prompt_index] if scores else None), finish_reason)
        )
    return out


def choice(index: int, text: str, logprobs: dict | None = None, finish_reason: str | None = None) -> dict:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


def logprobs(request: CompletionRequest, completion, score) -> dict | None:
    """OpenAI's legacy shape {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.

    Prompt tokens (echo) come from Model.score: each is conditioned on what precedes it, the first on
    end-of-text, and their top_logprobs are null (scoring computes the chosen token's only).
    """
    if request.logprobs is None:
        return None
    tokens, values, tops = [], [], []
    if score is not None:
        tokens += score.tokens
        values += [_finite(v) for v in score.logprobs]
        tops += [None] * len(score.tokens)
    for entry in (completion.logprobs or []) if completion else []:
        tokens.append(entry["token"])
        values.append(_finite(entry["logprob"]))
        top = {}
        for alternative in entry["top_logprobs"]:  # most likely first; tokens that print alike keep the first
            top.setdefault(alternative["token"], _finite(alternative["logprob"]))
        tops.append(top)
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(request: CompletionRequest, model_id: str, choices: list, usage: dict | None = None) -> dict:
    """A whole response, or (stream) one chunk: same object, same id, a few choices at a time."""
    body = {
        "id": request.id,
        "object": "text_completion",
        "created": request.created,
        "model": model_id,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def score(text_score, model_id: str) -> dict:
    return {
        "object": "score",
        "model": model_id,
        "tokens": text_score.tokens,
        "token_ids": text_score.token_ids,
        "token_logprobs": [_finite(v) for v in text_score.logprobs],
        "perplexity": _finite(text_score.perplexity),
        "usage": {"prompt_tokens": len(text_score.token_ids), "total_tokens": len(text_score.token_ids)},
    }


def _finite(value):
    """JSON has no NaN: a log-prob that does not exist (nothing to condition on) is null."""
    return float(value) if value is not None and math.isfinite(value) else None
