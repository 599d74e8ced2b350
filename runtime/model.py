"""The public Python API: load a package once, then generate, stream and score text with it.

    model = edgelm.runtime.load("models/distilgpt2")
    print(model.generate("Hello, my name is", max_new_tokens=20).text)

A Model is immutable after load but for its prefix cache (load(..., prefix_cache_mb=N), runtime/batching/prefix_cache.py),
which guards itself; any number of threads may call it at once (each call keeps its own state).
"""

import os
from dataclasses import dataclass, replace

import numpy as np

from .batching import package_prefix
from .batching.batch import MAX_BATCH_TOKENS, Batch, Stream
from .batching.prefix_cache import PrefixCache, cache_bytes
from .batching.prefix_store import DISK_DEFAULT_MB, disk_store
from .engine import decode as engine_module
from .engine.decode import Engine
from .engine.embeddings import TokenEmbeddings
from .engine.session import check_graph_shapes, create_session, drop_mapped_pages, graph_io, release_freed_memory
from .errors import DeviceError, GenerationOptionError, PackageError, PromptError
from .generation_config import GenerationConfig, without_constraint
from .generation_defaults import generation_defaults
from .inputs import check_text, check_token_ids
from .package.format import GENERATION_CONFIG, MANIFEST
from .package.onnxruntime_compat import check_installed
from .package.open import Package, open_package
from .sampling import log_softmax
from .sampling import top_logprobs as most_likely
from .sampling.constraint import check as check_constraint
from .speculative.draft import check_same_tokenizer
from .store.local import resolve_package
from .text import tokenizer as tokenizing
from .text.chat_template import ChatTemplate
from .text.tokenizer import load_tokenizer


