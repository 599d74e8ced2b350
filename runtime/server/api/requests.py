"""Request bodies in: the fields every generation endpoint shares, the server's limits (limits.py), and the runtime
options they become; the /v1/completions, /v1/score, /tokenize and /detokenize bodies.

Nothing here touches the network or threads. Shapes are checked by the pydantic models (schema.py); value
ranges belong to the runtime's GenerationConfig, which the pipeline builds once from `request.options`. What
stays here: the server's own limits (max_tokens, n, prompts, body size, tokens held) and OpenAI's rules that have
no runtime option (best_of, suffix, stream_options, logit_bias' string keys).

OpenAI semantics on top of the runtime's transformers names:
    temperature 0 -> greedy (do_sample=False); temperature > 0 -> sampling; default 1.0 (sampling)
    top_k defaults to 0 (off): OpenAI has no top-k; the package's generation_config.json may say otherwise,
    but an OpenAI client expects plain temperature/top_p sampling. Send "top_k" to turn it on.
    max_tokens -> max_new_tokens (default 16, as OpenAI); n -> num_return_sequences; min_tokens -> min_new_tokens
    ban (words never to generate) -> bad_words_ids, the token sequences that write them (model.settings)
The fields that pass to the runtime under their own name, and the server's defaults, are declared with the options
(runtime/generation_options.py).
"""

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, create_model

from ... import inputs
from ...errors import GenerationOptionError, PromptError
from ...generation_config import logit_bias_ids
from ...generation_options import OPTIONS, request_fields, server_defaults
from ..api_errors import ApiError
from ..limits import Limits  # noqa: F401  (the endpoints' and the tests' name for it)
from .schema import STRICT, TEXTS, Text, validate
from .structured import refuse_stop, response_format_options

DEFAULT_MAX_TOKENS = 16
# The request fields each generation option is read from, where they differ from the option's name (for `param`).
FIELD_OF = {"max_new_tokens": "max_tokens", "num_return_sequences": "n", "do_sample": "temperature"}
FIELD_OF["bad_words_ids"] = "ban"  # the body has no bad_words_ids: the ban's words became them
ALIASES = {o.name: o.alias for o in request_fields() if o.alias}  # min_new_tokens: also min_tokens
PROMPTS = "a string or a list of strings, or token ids: a list of integers or a list of such lists"


@dataclass(frozen=True)
class ModelNames:
    """The names a request's `model` may give: the id /v1/models lists, its aliases (--model-name), or any name
    at all with --accept-any-model. A request without `model` is served too."""

    id: str
    aliases: tuple = ()
    accept_any: bool = False

    def check(self, name: str | None) -> None:
        if name is None or self.accept_any or name == self.id or name in self.aliases:
            return
        raise ApiError(
            404,
            f"the model {name[:100]!r} does not exist here; this server runs {self.id!r} (GET /v1/models; "
            "edgelm serve --model-name NAME adds a name, --accept-any-model takes any)",
            "model",
            "model_not_found",
        )


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # OpenAI pads its events against length side channels; nothing to pad


class EndpointFields(BaseModel):
    """The fields the completions and chat endpoints share that each reads with OpenAI's own meaning."""

    model_config = STRICT
    model: Text | None = None
    temperature: float | None = None  # 0: greedy (do_sample=False)
    n: int | None = None  # num_return_sequences, up to --max-n
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict[Text, float] | None = None  # token ids as strings, biases in [-100, 100]
    response_format: Any = None  # checked by structured.py, which names the bad part
    user: Text | None = None  # accepted and ignored (fields.py)


def sampling_body(options=OPTIONS) -> type[BaseModel]:
    """The body model with EndpointFields and a field for each option of `options` a request carries under its own
    name or alias (runtime/generation_options.py): OpenAI's sampling options, then edgelm's own."""
    fields = {}
    for option in request_fields(options):
        if option.form == "repeated":
            typed = (Text | list[Text] | None, Field(None, description=TEXTS))
        else:
            typed = (option.field_type | None, None)
        fields.update({name: typed for name in (option.name, option.alias) if name})
    return create_model("SamplingBody", __base__=EndpointFields, __module__=__name__, **fields)


SamplingBody = sampling_body()  # each endpoint's body adds its own fields


