"""Every generation option a user can set, declared once: its command-line flag and its HTTP request field.

GenerationConfig (generation_config.py) holds each option's type, default and check (a number's interval in
RANGES, which the help shows); OPTIONS below says how each is offered: the flag's help (in the order
`edgelm generate --help` lists them), whether `edgelm chat` takes it too, and the request field the server reads
it from. The command line (cli/options.py, generation_options) and the request body (server/api/requests.py,
sampling_body) are built from this table, so a new option is its GenerationConfig field and check, and one entry
here; tests/model/test_option_declaration.py fails for a field that is in neither OPTIONS nor NOT_OFFERED.

An option whose request field has endpoint-specific meaning (max_new_tokens is max_tokens, max_completion_tokens
or max_output_tokens; temperature 0 means greedy; n is bounded by the server; logit_bias takes OpenAI's string
keys and range; logprobs differs per endpoint) is read by the endpoint itself: its `http` is None.
"""

from dataclasses import dataclass, fields

from .generation_config import RANGES, SPECULATIVE, GenerationConfig

OPENAI, EXTRA = "openai", "extra"  # an OpenAI request field; a field of edgelm's own (docs/serve.md)
NOT_SET = object()


@dataclass(frozen=True)
class Option:
    """How one generation option is offered to a user."""

    name: str  # GenerationConfig's field, or a request option the model resolves (ban)
    help: str | None = None  # the command-line flag's help; None: no flag
    flags: tuple = ()  # the flag's names; () is "--" + the name with dashes
    form: str = "value"  # "value": one value; "switch": a --yes/--no pair (in flags); "flag": on when given;
    # "repeated": a text each time the flag is given, a list of texts in a request (one string is a list of one)
    metavar: str | None = None
    value_type: type | None = None  # None: the GenerationConfig field's type
    chat: bool = False  # `edgelm chat` takes the flag too
    http: str | None = None  # OPENAI or EXTRA: a request field under the option's name; None: none as is
    alias: str | None = None  # another request field for it (give one of the two)
    server_default: object = NOT_SET  # the server's value when a request leaves it out, over the package's
    choices: tuple = ()  # the values a flag takes, when they are a fixed few

    @property
    def field_type(self) -> type:
        """int, float, bool or str: the type of one value (of each text, for a repeated option)."""
        if self.value_type is not None:
            return self.value_type
        if self.form == "repeated":
            return str
        declared = {f.name: f.type for f in fields(GenerationConfig)}[self.name]
        args = [a for a in getattr(declared, "__args__", (declared,)) if a is not type(None)]
        return args[0]


OPTIONS = (
    Option("max_new_tokens", "Stop after this many new tokens.", chat=True),
    Option("min_new_tokens", "Do not end before this many new tokens.", chat=True, http=EXTRA, alias="min_tokens"),
    Option(
        "do_sample",
        "Sample, or pick the most likely token. Sampling options below turn sampling on unless --greedy is given.",
        flags=("--do-sample/--greedy",),
        form="switch",
        chat=True,
    ),
    Option("temperature", "Divide logits by this: below 1 sharpens, above 1 flattens (sampling).", chat=True),
    Option(
        "top_k",
        "Keep the k most likely tokens; 0 turns it off (transformers' default 50).",
        chat=True,
        http=EXTRA,
        server_default=0,  # OpenAI has no top-k: a client expects plain temperature/top_p sampling
    ),
    Option("top_p", f"Nucleus sampling mass in {RANGES['top_p']}.", chat=True, http=OPENAI, server_default=1.0),
    Option("min_p", "Drop tokens below min-p x p(most likely).", chat=True, http=EXTRA),
    Option("typical_p", f"Locally typical sampling mass in {RANGES['typical_p']}.", chat=True, http=EXTRA),
    Option("repetition_penalty", "Penalise every token already seen (1.0 = off).", chat=True, http=EXTRA),
    Option("no_repeat_ngram_size", "Never repeat an n-gram of this size.", chat=True, http=EXTRA),
    Option(
        "frequency_penalty",
        f"OpenAI-style, per occurrence in the output, in {RANGES['frequency_penalty']}.",
        chat=True,
        http=OPENAI,
        server_default=0.0,
    ),
    Option(
        "presence_penalty",
        f"OpenAI-style, once per token present in the output, in {RANGES['presence_penalty']}.",
        chat=True,
        http=OPENAI,
        server_default=0.0,
    ),
    Option("logit_bias", "Add BIAS to token ID's logit (repeatable).", form="repeated", metavar="ID=BIAS"),
    Option(
        "ban",
        "Never generate this word or token sequence (repeatable).",
        form="repeated",
        metavar="TEXT",
        http=EXTRA,
    ),
    Option(
        "stop", "End when this text appears; it is not printed (repeatable).", form="repeated", chat=True, http=OPENAI
    ),
    Option("ignore_eos", "Keep going past end-of-text.", form="flag", http=EXTRA),
    Option(
        "num_return_sequences",
        "Completions for the prompt; above 1 needs sampling (--do-sample).",
        flags=("-n", "--num-return-sequences"),
    ),
    Option("seed", "Same seed, prompt and options give the same text.", chat=True, http=OPENAI),
    Option("logprobs", "Include the chosen and top-N tokens' log-probs (with --json)."),
    Option(
        "truncate",
        "Drop the oldest prompt tokens when prompt + max-new-tokens exceeds the context.",
        form="flag",
        http=EXTRA,
    ),
    Option(
        "speculative",
        "Several tokens per pass, the same output: auto feeds a constraint's forced tokens in one pass, ngram adds "
        "prompt lookup (quoting, extracting, rewriting the prompt), draft adds a draft model's guesses (--draft-model), "
        "off decodes one token per pass. Statistics in --json.",
        chat=True,
        choices=SPECULATIVE,
        # the server's unless `edgelm serve --speculative` says otherwise (server/limits.py): requests do not set it
        server_default="off",
    ),
    # n > 1 at temperature 0 gives n greedy copies, as OpenAI's n does
    Option("greedy_copies", server_default=True),
)

# GenerationConfig's fields no user sets as an option of their own: the package's facts, and the constraints, which
# the command line offers as constraint_options (cli/options.py) and the server reads from response_format and tools.
NOT_OFFERED = ("eos_token_id", "pad_token_id", "vocab_size", "bad_words_ids")
NOT_OFFERED += ("json_schema", "json_object", "regex", "grammar", "choices")


def server_defaults(options=OPTIONS) -> dict:
    """The values the server gives the options a request leaves out (OpenAI's defaults over the package's)."""
    return {o.name: o.server_default for o in options if o.server_default is not NOT_SET}


def request_fields(options=OPTIONS) -> tuple:
    """The options a request body carries under their own name (or their alias)."""
    return tuple(o for o in options if o.http is not None)
