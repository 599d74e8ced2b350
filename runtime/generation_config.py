"""Generation settings: one dataclass, transformers' names and meanings, checked once up front.

Precedence: GenerationConfig defaults < the package's generation_config.json < the caller's arguments.
"""

import math
from dataclasses import dataclass, field, fields, replace

from .errors import GenerationOptionError


@dataclass(frozen=True)
class GenerationConfig:
    """Every knob of one generation request. Each sampler's no-op value is its default here."""

    max_new_tokens: int = 50  # stop after this many new tokens ("length")
    min_new_tokens: int = 0  # end-of-text is banned until this many tokens exist
    do_sample: bool = False  # False: greedy (argmax); True: sample from the filtered distribution
    temperature: float = 1.0  # divides logits; 1.0 is a no-op; only used when sampling
    top_k: int = 50  # keep the k most likely tokens; 0 is a no-op (transformers' default is 50)
    top_p: float = 1.0  # nucleus: smallest set with cumulative probability >= top_p; 1.0 is a no-op
    min_p: float = 0.0  # drop tokens below min_p * p(most likely); 0.0 is a no-op
    typical_p: float = 1.0  # locally typical sampling mass; 1.0 is a no-op
    repetition_penalty: float = 1.0  # CTRL-style penalty on every token seen (prompt too); 1.0 is a no-op
    no_repeat_ngram_size: int = 0  # ban tokens that would repeat an n-gram already present; 0 is a no-op
    frequency_penalty: float = 0.0  # OpenAI: subtract penalty * count of the token among generated tokens
    presence_penalty: float = 0.0  # OpenAI: subtract penalty once if the token was generated at all
    logit_bias: dict = field(default_factory=dict)  # {token_id: bias added to its logit}
    bad_words_ids: tuple = ()  # token-id sequences that must never be generated (banned tokens are 1-long)
    ignore_eos: bool = False  # keep going past end-of-text
    stop: tuple = ()  # strings that end generation; not included in the output
    num_return_sequences: int = 1  # completions per prompt
    seed: int | None = None  # same seed, prompt and options -> same tokens
    logprobs: int | None = None  # None: off; N >= 0: the chosen token's log-prob and the top-N alternatives
    truncate: bool = (
        False  # prompt + max_new_tokens over the context: False raises, True drops the oldest prompt tokens
    )
    eos_token_id: int | None = None  # from the package; None means never stop on a token
    pad_token_id: int | None = None

    def with_options(self, **options) -> "GenerationConfig":
        """A copy with the caller's options applied; unknown names and bad values raise."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise GenerationOptionError(
                f"unknown generation option(s): {', '.join(unknown)}. Known: {', '.join(sorted(known))}."
            )
        options = {
            k: v
            for k, v in options.items()
            if v is not None or k in ("seed", "logprobs", "eos_token_id", "pad_token_id")
        }
        if isinstance(options.get("stop"), str):
            options["stop"] = (options["stop"],)
        for key in ("stop", "bad_words_ids"):
            if key in options:
                options[key] = tuple(tuple(x) if isinstance(x, list) else x for x in options[key])
        if "logit_bias" in options:
            options["logit_bias"] = {int(k): float(v) for k, v in dict(options["logit_bias"]).items()}
        return replace(self, **options).validated()

    def validated(self) -> "GenerationConfig":
        """Raise GenerationOptionError naming the first option out of range."""

        def need(ok: bool, message: str):
            if not ok:
                raise GenerationOptionError(message)

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        need(
            is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
            f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}",
        )
        need(
            is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= self.max_new_tokens,
            f"min_new_tokens must be an integer between 0 and max_new_tokens ({self.max_new_tokens}), got {self.min_new_tokens!r}",
        )
        need(isinstance(self.do_sample, bool), f"do_sample must be true or false, got {self.do_sample!r}")
        need(
            is_num(self.temperature) and self.temperature >= 0,
            f"temperature must be a number >= 0, got {self.temperature!r}",
        )
        need(
            is_int(self.top_k) and self.top_k >= 0,
            f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k!r}",
        )
        need(is_num(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        need(is_num(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        need(is_num(self.typical_p) and 0 < self.typical_p <= 1, f"typical_p must be in (0, 1], got {self.typical_p!r}")
        need(
            is_num(self.repetition_penalty) and self.repetition_penalty > 0,
            f"repetition_penalty must be a number > 0 (1.0 turns it off), got {self.repetition_penalty!r}",
        )
        need(
            is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0,
            f"no_repeat_ngram_size must be an integer >= 0, got {self.no_repeat_ngram_size!r}",
        )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            need(is_num(value) and -2 <= value <= 2, f"{name} must be a number in [-2, 2], got {value!r}")
        need(all(is_num(v) for v in self.logit_bias.values()), "logit_bias values must be finite numbers")
        need(
            all(len(w) > 0 and all(is_int(t) and t >= 0 for t in w) for w in self.bad_words_ids),
            "bad_words_ids must be non-empty lists of token ids",
        )
        need(
            all(isinstance(s, str) and s for s in self.stop),
            f"stop must be a list of non-empty strings, got {self.stop!r}",
        )
        need(
            is_int(self.num_return_sequences) and self.num_return_sequences >= 1,
            f"num_return_sequences must be an integer >= 1, got {self.num_return_sequences!r}",
        )
        need(
            self.seed is None or (is_int(self.seed) and self.seed >= 0),
            f"seed must be an integer >= 0, got {self.seed!r}",
        )
        need(
            self.logprobs is None or (is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            f"logprobs must be an integer from 0 to 20, got {self.logprobs!r}",
        )
        need(isinstance(self.truncate, bool), f"truncate must be true or false, got {self.truncate!r}")
        need(isinstance(self.ignore_eos, bool), f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        need(
            not (self.do_sample and self.temperature == 0),
            "temperature 0 means greedy: set do_sample=False instead (or a temperature > 0)",
        )
        return self

    @classmethod
    def from_generation_config_json(cls, data: dict, eos_token_id=None, pad_token_id=None) -> "GenerationConfig":
        """The package's generation_config.json (transformers' format); fields we do not know are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        if "max_new_tokens" not in values and isinstance(data.get("max_length"), int):
            values["max_new_tokens"] = max(1, data["max_length"])  # GPT-2 configs give max_length only
        eos = values.pop("eos_token_id", eos_token_id)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        values["eos_token_id"] = eos
        values["pad_token_id"] = values.pop("pad_token_id", pad_token_id)
        values.pop("num_return_sequences", None)
        return cls(**values).validated()
