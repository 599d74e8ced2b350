"""The public Python API: load a package once, then generate, stream and score text with it.

    model = edgelm.runtime.load("models/distilgpt2")
    print(model.generate("Hello, my name is", max_new_tokens=20).text)

A Model is immutable after load; any number of threads may call it at once (each call keeps its own state).
"""

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from .generation_config import GenerationConfig
from .embeddings import TokenEmbeddings
from .engine import Engine
from .errors import GenerationOptionError, PackageError, PromptError
from .batch import Completion, Batch
from .package import DEFAULT_PACKAGE, Package, open_package
from .sampling import log_softmax
from .session import create_session, graph_io, release_freed_memory


@dataclass
class Score:
    """Per-token log-probabilities of a text under the model, and its perplexity."""

    token_ids: list
    tokens: list  # each token's own text
    logprobs: list  # log p(token | everything before it); the first token is conditioned on end-of-text
    perplexity: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Model:
    """A loaded package: tokenizer, onnxruntime session, and the generation defaults it ships."""

    def __init__(self, package: Package, device: str = "auto", threads: int | None = None):
        self.package, self.arch = package, package.arch
        try:
            self.tokenizer = Tokenizer.from_file(str(package.tokenizer_file))
        except Exception as error:  # tokenizers raises a bare Exception for a damaged file
            raise PackageError(f"cannot read the tokenizer {package.tokenizer_file}: {error}") from None
        session, self.device = create_session(package.model_file, device, threads)
        graph = package.manifest.get("graph", {})
        io = graph_io(session, self.arch.n_layer, bool(graph.get("kv_cache_in_place", False)))
        embeddings = None
        if io.takes_embeddings:
            if "token_embeddings" not in graph:
                raise PackageError(
                    f"{package.model_file} takes inputs_embeds, but {package.folder / 'manifest.json'} does not describe its token_embeddings; export the package again."
                )
            embeddings = TokenEmbeddings.open(
                package.folder, graph["token_embeddings"], self.arch.vocab_size, self.arch.n_embd
            )
        self.engine = Engine(
            session,
            io,
            self.arch.n_head,
            self.arch.head_size,
            self.arch.vocab_size,
            self.device,
            embeddings,
            graph_file=package.model_file,
        )
        self.defaults = GenerationConfig.from_generation_config_json(
            package.generation_defaults, self.arch.eos_token_id, self.arch.pad_token_id
        )
        self.pad_id = self.arch.pad_token_id if self.arch.pad_token_id is not None else (self.arch.eos_token_id or 0)
        release_freed_memory()

    def settings(self, **options) -> GenerationConfig:
        """The settings in effect: package defaults, then these options."""
        return self.defaults.with_options(**options)

    def encode(self, text: str) -> list:
        if not isinstance(text, str):
            hint = "; for one prompt of token ids write [[1, 2, 3]]" if isinstance(text, (int, np.integer)) else ""
            raise PromptError(f"a prompt must be a string or a list of token ids, got {type(text).__name__}{hint}")
        return self.tokenizer.encode(text).ids

    def batch(self, prompts, config: GenerationConfig | None = None, **options) -> Batch:
        """A Batch over several prompts (strings or token-id lists); iterate it for pieces as they come.
        `config` is settings already built by settings(); otherwise the options are applied to the defaults."""
        if config is None:
            config = self.settings(**options)
        elif options:
            raise GenerationOptionError("pass either a GenerationConfig or options, not both")
        ids, truncated = zip(*(self._prepare(p, config) for p in prompts)) if prompts else ((), ())
        if not ids:
            raise PromptError("no prompts were given")
        return Batch(self.engine, self.tokenizer, list(ids), config, self.pad_id, list(truncated))

    def generate(self, prompt, **options):
        """Complete one prompt (returns a Completion, or a list when num_return_sequences > 1) or a list of prompts (a list)."""
        generation = self.batch([prompt] if isinstance(prompt, str) else list(prompt), **options)
        completions = generation.run()
        single = isinstance(prompt, str) and generation.config.num_return_sequences == 1
        return completions[0] if single else completions

    def stream(self, prompt: str, **options) -> "Stream":
        """Iterate the returned Stream for text pieces as they become final; its `completion` is set at the end."""
        generation = self.batch([prompt], **options)
        if generation.config.num_return_sequences != 1:
            raise GenerationOptionError("stream() yields one sequence; use batch() to stream several rows at once")
        return Stream(generation)

    def score(self, text: str) -> Score:
        """Log-probability of every token of `text` (conditioned on end-of-text first) and the perplexity."""
        ids = self.encode(text)
        if not ids:
            raise PromptError("score() needs a non-empty text")
        start = [self.arch.bos_token_id] if self.arch.bos_token_id is not None else []
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
        logprobs = log_softmax(logits[0, :-1])[np.arange(len(full) - 1), full[1:]].astype(float)
        if not start:  # the first token has nothing to be conditioned on
            logprobs = np.concatenate([[np.nan], logprobs])
        scored = logprobs[~np.isnan(logprobs)]
        return Score(
            ids,
            [self.tokenizer.decode([i]) for i in ids],
            logprobs.tolist(),
            float(np.exp(-scored.mean())) if len(scored) else float("nan"),
        )

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
        bad = [i for i in ids if not isinstance(i, (int, np.integer)) or not 0 <= i < self.arch.vocab_size]
        if bad:
            raise PromptError(f"token id {bad[0]!r} is outside the vocabulary (0..{self.arch.vocab_size - 1})")


class Stream:
    """Text pieces of one completion as they become final. Breaking out of the loop stops generation."""

    def __init__(self, generation: Batch):
        self.generation = generation
        self.completion: Completion | None = None

    def __iter__(self):
        try:
            for piece in self.generation:
                yield piece.text
        finally:
            self.generation.close()
        if self.generation.completions:
            self.completion = self.generation.completions[0]

    def close(self) -> None:
        self.generation.close()


def load(path=None, device: str = "auto", threads: int | None = None, verify: bool = True) -> Model:
    """Open a package folder (default models/distilgpt2), check its files, and start a session on `device`."""
    return Model(open_package(path if path is not None else DEFAULT_PACKAGE, verify=verify), device, threads)


def pipeline(task: str = "text-generation", model=None, device: str = "auto", **load_options):
    """The tutorial's call: pipeline("text-generation", model=path)(prompt, max_new_tokens=30) -> [{"generated_text": ...}]."""
    if task != "text-generation":
        raise GenerationOptionError(f"edgelm's pipeline does only 'text-generation', not {task!r}")
    loaded = model if isinstance(model, Model) else load(model, device=device, **load_options)

    def run(prompt, return_full_text: bool = True, **options):
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        results = []
        for text in prompts:
            completions = loaded.generate([text], **options)
            results.append([{"generated_text": (text if return_full_text else "") + c.text} for c in completions])
        return results[0] if isinstance(prompt, str) else results

    return run
