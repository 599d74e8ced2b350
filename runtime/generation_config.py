"""Generation settings: one dataclass, transformers' names and meanings, checked once where they are built.

Precedence: GenerationConfig defaults < the package's generation_config.json < the caller's arguments.
A GenerationConfig is valid by construction: building one normalizes the values (a stop string becomes a
tuple, lists become tuples, logit_bias keys become ints) and raises GenerationOptionError, whose `param`
names the option, for the first value out of range. With `vocab_size` set (a model's settings() sets it),
every token id an option names is checked against the vocabulary too, so nothing downstream checks again.
A constraint (json_schema, json_object, regex, grammar, choices) is held as plain text, checked here for its
shape and size only (runtime/constraint_text.py); llguidance reads it where generation runs
(runtime/sampling/constraint.py): Model.settings refuses one it cannot read, and a model compiles it for its
tokenizer before the first token.
Which value turns each sampling filter off is written once, in runtime/sampling/chain.py.
"""

import math
from dataclasses import dataclass, field, fields, replace
from numbers import Integral, Real

from .constraint_bounds import check_choices
from .constraint_text import MAX_TEXT, schema_text
from .errors import GenerationOptionError
from .inputs import is_token_id

PACKAGE_FACTS = ("vocab_size",)  # set from the package, never a caller's option
# OpenAI allows a request 4 stop strings; the rest leaves room for a chat template's own (model.chat_batch adds them)
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 4096  # all stop strings together; each is searched for in every row at every step
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "typical_p")  # meaningful only when sampling
CONSTRAINTS = ("json_schema", "json_object", "regex", "grammar", "choices")  # at most one per request
SPECULATIVE = ("auto", "ngram", "draft", "off")  # the speculative option's values (runtime/speculative/)