@dataclass
class Score:
    """Per-token log-probabilities of a text under the model, and its perplexity."""

    token_ids: list
    tokens: list  # each token's own text
    logprobs: list  # log p(token | everything before it); the first token is conditioned on end-of-text
    perplexity: float
    top_logprobs: list | None = None  # per token, with top_logprobs=N: [{"token_id", "token", "logprob"}, ...]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Model:
    """A loaded package: tokenizer, onnxruntime session, and the generation defaults it ships."""

    def __init__(
        self, package: Package, device: str = "auto", threads: int | None = None, prefix_cache_mb=0, spinning=True,
        prefix_cache_dir=None, prefix_cache_disk_mb=DISK_DEFAULT_MB,
    ):  # fmt: skip
        self.package, self.arch = package, package.arch
        prefix_cache_bytes = cache_bytes(prefix_cache_mb)  # a bad option fails before anything is read
        disk = disk_store(package, prefix_cache_dir, prefix_cache_disk_mb, prefix_cache_bytes, engine_module.PREFILL_CHUNK)
        self.tokenizer = load_tokenizer(package.tokenizer_text(), package.tokenizer_file)
        # before onnxruntime sees it
        check_installed(package.min_onnxruntime, f"the package {package.folder}", package.uses)
        quantized = package.manifest is not None and package.manifest.weights.dtype != "float32"
        session, self.device = create_session(package.model_file, device, threads, quantized, spinning)
        check_graph_shapes(session, package)
        graph = package.manifest.graph if package.manifest else None
        io = graph_io(session, self.arch.n_layer, bool(graph and graph.kv_cache_in_place))
        embeddings = None
        if io.takes_embeddings:
            if graph is None or graph.token_embeddings is None:
                raise PackageError(
                    f"{package.model_file} takes inputs_embeds, but {package.folder / MANIFEST} does not describe its token_embeddings; export the package again."
                )
            embeddings = TokenEmbeddings.open(package.path(graph.token_embeddings.file), graph.token_embeddings)
        self.engine = Engine(
            session,
            io,
            self.arch.kv_heads,
            self.arch.head_size,
            self.arch.vocab_size,
            self.device,
            embeddings,
            graph_file=package.model_file,
            prefix_cache=PrefixCache(prefix_cache_bytes, engine_module.PREFILL_CHUNK, disk) if prefix_cache_bytes else None,
        )
        package_prefix.seed(self.engine, package)  # the package's prompt cache, where it has one
        defaults_file = package.folder / GENERATION_CONFIG
        self.defaults = generation_defaults(package.generation_defaults, package.arch, defaults_file)
        self.pad_id = self.arch.pad_token_id if self.arch.pad_token_id is not None else (self.arch.eos_token_id or 0)
        self.chat_template = ChatTemplate.from_package(package)  # checked when first used, not here
        self._constraints = None  # the constraint compiler (sampling/constraint.py), made at the first constraint
        self.draft = None  # a Model of the same tokenizer whose guesses speculative="draft" verifies (load(draft=))
        release_freed_memory()
        drop_mapped_pages(package.folder)

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
        if self._constraints is None:
            from .sampling.constraint import Compiler

            self._constraints = Compiler(self.package.tokenizer_text(), self.arch.vocab_size, self.defaults.stop_ids)
        return self._constraints.compile(*config.constraint, max_new_tokens=config.max_new_tokens)

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

    def score(self, text, top_logprobs: int | None = None) -> Score:
        """Log-probability of every token of `text` and the perplexity. A string is conditioned on end-of-text
        first (when the model has a start token); a list of token ids is scored as given, so its first token has
        nothing to be conditioned on (NaN). top_logprobs=N also gives each token the N most likely tokens at its
        position, from the same distribution (None where its log-prob is NaN)."""
        if top_logprobs is not None and (
            not isinstance(top_logprobs, (int, np.integer)) or isinstance(top_logprobs, bool) or top_logprobs < 0
        ):
            raise GenerationOptionError(
                f"top_logprobs must be None or an integer >= 0, got {str(top_logprobs)[:40]}", param="top_logprobs"
            )
        given_ids = isinstance(text, (list, tuple))
        ids = list(text) if given_ids else self.encode(text)
        if not ids:
            raise PromptError("score() needs a non-empty text")
        start = [self.arch.bos_token_id] if self.arch.bos_token_id is not None and not given_ids else []
        full = start + ids
        if len(full) > self.arch.n_positions:
            raise PromptError(
                f"the text is {len(ids)} tokens; scoring covers at most {self.arch.n_positions - len(start)} (the model's context). Score it in parts."
            )
        self._check_ids(full)
        row = np.asarray([full], dtype=np.int64)
        mask = np.ones_like(row)
        logits, _ = self.engine.forward(
            row, mask, np.arange(row.shape[1])[None], self.engine.empty_past(1), logits_to_keep=0
        )
        table = log_softmax(logits[0, :-1])  # [S - 1, V]: position i's distribution over token i + 1
        logprobs = table[np.arange(len(full) - 1), full[1:]].astype(float)
        if not start:  # the first token has nothing to be conditioned on
            logprobs = np.concatenate([[np.nan], logprobs])
        scored = logprobs[~np.isnan(logprobs)]
        tops = None
        if top_logprobs is not None:
            tops = [None] * (len(ids) - len(table)) + [
                [
                    {"token_id": int(i), "token": tokenizing.decode(self.tokenizer, [int(i)]), "logprob": float(v)}
                    for i, v in zip(*most_likely(position, top_logprobs))
                ]
                for position in table
            ]
        return Score(
            ids,
            [tokenizing.decode(self.tokenizer, [i]) for i in ids],
            logprobs.tolist(),
            float(np.exp(-scored.mean())) if len(scored) else float("nan"),
            tops,
        )

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

    def chat_batch(
        self,
        messages,
        config: GenerationConfig | None = None,
        *,
        tools=None,
        tool_choice=None,
        parallel_tool_calls: bool = True,
        **options,
    ) -> Batch:
        """A Batch for the assistant's next message: `messages` rendered by the package's chat template (with
        the assistant's turn opened, and OpenAI function `tools` if given), the template's stop strings added to
        the caller's. `tool_choice` "required" or {"type": "function", "function": {"name": ...}} constrains the
        reply to calls (one unless parallel_tool_calls; text/tool_grammar.py); read them out of it with
        tool_format(model).parse(completion.text)."""
        if tool_choice is not None:
            from .text.tools import tool_format

            forced = tool_format(self).constraint(tools, tool_choice, parallel_tool_calls)
            options = {**options, forced[0]: forced[1]} if forced else options
        prompt, config = self.chat_prompt(messages, self._config(config, options), tools)
        return self.batch([prompt], config)

    def chat_prompt(self, messages, config: GenerationConfig, tools=None) -> tuple[list, GenerationConfig]:
        """(prompt token ids, settings) for the assistant's next message: `messages` (and `tools`) rendered by the
        package's chat template (with the assistant's turn opened), the template's stop strings added to `config`'s
        (settings already holding them are returned as they are)."""
        stop = self.chat_stop(config.stop)
        return self.chat_ids(messages, tools), config.with_options(stop=stop) if stop != config.stop else config

    def chat_ids(self, messages, tools=None) -> list:
        """The prompt token ids of chat_prompt, alone."""
        prompt = self.chat_template.render(messages, add_generation_prompt=True, tools=tools)
        # The template writes the start token itself where the model wants one (Llama 3's {{ bos_token }}), so the
        # tokenizer adds none, as transformers' apply_chat_template(tokenize=True) does.
        return self.encode(prompt, add_special_tokens=False)

    def chat_stop(self, stop: tuple) -> tuple:
        """The stop strings `stop` and those of the chat template it lacks: what ends an assistant's message."""
        return (*stop, *(s for s in self.chat_template.stop if s not in stop))

    def chat(self, messages, config: GenerationConfig | None = None, *, tools=None, **options):
        """The assistant's reply to `messages` ([{"role": "user", "content": "Hi"}, ...]) as a Completion, or a
        list of them when num_return_sequences > 1. `tools`: OpenAI function definitions the template shows;
        `tool_choice` (a chat_batch() option) forces a call of them."""
        batch = self.chat_batch(messages, config, tools=tools, **options)
        completions = batch.run()
        return _one(completions) if batch.config.num_return_sequences == 1 else completions

    def chat_stream(self, messages, config: GenerationConfig | None = None, *, tools=None, **options) -> "Stream":
        """The assistant's reply as a Stream of text pieces, as stream() gives them; `completion` is set at the end.
        Feed the pieces to text.tools.tool_format(model).stream() for content and tool-call deltas."""
        batch = self.chat_batch(messages, config, tools=tools, **options)
        if batch.config.num_return_sequences != 1:
            raise GenerationOptionError("chat_stream() yields one reply; use chat_batch() to stream several rows")
        return Stream(batch)


