"""Generation on a loaded model: its settings checked once, prompts checked against the vocabulary and the context,
then a Batch of rows (runtime/batching/batch.py) run to the end, streamed, or iterated by the caller.

Model (runtime/model/__init__.py) takes these methods from Generation; they read its engine, tokenizer,
defaults and architecture, and keep no state of their own.
"""

from dataclasses import replace

import numpy as np

from ..batching.batch import MAX_BATCH_TOKENS, Batch, Stream
from ..errors import GenerationOptionError, PromptError
from ..generation_config import GenerationConfig, without_constraint
from ..inputs import check_text, check_token_ids
from ..sampling.constraint import check as check_constraint
from ..text import tokenizer as tokenizing


class Generation:
    """generate(), stream() and batch() over prompts of text or token ids, and the checks they share."""

    max_batch_tokens = MAX_BATCH_TOKENS  # rows x positions one call may decode; raise it on an instance to allow more

    def settings(self, config: GenerationConfig | None = None, /, **options) -> GenerationConfig:
        """The settings in effect: `config` (default: the package's defaults), then these options, validated once
        (token ids against this model's vocabulary included, and a constraint read by llguidance). Pass the result
        as config= to generate, stream or batch. `ban` (words never to generate) adds the token sequences that
        write them to bad_words_ids."""
        banned = options.pop("ban", None)
        if banned is not None:  # with bad_words_ids given too: both
            banned, given = tokenizing.banned_ids(self.tokenizer, banned), options.get("bad_words_ids")
            options["bad_words_ids"] = (*given, *banned) if isinstance(given, (list, tuple)) else given or banned
        config = (config if config is not None else self.defaults).with_options(**options)
        check_constraint(config)
        return config

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        """Token ids of `text`; add_special_tokens applies the tokenizer's own additions (Llama's start token)."""
        if not isinstance(text, str):
            hint = "; for one prompt of token ids write [[1, 2, 3]]" if isinstance(text, (int, np.integer)) else ""
            raise PromptError(f"a prompt must be a string or a list of token ids, got {type(text).__name__}{hint}")
        check_text(text)
        return tokenizing.encode(self.tokenizer, text, add_special_tokens=add_special_tokens).ids

    def batch(self, prompts, config=None, **options) -> Batch:
        """A Batch over several prompts (strings or token-id lists); iterate it for pieces as they come.
        `config` is settings already built by settings(), or a list of them, one per prompt, that differ in their
        constraint only (json_schema, regex, ...: each prompt's rows get their own); otherwise the options are
        applied to the defaults."""
        configs = None
        if isinstance(config, (list, tuple)):
            configs = self._row_configs(config, options, prompts)
            config = configs[0]
        config = self._config(config, options)
        if not isinstance(prompts, (list, tuple)):
            raise PromptError(
                f"batch() takes a list of prompts (strings or token-id lists), got {type(prompts).__name__}"
            )
        if not prompts:
            raise PromptError("no prompts were given")
        self._check_batch_size(len(prompts), 1, config)  # every prompt is at least one token: before tokenizing
        ids, truncated = zip(*(self._prepare(p, config) for p in prompts))
        self._check_batch_size(len(ids), max(len(i) for i in ids), config)
        grammars = [self.compile_constraint(c) for c in configs] if configs else [self.compile_constraint(config)]
        grammars = grammars * len(ids) if len(grammars) == 1 else grammars
        config = without_constraint(config) if configs else config  # each prompt's is in its grammar
        if config.speculative == "draft" and self.draft is None:
            raise GenerationOptionError(
                "speculative='draft' needs a draft model: load the package with draft=NAME_OR_PATH "
                "(--draft-model), or use speculative='ngram'",
                param="speculative",
            )
        return Batch(
            self.engine, self.tokenizer, list(ids), config, self.pad_id, list(truncated), list(grammars), self.draft
        )

    def compile_constraint(self, config: GenerationConfig):
        """The constraint of `config` compiled for this model's tokenizer (a sampling.constraint.Grammar, cached), or
        None without one; GenerationOptionError where it cannot be compiled or cannot finish within max_new_tokens."""
        if config.constraint is None:
            return None
        return self._compiler().compile(*config.constraint, max_new_tokens=config.max_new_tokens)

    def prepare_constraints(self) -> None:
        """Build now what every constraint needs, once for the process's life (llguidance's table of this model's
        tokenizer), which the first constraint would build otherwise; GenerationOptionError where llguidance is not
        installed or cannot read the tokenizer. A server calls it as it starts; a model never constrained never
        builds it."""
        self._compiler().tokenizer()

    def _compiler(self):
        if self._constraints is None:
            from ..sampling.constraint import Compiler

            text, arch, eos = self.package.tokenizer_text(), self.arch, self.defaults.stop_ids
            self._constraints = Compiler(text, arch.vocab_size, eos, arch.n_positions, self.tokenizer)
        return self._constraints

    def _row_configs(self, configs, options: dict, prompts) -> list:
        """One settings object per prompt (from settings()), alike but for their constraint."""
        configs = [self._config(c, options) for c in configs]
        if not isinstance(prompts, (list, tuple)) or len(configs) != len(prompts):
            raise GenerationOptionError("config= as a list needs one settings object per prompt", param="config")
        if any(without_constraint(c) != without_constraint(configs[0]) for c in configs):
            raise GenerationOptionError(
                "the settings of one batch may differ in their constraint only (json_schema, json_object, regex, "
                "grammar, choices); run prompts with other settings in another batch",
                param="config",
            )
        return configs

    def generate(self, prompt, config: GenerationConfig | None = None, **options):
        """Complete one prompt (returns a Completion, or a list when num_return_sequences > 1) or a list of prompts (a list).
        A row that fails (its constraint, its text) ends alone: the one Completion raises its error; in a list, its
        Completion has finish_reason "error" and the error, and the other rows are as they would be without it."""
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, (list, tuple)):
            prompts = list(prompt)
        else:
            raise PromptError(
                f"a prompt must be a string, or a list of strings or token-id lists, got {type(prompt).__name__}"
            )
        batch = self.batch(prompts, config, **options)
        completions = batch.run()
        single = isinstance(prompt, str) and batch.config.num_return_sequences == 1
        return _one(completions) if single else completions

    def stream(self, prompt, config: GenerationConfig | None = None, **options) -> Stream:
        """Iterate the returned Stream for text pieces as they become final; its `completion` is set at the end."""
        config = self._config(config, options)
        if config.num_return_sequences != 1:
            raise GenerationOptionError(
                "stream() yields one sequence; use batch() to stream several rows at once", param="num_return_sequences"
            )
        return Stream(self.batch([prompt], config))

    def _config(self, config: GenerationConfig | None, options: dict) -> GenerationConfig:
        """The settings for one call: `config` as given (built by settings()), or the options over the defaults."""
        if config is None:
            return self.settings(**options)
        if options:
            raise GenerationOptionError(
                f"pass either config= or options, not both (got config= and {', '.join(sorted(options))})",
                param=sorted(options)[0],
            )
        if not isinstance(config, GenerationConfig):
            raise GenerationOptionError(
                f"config must be a GenerationConfig from model.settings(...), got {type(config).__name__}",
                param="config",
            )
        if config.vocab_size != self.arch.vocab_size:  # built elsewhere: check its token ids against this vocabulary
            config = replace(config, vocab_size=self.arch.vocab_size)
        return config

    def _check_batch_size(self, n_prompts: int, longest_prompt: int, config: GenerationConfig) -> None:
        """Refuse, before anything is allocated, a call whose rows x positions exceed max_batch_tokens."""
        rows = n_prompts * config.num_return_sequences
        width = longest_prompt + config.max_new_tokens
        if rows * width <= self.max_batch_tokens:
            return
        message = (
            f"this call would decode {rows:,} rows (prompts x num_return_sequences) of {width:,} positions "
            f"(prompt + max_new_tokens): {rows * width:,} in all, over the limit of {self.max_batch_tokens:,}."
        )
        if config.num_return_sequences > 1:
            raise GenerationOptionError(
                message + " Lower num_return_sequences or max_new_tokens, or split the prompts over several calls.",
                param="num_return_sequences",
            )
        raise PromptError(message + " Split the prompts over several calls, or lower max_new_tokens.")

    def _prepare(self, prompt, config: GenerationConfig) -> tuple[list, int]:
        """Token ids for one prompt, checked against the vocabulary and the context length."""
        ids = list(prompt) if isinstance(prompt, (list, tuple)) else self.encode(prompt)
        if not ids:  # GPT-2's unconditional start
            if self.arch.bos_token_id is None:
                raise PromptError("the prompt is empty and this model has no start token; give some text")
            ids = [self.arch.bos_token_id]
        self._check_ids(ids)
        limit = self.arch.n_positions
        room = limit - config.max_new_tokens
        if room < 1:
            raise PromptError(
                f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's {limit}-token context; lower it."
            )
        if len(ids) <= room:
            return ids, 0
        if not config.truncate:
            raise PromptError(
                f"the prompt is {len(ids)} tokens and max_new_tokens is {config.max_new_tokens}: {len(ids) + config.max_new_tokens} > the model's "
                f"{limit}-token context. Shorten the prompt, lower max_new_tokens, or pass truncate=True (--truncate) to drop the oldest prompt tokens."
            )
        return ids[-room:], len(ids) - room

    def _check_ids(self, ids) -> None:
        check_token_ids(ids, self.arch.vocab_size)


def _one(completions: list):
    """The one completion of a one-row call, or the error that ended its row."""
    if completions[0].error is not None:
        raise completions[0].error
    return completions[0]