@dataclass(frozen=True)
class Interval:
    """The values a number option may take, written once: checked here, shown in its help and its error."""

    low: float
    high: float
    low_open: bool = False  # low itself is outside

    def __contains__(self, value) -> bool:
        return _is_number(value) and (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


RANGES = {"top_p": Interval(0, 1, low_open=True), "min_p": Interval(0, 1), "typical_p": Interval(0, 1, low_open=True)}
RANGES |= {"frequency_penalty": Interval(-2, 2), "presence_penalty": Interval(-2, 2)}  # OpenAI's


def sampling_implied(options: dict) -> dict:
    """The options with do_sample=True added when a sampling option is given and do_sample is not: what a
    command-line option or a line of a prompt file means by "--temperature 0.7" alone."""
    if "do_sample" not in options and any(k in options for k in SAMPLING_OPTIONS):
        return {**options, "do_sample": True}
    return options


@dataclass(frozen=True)
class GenerationConfig:
    """Every knob of one generation request. Filter options default to their no-op value, except top_k:
    50 is transformers' default, and it is active (0 turns it off)."""

    max_new_tokens: int = 50  # stop after this many new tokens ("length")
    min_new_tokens: int = 0  # end-of-text is banned until this many tokens exist
    do_sample: bool = False  # False: greedy (argmax); True: sample from the filtered distribution
    temperature: float = 1.0  # divides logits (sampling only)
    top_k: int = 50  # keep the k most likely tokens (sampling only); transformers' default, active; 0 is off
    top_p: float = 1.0  # nucleus: smallest set with cumulative probability >= top_p (sampling only)
    min_p: float = 0.0  # drop tokens below min_p * p(most likely) (sampling only)
    typical_p: float = 1.0  # locally typical sampling mass (sampling only)
    repetition_penalty: float = 1.0  # CTRL-style penalty on every token seen (prompt too)
    no_repeat_ngram_size: int = 0  # ban tokens that would repeat an n-gram already present
    frequency_penalty: float = 0.0  # OpenAI: subtract penalty * count of the token among generated tokens
    presence_penalty: float = 0.0  # OpenAI: subtract penalty once if the token was generated at all
    logit_bias: dict = field(default_factory=dict)  # {token_id: bias added to its logit}
    bad_words_ids: tuple = ()  # token-id sequences that must never be generated (banned tokens are 1-long)
    ignore_eos: bool = False  # keep going past end-of-text
    stop: tuple = ()  # strings that end generation; not included in the output
    # Constrained decoding (runtime/sampling/constraint.py, llguidance): at most one of the next five.
    json_schema: str | None = None  # the output is JSON valid under this schema (given as a dict, its JSON text, or
    # a class with model_json_schema(), such as a pydantic model); held as JSON text
    json_object: bool = False  # the output is a JSON object, any
    regex: str | None = None  # the output matches this regular expression, whole (Rust regex syntax)
    grammar: str | None = None  # the output is a sentence of this Lark grammar, as llguidance reads it
    choices: tuple | None = None  # the output is exactly one of these strings
    num_return_sequences: int = 1  # completions per prompt; above 1 needs do_sample, as in transformers
    greedy_copies: bool = False  # True: num_return_sequences > 1 without sampling gives identical greedy rows
    # (OpenAI's n at temperature 0, which the server keeps); False refuses them, as transformers does
    seed: int | None = None  # same seed, prompt and options -> same tokens
    logprobs: int | None = None  # None: off; N >= 0: the chosen token's log-prob and the top-N alternatives
    truncate: bool = False  # prompt + max_new_tokens over the context: False raises, True drops the oldest tokens
    # several tokens per pass, the output unchanged (runtime/speculative/): "auto" feeds a constraint's forced
    # tokens (and a loaded draft model's guesses) in one pass, "ngram" adds prompt lookup, "draft" a draft model's
    # guesses, "off" one token per pass
    speculative: str = "auto"
    # from the package: generation stops at any of these ids (given as one id or a list, as transformers takes it;
    # held as a tuple); None means never stop on a token
    eos_token_id: tuple | None = None
    pad_token_id: int | None = None
    vocab_size: int | None = None  # from the package: every token id above must be below it (None: not checked)

    def __post_init__(self):
        for name, value in _normalized(self).items():
            object.__setattr__(self, name, value)  # frozen: normalizing is part of construction
        _check(self)

    @property
    def constraint(self) -> tuple | None:
        """(kind, value) of the constraint in effect, kind one of CONSTRAINTS, or None: the key a compiled grammar
        is cached under (runtime/sampling/constraint.py)."""
        for kind in CONSTRAINTS:
            value = getattr(self, kind)
            if value is not None and value is not False:
                return kind, value
        return None

    @property
    def stop_ids(self) -> tuple:
        """The ids that end a row: every end-of-text id, none with ignore_eos."""
        return () if self.ignore_eos else self.eos_token_id or ()

    def with_options(self, **options) -> "GenerationConfig":
        """A copy with the caller's options applied (None leaves an option as it is, except for the options
        whose None means "off"); unknown names and bad values raise GenerationOptionError."""
        known = {f.name for f in fields(self)} - set(PACKAGE_FACTS)
        unknown = sorted(set(options) - known)
        if unknown:
            raise GenerationOptionError(
                f"unknown generation option(s): {', '.join(unknown)}. Known: {', '.join(sorted(known))}.",
                param=unknown[0],
            )
        nullable = ("seed", "logprobs", "eos_token_id", "pad_token_id")
        return replace(self, **{k: v for k, v in options.items() if v is not None or k in nullable})

    @classmethod
    def from_generation_config_json(
        cls, data: dict, eos_token_id=None, pad_token_id=None, vocab_size=None
    ) -> "GenerationConfig":
        """The package's generation_config.json (transformers' format); fields we do not know are ignored."""
        known = {f.name for f in fields(cls)} - set(PACKAGE_FACTS)
        values = {k: v for k, v in data.items() if k in known and v is not None}
        if "max_new_tokens" not in values and isinstance(data.get("max_length"), int):
            values["max_new_tokens"] = max(1, data["max_length"])  # GPT-2 configs give max_length only
        values["eos_token_id"] = values.pop("eos_token_id", eos_token_id)  # one id or a list of them
        values["pad_token_id"] = values.pop("pad_token_id", pad_token_id)
        values.pop("num_return_sequences", None)
        values.pop("greedy_copies", None)  # the caller's choice (the server's), never a package's
        values.pop("speculative", None)  # how the runtime decodes, never a package's
        for name in CONSTRAINTS:  # a request's shape, never a package's default
            values.pop(name, None)
        return cls(**values, vocab_size=vocab_size)


def without_constraint(config: GenerationConfig) -> GenerationConfig:
    """The same settings with no constraint."""
    return replace(config, json_schema=None, json_object=False, regex=None, grammar=None, choices=None)


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    if not isinstance(value, Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past float's range (JSON allows 10**400)
        return False


def _need(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise GenerationOptionError(message, param=param)


def stop_strings(stop) -> tuple:
    """The stop strings as a tuple of non-empty strings, at most MAX_STOP_STRINGS of them and MAX_STOP_CHARS in
    all (each is looked for in every row's new text at every step); raises GenerationOptionError otherwise."""
    if isinstance(stop, str):
        raise GenerationOptionError(
            f"stop must be a tuple of strings, not one string; use stop=({stop!r:.80},)", "stop"
        )
    _need(
        isinstance(stop, tuple) and all(isinstance(s, str) and s for s in stop),
        "stop",
        f"stop must be a list of non-empty strings, got {stop!r:.80}",
    )
    _need(
        len(stop) <= MAX_STOP_STRINGS,
        "stop",
        f"stop lists {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed (OpenAI's API allows 4)",
    )
    total = sum(map(len, stop))
    _need(
        total <= MAX_STOP_CHARS,
        "stop",
        f"the stop strings are {total} characters in all; at most {MAX_STOP_CHARS} are allowed",
    )
    return stop


def check_token_ids(param: str, ids, vocab_size: int | None) -> None:
    """Raise GenerationOptionError(param=param) naming the ids outside the vocabulary [0, vocab_size)."""
    bad = sorted({t for t in ids if not is_token_id(t, vocab_size)})
    if bad:
        where = f"this model's vocabulary (ids 0 to {vocab_size - 1})" if vocab_size is not None else "0 and up"
        raise GenerationOptionError(
            f"{param} names token id(s) {bad[:10]} outside {where}; use token ids in that range", param=param
        )


def logit_bias_ids(bias, vocab_size: int | None = None) -> dict:
    """The logit_bias option as {token id: float bias}: keys are token ids (integers, or their digits as JSON object
    keys are strings), values finite numbers; with vocab_size, every id within the vocabulary. Raises
    GenerationOptionError(param="logit_bias") for the first that is not."""
    _need(
        isinstance(bias, dict),
        "logit_bias",
        f"logit_bias must be a mapping of token id to bias, e.g. {{50256: -100}}, got {bias!r:.80}",
    )
    normalized = {}
    for key, value in bias.items():
        # JSON object keys are strings; at most 18 digits, as no vocabulary is larger (int() of 5,000 raises)
        digits = isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18
        token = int(key) if _is_int(key) or digits else None
        _need(token is not None, "logit_bias", f"logit_bias keys must be token ids (integers), got {key!r:.40}")
        _need(_is_number(value), "logit_bias", f"logit_bias values must be finite numbers; {key!r} has {value!r:.40}")
        normalized[token] = float(value)
    check_token_ids("logit_bias", normalized, vocab_size)
    return normalized


def _normalized(c: GenerationConfig) -> dict:
    """The values that need a canonical form: tuples for sequences, ints and floats in logit_bias."""
    out = {}
    stop = c.stop
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list):
        stop = tuple(stop)
    out["stop"] = stop_strings(stop)

    words = c.bad_words_ids
    _need(
        isinstance(words, (list, tuple))
        and all(isinstance(w, (list, tuple)) and w and all(_is_int(t) for t in w) for w in words),
        "bad_words_ids",
        f"bad_words_ids must be a list of non-empty token-id lists, e.g. [[464], [50256]], got {words!r:.80}",
    )
    out["bad_words_ids"] = tuple(tuple(int(t) for t in w) for w in words)

    out["logit_bias"] = logit_bias_ids(c.logit_bias)  # against the vocabulary in _check, with the other ids

    eos = c.eos_token_id
    if _is_int(eos):
        eos = (eos,)
    _need(
        eos is None or (isinstance(eos, (list, tuple)) and all(_is_int(t) for t in eos)),
        "eos_token_id",
        f"eos_token_id must be a token id or a list of them, e.g. [128001, 128009], got {eos!r:.80}",
    )
    ids = tuple(dict.fromkeys(int(t) for t in eos or ()))  # in order, each once
    out["eos_token_id"] = ids or None
    out.update(_constraint_values(c))
    return out


def _constraint_values(c: GenerationConfig) -> dict:
    """The constraint options in canonical form: the schema as JSON text, the choices as a tuple of strings."""
    out = {}
    if c.json_schema is not None:
        out["json_schema"] = schema_text(c.json_schema)
    for name in ("regex", "grammar"):
        value = getattr(c, name)
        _need(
            value is None or (isinstance(value, str) and 0 < len(value) <= MAX_TEXT),
            name,
            f"{name} must be a non-empty string of at most {MAX_TEXT:,} characters, got {str(value)[:40]!r}",
        )
    choices = c.choices
    if choices is not None:
        _need(
            isinstance(choices, (list, tuple))
            and choices
            and all(isinstance(x, str) and x for x in choices)
            and sum(map(len, choices)) <= MAX_TEXT,
            "choices",
            f'choices must be a non-empty list of non-empty strings (at most {MAX_TEXT:,} characters in all), e.g. ["yes", "no"], got {str(choices)[:60]}',
        )
        out["choices"] = tuple(dict.fromkeys(choices))
        check_choices(out["choices"])  # a count llguidance can run, refused before any compile
    return out


def _check(c: GenerationConfig) -> None:
    """Raise GenerationOptionError naming the first option out of range."""
    _need(
        _is_int(c.max_new_tokens) and c.max_new_tokens >= 1,
        "max_new_tokens",
        f"max_new_tokens must be an integer >= 1, got {c.max_new_tokens!r}",
    )
    _need(
        _is_int(c.min_new_tokens) and 0 <= c.min_new_tokens <= c.max_new_tokens,
        "min_new_tokens",
        f"min_new_tokens must be an integer between 0 and max_new_tokens ({c.max_new_tokens}), got {c.min_new_tokens!r}",
    )
    for name in ("do_sample", "truncate", "ignore_eos", "greedy_copies", "json_object"):
        _need(isinstance(getattr(c, name), bool), name, f"{name} must be true or false, got {getattr(c, name)!r}")
    _need(
        _is_number(c.temperature) and c.temperature >= 0,
        "temperature",
        f"temperature must be a number >= 0, got {c.temperature!r}",
    )
    _need(
        not (c.do_sample and c.temperature == 0),
        "temperature",
        "temperature 0 means greedy: set do_sample=False instead (or a temperature > 0)",
    )
    _need(
        _is_int(c.top_k) and c.top_k >= 0, "top_k", f"top_k must be an integer >= 0 (0 turns it off), got {c.top_k!r}"
    )
    for name in ("top_p", "min_p", "typical_p"):
        value = getattr(c, name)
        _need(value in RANGES[name], name, f"{name} must be in {RANGES[name]}, got {value!r}")
    _need(
        _is_number(c.repetition_penalty) and c.repetition_penalty > 0,
        "repetition_penalty",
        f"repetition_penalty must be a number > 0 (1.0 turns it off), got {c.repetition_penalty!r}",
    )
    _need(
        _is_int(c.no_repeat_ngram_size) and c.no_repeat_ngram_size >= 0,
        "no_repeat_ngram_size",
        f"no_repeat_ngram_size must be an integer >= 0, got {c.no_repeat_ngram_size!r}",
    )
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(c, name)
        _need(value in RANGES[name], name, f"{name} must be a number in {RANGES[name]}, got {value!r}")
    _need(
        _is_int(c.num_return_sequences) and c.num_return_sequences >= 1,
        "num_return_sequences",
        f"num_return_sequences must be an integer >= 1, got {c.num_return_sequences!r}",
    )
    _need(  # transformers' GenerationConfig.validate, word for word, then what to do
        c.num_return_sequences == 1 or c.do_sample or c.greedy_copies,
        "num_return_sequences",
        "Greedy methods without beam search do not support `num_return_sequences` different than 1 "
        f"(got {c.num_return_sequences}): greedy rows would all be the same. Sample (do_sample=True, --do-sample) "
        "to get different sequences, or ask for one.",
    )
    _need(
        c.speculative in SPECULATIVE,
        "speculative",
        f"speculative must be one of {', '.join(SPECULATIVE)}, got {str(c.speculative)[:40]!r}",
    )
    _need(c.seed is None or (_is_int(c.seed) and c.seed >= 0), "seed", f"seed must be an integer >= 0, got {c.seed!r}")
    _need(
        c.logprobs is None or (_is_int(c.logprobs) and 0 <= c.logprobs <= 20),
        "logprobs",
        f"logprobs must be an integer from 0 to 20, got {c.logprobs!r}",
    )
    _need(
        c.vocab_size is None or (_is_int(c.vocab_size) and c.vocab_size >= 1),
        "vocab_size",
        f"vocab_size must be an integer >= 1, got {c.vocab_size!r}",
    )
    _need(
        c.pad_token_id is None or _is_int(c.pad_token_id),
        "pad_token_id",
        f"pad_token_id must be a token id (an integer), got {c.pad_token_id!r}",
    )
    check_token_ids("pad_token_id", [] if c.pad_token_id is None else [c.pad_token_id], c.vocab_size)
    check_token_ids("eos_token_id", c.eos_token_id or (), c.vocab_size)
    check_token_ids("logit_bias", c.logit_bias, c.vocab_size)
    check_token_ids("bad_words_ids", {t for word in c.bad_words_ids for t in word}, c.vocab_size)
    given = [name for name in CONSTRAINTS if getattr(c, name) is not None and getattr(c, name) is not False]
    _need(len(given) <= 1, given[-1] if given else "", f"give at most one constraint; got {' and '.join(given)}")