def _one(completions: list):
    """The one completion of a one-row call, or the error that ended its row."""
    if completions[0].error is not None:
        raise completions[0].error
    return completions[0]


def load(
    path=None,
    device: str = "auto",
    threads: int | None = None,
    verify: bool | str = True,
    prefix_cache_mb=0,
    spinning: bool = True,
    draft=None,
    prefix_cache_dir=None,
    prefix_cache_disk_mb=DISK_DEFAULT_MB,
) -> Model:
    """Open a package, check its files, and start a session on `device`. `path` is a package folder or the name of
    an installed package (edgelm list); None opens the default (store.resolve_package says which).

    verify: True checks each file against its sha256, hashing only the files changed since the last full check
    (package/verified.py); "full" hashes every file again; False skips the checksums.

    prefix_cache_mb: MiB of recent prompts' key/value rows to keep, so that a prompt starting with a recent
    prompt's first 128-token chunks skips computing them (a chat's history, a shared system prompt); outputs
    are identical with and without it. Off (0) by default: one prompt per process gains nothing from it, and it
    holds up to that memory. Used on CPU at batch 1 (runtime/batching/prefix_cache.py).

    draft: a smaller package (folder or installed name) of the same tokenizer, loaded beside this one, whose
    guesses generate() verifies several at a time (speculative "auto" or "draft": runtime/speculative/draft.py);
    a package of another tokenizer is refused.

    prefix_cache_dir: a folder where the prefix cache's blocks are also written, at most prefix_cache_disk_mb MiB,
    so that a later process of the same package (its manifest's sha256) finds them (prefix_store.py); two
    processes may share it. Needs prefix_cache_mb > 0."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise PackageError(
            f"load() takes a package folder (a str or Path) or an installed package's name, got {type(path).__name__}"
        )
    cache_bytes(prefix_cache_mb)  # checked before the package is opened
    if not isinstance(spinning, bool):
        raise DeviceError(f"spinning must be True or False, got {str(spinning)[:40]}")
    if draft is not None and not isinstance(draft, (str, os.PathLike)):
        raise PackageError(f"draft= takes a package folder or an installed package's name, got {type(draft).__name__}")
    package = open_package(resolve_package(path), verify=verify)
    model = Model(package, device, threads, prefix_cache_mb, spinning, prefix_cache_dir, prefix_cache_disk_mb)
    if draft is not None:
        model.draft = Model(open_package(resolve_package(draft), verify=verify), device, threads, 0, spinning)
        check_same_tokenizer(model.package, model.draft.package)
    return model