@dataclass(kw_only=True)
class GenerationRequest:
    """What every parsed generation request holds: the runtime options and how to shape the answer."""

    options: dict  # runtime option names (GenerationConfig)
    max_tokens: int | None = None  # None: what the context leaves after the prompt (chat)
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: one last chunk with the usage
    given: frozenset = frozenset()  # the fields the body set
    body_bytes: int = 0  # the size of the body it came in (a chat's decides where its template renders)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def field_of(self, option: str | None) -> str | None:
        """The request field a runtime option (or a PromptError's "prompt") came from, for the error's `param`."""
        if option in ALIASES:
            return ALIASES[option] if ALIASES[option] in self.given else option
        if option in ("json_schema", "json_object"):
            return "response_format"
        return FIELD_OF.get(option, option)

    def tokens_held(self, prompt_tokens: list) -> int:
        """Tokens this request's rows hold at their longest: n x (prompt + max_tokens), over its prompts."""
        length = 1 if self.max_tokens is None else self.max_tokens
        return self.n * sum(count + length for count in prompt_tokens)


def sampling_request(parsed: SamplingBody, given: set, vocab_size: int, limits: Limits, declared=OPTIONS) -> dict:
    """The shared fields' checks and options: a dict of GenerationRequest's fields (options, n, stream, ...).
    `declared`: the options the body was built from (sampling_body)."""
    n = 1 if parsed.n is None else parsed.n
    if not 1 <= n <= limits.max_n:
        raise ApiError(400, f"n must be from 1 to {limits.max_n} on this server (--max-n), got {n}", "n")
    stream = bool(parsed.stream)
    if parsed.stream_options is not None and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    for option, alias in ALIASES.items():
        if option in given and alias in given:
            raise ApiError(400, f"give {alias} or {option}, not both (they are the same option)", alias)
    temperature = 1.0 if parsed.temperature is None else parsed.temperature
    options = server_defaults(declared) | {"speculative": limits.speculative}  # the server's (--speculative)
    for option in request_fields(declared):
        for name in (option.name, option.alias):
            if name in given:
                options[option.name] = getattr(parsed, name)
    options.update(num_return_sequences=n, do_sample=temperature != 0)
    if temperature != 0:
        options["temperature"] = temperature  # a negative one is refused by the runtime's check
    if "logit_bias" in given:
        options["logit_bias"] = logit_bias(parsed.logit_bias, vocab_size)
    options.update(response_format_options(parsed.response_format))
    refuse_stop(options, "response_format" if {"json_schema", "json_object"} & set(options) else None)
    return {
        "options": options,
        "n": n,
        "stream": stream,
        "include_usage": bool(parsed.stream_options and parsed.stream_options.include_usage),
        "given": frozenset(given),
    }


def given_fields(parsed: BaseModel) -> set:
    """The fields a body set to something other than null."""
    return {name for name in parsed.model_fields_set if getattr(parsed, name) is not None}


def check_max_tokens(value: int | None, name: str, limits: Limits, least: int = 1) -> None:
    if value is not None and value < least:
        raise ApiError(400, f"{name} must be >= {least}, got {value}", name)
    if value is not None and value > limits.max_tokens:
        raise ApiError(
            400, f"{name} is {value}; this server allows at most {limits.max_tokens} (--max-tokens-limit)", name
        )


# -- POST /v1/completions --------------------------------------------------------------------------------


class CompletionBody(SamplingBody):
    """POST /v1/completions."""

    prompt: Text | list[Text] | list[int] | list[list[int]] | None = Field(None, description=PROMPTS)
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: Text | None = None


@dataclass(kw_only=True)
class CompletionRequest(GenerationRequest):
    """One parsed /v1/completions body: the prompts, the runtime options, and how to shape the answer."""

    prompts: list  # each a string or a list of token ids
    max_tokens: int  # 0: no generation (echo the prompt, with its log-probs if asked)
    echo: bool = False
    logprobs: int | None = None
    prompt_texts: list = field(default_factory=list)  # each prompt as text (token ids decoded), set once tokenized
    id: str = field(default_factory=lambda: "cmpl-" + secrets.token_hex(12))


def parse_completion_request(body, names: ModelNames, vocab_size: int, limits: Limits) -> CompletionRequest:
    """Check a decoded JSON body's shape and the server's limits; raises ApiError naming the bad field.
    The options' ranges are checked where they are used: model.settings(**request.options)."""
    parsed = validate(CompletionBody, body)
    given = given_fields(parsed)
    names.check(parsed.model)
    prompts = _prompts(parsed.prompt, vocab_size)
    if len(prompts) > limits.max_prompts:
        raise ApiError(
            400,
            f"{len(prompts)} prompts in one request; this server takes at most {limits.max_prompts} (--max-prompts)",
            "prompt",
        )
    echo = bool(parsed.echo)
    max_tokens = min(DEFAULT_MAX_TOKENS, limits.max_tokens) if parsed.max_tokens is None else parsed.max_tokens
    if max_tokens < 0 or (max_tokens == 0 and not echo):
        raise ApiError(
            400,
            f"max_tokens must be >= 1 (0 only with echo, to get the prompt's log-probs), got {max_tokens}",
            "max_tokens",
        )
    check_max_tokens(max_tokens, "max_tokens", limits, least=0)
    shared = sampling_request(parsed, given, vocab_size, limits)
    if parsed.best_of not in (None, shared["n"]):
        raise ApiError(
            400, "best_of is not supported (every completion is returned); leave it out or set it equal to n", "best_of"
        )
    if parsed.suffix:
        raise ApiError(400, "suffix is not supported: GPT-2 models cannot fill in the middle", "suffix")
    shared["options"].update(max_new_tokens=max(max_tokens, 1))
    if "logprobs" in given:
        shared["options"]["logprobs"] = parsed.logprobs
    request = CompletionRequest(prompts=prompts, max_tokens=max_tokens, echo=echo, logprobs=parsed.logprobs, **shared)
    check_tokens_held(request, [1] * len(prompts), limits)  # the bound before tokenizing; again after
    return request


def _prompts(prompt, vocab_size: int) -> list:
    """The prompts of a request, each a string or a list of token ids (checked against the vocabulary).
    OpenAI's forms: "text", ["text", ...], [id, ...] (one prompt) and [[id, ...], ...]."""
    if prompt is None:
        return [""]
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be an empty list", "prompt")
    prompts = [prompt] if isinstance(prompt[0], int) else prompt
    for i, ids in enumerate(prompts):
        if isinstance(ids, list):
            check_token_ids(ids, vocab_size, f"prompt[{i}]" if len(prompts) > 1 else "prompt", "prompt")
    return prompts


def check_token_ids(ids: list, vocab_size: int, where: str, param: str) -> None:
    """Refuse an id outside the vocabulary, naming where it is."""
    try:
        inputs.check_token_ids(ids, vocab_size, where)
    except PromptError as error:
        raise ApiError(400, str(error), param, "invalid_token_id") from None


def check_tokens_held(request: GenerationRequest, prompt_tokens: list, limits: Limits) -> None:
    """Refuse a request whose rows would hold more tokens than --max-batch-tokens (the KV cache grows with them)."""
    held = request.tokens_held(prompt_tokens)
    if held > limits.max_batch_tokens:
        raise ApiError(
            400,
            f"this request would hold {held} tokens ({len(prompt_tokens)} prompts x n={request.n} x (prompt + "
            f"max_tokens={request.max_tokens})); this server allows {limits.max_batch_tokens} per request "
            "(--max-batch-tokens): send fewer prompts, a smaller n or max_tokens",
            "prompt" if len(prompt_tokens) > 1 else "max_tokens",
            "request_too_large",
        )


def logit_bias(bias: dict, vocab_size: int) -> dict:
    """OpenAI's {"token id as a string": bias in [-100, 100]} -> {int: float}."""
    try:
        out = logit_bias_ids(bias, vocab_size)
    except GenerationOptionError as error:
        raise ApiError(400, str(error), "logit_bias") from None
    for key, value in out.items():
        if not -100 <= value <= 100:
            raise ApiError(
                400, f"logit_bias values must be numbers from -100 to 100; {str(key)!r} has {value!r}", "logit_bias"
            )
    return out


# -- POST /v1/score, /tokenize, /detokenize --------------------------------------------------------------


class TokenizeBody(BaseModel):
    """POST /tokenize (llama-server's shape)."""

    model_config = STRICT
    content: Text
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    """POST /detokenize (llama-server's shape)."""

    model_config = STRICT
    tokens: list[int] = Field(description="a list of token ids")


class ScoreBody(BaseModel):
    """POST /v1/score."""

    model_config = STRICT
    text: Text | None = None
    model: Text | None = None


def parse_tokenize_request(body) -> TokenizeBody:
    return validate(TokenizeBody, body)


def parse_detokenize_request(body, vocab_size: int) -> list:
    ids = validate(DetokenizeBody, body).tokens
    check_token_ids(ids, vocab_size, "tokens", "tokens")
    return ids


def parse_score_request(body, names: ModelNames) -> str:
    """The text of a /v1/score body {"text": ..., "model"?: ...}."""
    parsed = validate(ScoreBody, body)
    names.check(parsed.model)
    if parsed.text is None:
        raise ApiError(400, "text is required: the text to score", "text")
    return parsed.text
