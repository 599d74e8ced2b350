"""The decode engine: token ids in, token ids out. It knows nothing about text (nanochat's rule).

One ONNX graph serves both steps: prefill (the prompt's T tokens over an empty cache) and decode (one token
over the cache so far), asking for the last position's logits only. Its inputs and outputs are the graph
contract, written once in docs/package-format.md.

The cache lives in onnxruntime OrtValues and is never converted between steps. With an edgelm package on
CPU it is one preallocated [B, KV, T + max_new_tokens, D] buffer (KV: key/value heads) per tensor that the graph
writes in place, the prompt included (at batch 1 in chunks of PREFILL_CHUNK tokens, broken at a known conversation
start: InPlaceDecoder, passes.py); otherwise each step's present [B, KV, S + 1, D] becomes the next past
(GrowingDecoder). With a PrefixCache, a batch-1 prompt that starts with passes a recent prompt had gets their rows
copied in instead of computed (runtime/batching/prefix_cache.py).

The token each row takes next is not chosen here: decode_steps asks the caller's pick (runtime/batching/step.py),
which owns the sampler, the constraints and when a row ends.
"""

from typing import Iterator

import numpy as np
import onnxruntime as ort

from ..package.format import ATTENTION_MASK, INPUT_IDS, INPUTS_EMBEDS, LOGITS, LOGITS_TO_KEEP, POSITION_IDS
from . import fast_path as ort_fast_path
from .passes import Starts, prefill_passes
from .session import GraphIO
from .steps import position_ids_from_mask, prefill_inputs  # noqa: F401 (position_ids_from_mask: its users import it here)

# Prompt tokens per pass when the cache is written in place. Activations (and onnxruntime's arena) scale with
# the chunk: after a 512-token int8 prompt, peak RSS is 235 MB in chunks of 128, 262 MB in one pass, for a
# first token 2-10% later (benchmarks/prefill_chunks.py). int8 graphs quantize activations per pass, so their
# logits depend on the chunking: slightly closer to fp32 in chunks (KL 0.00035 against 0.00040).
PREFILL_CHUNK = 128


class Engine:
    """Runs the decoder graph one forward pass at a time."""

    def __init__(
        self,
        session: ort.InferenceSession,
        io: GraphIO,
        kv_heads: int,
        head_size: int,
        vocab_size: int,
        device: str,
        embeddings=None,
        graph_file=None,
        prefix_cache=None,
        workers_spin: bool = False,
    ):
        self.session, self.io, self.device, self.vocab_size = session, io, device, vocab_size
        # onnxruntime's workers spin on the other cores for a while after each run (create_session(spinning=True)):
        # the sampler's second thread would find its core taken (sampling/draw.py)
        self.workers_spin = workers_spin
        self.prefix_cache = prefix_cache  # a PrefixCache for batch-1 prompts on the in-place cache, or None
        self.starts = Starts()  # the conversation starts a batch-1 prefill breaks its passes at (passes.py)
        self.embeddings = (
            embeddings  # ids -> float32 rows, for graphs that take inputs_embeds (runtime/engine/embeddings.py)
        )
        self.token_input_name = INPUTS_EMBEDS if io.takes_embeddings else INPUT_IDS
        # OrtValues in, OrtValues out, through onnxruntime's private fast path where it has one (fast_path.py)
        self.runner = ort_fast_path.runner(session, str(graph_file) if graph_file is not None else "the graph")
        self.kv_heads, self.head_size = kv_heads, head_size  # the cache is [B, kv_heads, positions, head_size]
        self._present_names = [n for pair in zip(io.present_keys, io.present_values) for n in pair]
        self._past_names = [n for pair in zip(io.past_keys, io.past_values) for n in pair]
        self._output_names = [LOGITS, *self._present_names]
        # fed with every pass: an older package's sampling temperature at zero rows, so its graph makes no sampling
        # outputs (on CUDA the graph's default, one row, stays: its kernels are not run on empty tensors there)
        self.idle_inputs = io.idle_inputs(self.runner) if device == "cpu" else {}

    @property
    def cache_tensors(self) -> int:
        """The key/value cache's tensors: a key and a value per layer, in the decoder's order."""
        return len(self._past_names)

    def block_like(self, tokens: int) -> list:
        """What the rows of `tokens` prompt tokens look like in a cache of rows (prefix_store.py reads them against it):
        one [KV, tokens, D] per cache tensor, in the cache's dtype; broadcast scalars, which allocate nothing."""
        shape = (self.kv_heads, tokens, self.head_size)
        return [np.broadcast_to(np.zeros((), self.io.cache_dtype), shape) for _ in range(self.cache_tensors)]

    def empty_past(self, batch: int) -> list:
        empty = np.zeros((batch, self.kv_heads, 0, self.head_size), dtype=self.io.cache_dtype)  # nothing to borrow
        return [self.runner.value(empty, self.device) for _ in self._past_names]

    def forward(self, input_ids, attention_mask, position_ids, past: list, logits_to_keep: int = 1):
        """One pass. Returns logits [B, K, V] as NumPy (K = logits_to_keep, 0 = all) and the present cache."""
        arrays = {ATTENTION_MASK: attention_mask}
        if self.io.has_position_ids:
            arrays[POSITION_IDS] = position_ids
        if self.io.has_logits_to_keep:
            # An overridable initializer (default 0, every position), fed like an input.
            arrays[LOGITS_TO_KEEP] = np.array(logits_to_keep)
        # The OrtValues borrow the NumPy buffers: `arrays` keeps them alive until the run is over.
        arrays = {self.token_input_name: self.token_input(input_ids)} | {
            name: np.ascontiguousarray(a, dtype=np.int64) for name, a in arrays.items()
        }
        feeds = dict(zip(self._past_names, past))
        feeds.update({name: self.runner.value(a) for name, a in arrays.items()})
        feeds.update(self.idle_inputs)
        outputs = self.runner.run(feeds, self._output_names)
        logits = outputs[0].numpy()
        if not self.io.has_logits_to_keep and logits_to_keep:
            logits = logits[:, -logits_to_keep:]  # graphs without the input compute every position
        return logits, outputs[1:]

    def token_input(self, input_ids, out: np.ndarray | None = None) -> np.ndarray:
        """What the graph's first input takes: the ids as int64, or their embeddings when it takes inputs_embeds;
        written into `out` (an array of that shape and dtype) when given."""
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        if self.io.takes_embeddings:
            return self.embeddings(ids, out)
        if out is None:
            return ids
        np.copyto(out, ids)
        return out

    @property
    def writes_cache_in_place(self) -> bool:
        """Whether decoders keep the cache in preallocated buffers the graph writes (InPlaceDecoder)."""
        return self.io.kv_cache_in_place and self.io.has_logits_to_keep and self.device == "cpu"

    def decoder(self, batch: int, capacity: int, buffers: list | None = None):
        """A decoder for `batch` rows of up to `capacity` positions: it owns their key/value cache (written in
        place when the graph and the device allow it) and runs the graph against it. Its
        run(input_ids, attention_mask, position_ids) takes the prompt, then each step, and returns the last
        position's logits [B, 1, V]. `buffers` (in-place only): the cache arrays to use, one
        [batch, H, capacity, D] per cache tensor, owned by the caller (a running batch's slots, slot_cache.py);
        the prefix cache serves batch-1 decoders that own their buffers."""
        if self.writes_cache_in_place:
            prefix_cache = self.prefix_cache if batch == 1 and buffers is None else None
            return InPlaceDecoder(self, batch, capacity, prefix_cache, buffers)
        return GrowingDecoder(self, batch)


class GrowingDecoder:
    """The plain contract: each pass's present (past + T rows) is the next pass's past."""

    def __init__(self, engine: Engine, batch: int):
        self.engine, self.past = engine, engine.empty_past(batch)

    def run(self, input_ids, attention_mask, position_ids) -> np.ndarray:
        logits, self.past = self.engine.forward(input_ids, attention_mask, position_ids, self.past)
        return logits


class InPlaceDecoder:
    """One [B, KV, capacity, D] buffer per cache tensor, fed as past and fetched as present: GroupQueryAttention
    writes each pass's new rows in place, so neither the prompt nor any step copies the cache. The logits come
    back in one preallocated [B, 1, V] array, valid until the next run. With a prefix cache (batch 1), the prompt
    is prefilled in that cache's passes, starting after the rows it restores, and the passes it keeps are stored."""

    def __init__(
        self,
        engine: Engine,
        batch: int,
        capacity: int,
        prefix_cache=None,
        buffers: list | None = None,
    ):
        self.engine, runner = engine, engine.runner
        self.prefix_cache = prefix_cache
        shape = (batch, engine.kv_heads, capacity, engine.head_size)
        if buffers is None:
            buffers = [np.zeros(shape, dtype=engine.io.cache_dtype) for _ in engine._past_names]
        self.buffers = buffers  # C-contiguous (the OrtValues borrow them); views of the first rows of a bigger array do
        self.logits = np.zeros((batch, 1, engine.vocab_size), dtype=np.float32)
        self.cache = [runner.value(b) for b in self.buffers]  # they borrow the buffers
        self.id_inputs = 3 if engine.io.has_position_ids else 2  # the tokens, attention_mask[, position_ids]
        names = [
            *(engine.token_input_name, ATTENTION_MASK, POSITION_IDS)[: self.id_inputs],
            LOGITS_TO_KEEP,
            *engine._past_names,
            *engine.idle_inputs,
        ]
        outputs = dict(zip(engine._output_names, [self.logits, *self.buffers]))
        self.keep_last_array = np.array(1, dtype=np.int64)
        self.keep_last = runner.value(self.keep_last_array)  # borrows it: the array lives as long as the decoder
        self.run_bound = runner.bind(names, outputs)  # each pass writes the logits and new cache rows in place
        self.idle = list(engine.idle_inputs.values())
        # A decode step's tokens and positions [B, 1] are written into these arrays, whose OrtValues are made once;
        # only the attention mask, one column wider each step, is a new OrtValue (step_feeds[1]).
        self.step_tokens = engine.token_input(np.zeros((batch, 1), dtype=np.int64))
        self.step_positions = np.zeros((batch, 1), dtype=np.int64)
        step_ids = [runner.value(self.step_tokens), None, runner.value(self.step_positions)][: self.id_inputs]
        self.step_feeds = [*step_ids, self.keep_last, *self.cache, *self.idle]
        self.names, self.outputs = names, outputs  # what a run of several kept positions binds (verify_pass.py)

    def run(self, input_ids, attention_mask, position_ids, start: int | None = None) -> np.ndarray:
        """start: the conversation start a fresh prompt's passes break at, where the caller has looked it up
        already (else the engine's known starts are asked here)."""
        width, new = attention_mask.shape[1], input_ids.shape[1]
        if new == 1 and len(input_ids) == len(self.step_positions):  # a decode step: one pass, no prefix cache
            self._step(input_ids, attention_mask, position_ids)
            return self.logits
        # GroupQueryAttention takes several new tokens over an existing cache for one row only.
        fresh = self._fresh(input_ids, attention_mask, position_ids)
        cached = fresh and self.prefix_cache is not None
        if not fresh:
            start = 0
        elif start is None:
            start = self.engine.starts.longest(input_ids[0])
        chunk = self.prefix_cache.chunk if cached else PREFILL_CHUNK if len(input_ids) == 1 else new
        first = self.prefix_cache.restore(input_ids[0], start, self.buffers) if cached else 0
        for begin, end in prefill_passes(new, chunk, start):  # the passes a cold prefill makes, those restored left out
            if begin >= first:
                self._pass(input_ids[:, begin:end], attention_mask[:, : width - new + end], position_ids[:, begin:end])
        if cached:
            self.prefix_cache.store(input_ids[0], start, self.buffers)
        return self.logits

    def _fresh(self, input_ids, attention_mask, position_ids) -> bool:
        """A prompt over an empty cache, one row, unpadded at positions 0..T-1: the only prefill whose passes break at
        a conversation start and whose rows a prefix cache knows (a decode step, a padded row, a batch go without)."""
        new = input_ids.shape[1]
        return (
            len(input_ids) == 1
            and new > 1
            and attention_mask.shape[1] == new
            and bool(np.all(attention_mask == 1))
            and np.array_equal(position_ids[0], np.arange(new))
        )

    def _step(self, input_ids, attention_mask, position_ids):
        self.engine.token_input(input_ids, out=self.step_tokens)
        if self.id_inputs == 3:
            np.copyto(self.step_positions, position_ids)
        # the mask is borrowed by its OrtValue: kept as long as that is
        self.step_mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        self.step_feeds[1] = self.engine.runner.value(self.step_mask)
        self.run_bound(self.step_feeds)

    def _pass(self, input_ids, attention_mask, position_ids):
        # The arrays must outlive the run: the OrtValues below only borrow them.
        arrays = [
            self.engine.token_input(input_ids),
            *(np.ascontiguousarray(a, dtype=np.int64) for a in (attention_mask, position_ids)[: self.id_inputs - 1]),
        ]
        self.run_bound([*(self.engine.runner.value(a) for a in arrays), self.keep_last, *self.cache, *self.idle])


def left_pad(prompts: list, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of different lengths -> input_ids and attention_mask [B, T], padding on the left."""
    return prefill_inputs(prompts, pad_id)[:2]


def decode_steps(engine: Engine, prompts: list, pick, pad_id: int, max_new_tokens: int) -> Iterator[np.ndarray]:
    """Yield each new position's tokens [B] int64 until `pick` has finished every row.

    pick(logits [B, V]) -> (tokens [B] int64, rows still running): each row's next id, chosen by the caller from the
    last position's logits (valid until the next step), -1 for a row it finished before this step. The sampler, the
    constraints, the stop ids and the lengths are the pick's (runtime/batching/step.py); a finished row is fed
    padding that nobody reads. max_new_tokens: the positions each row may add after its prompt.
    """
    batch = len(prompts)
    input_ids, attention_mask, position_ids = prefill_inputs(prompts, pad_id)
    width, capacity = input_ids.shape[1], input_ids.shape[1] + max_new_tokens
    mask = np.ones((batch, capacity), dtype=np.int64)  # every step's attention mask: its first `width` columns
    mask[:, :width] = attention_mask

    # Prefill: the whole prompt into the cache; only the last position's logits are computed.
    decoder = engine.decoder(batch, capacity)
    logits = decoder.run(input_ids, attention_mask, position_ids)[:, -1, :]  # [B, V]
    while True:
        tokens, running = pick(logits)
        yield tokens
        if not running:
            return
        # Decode: one token per row against the cache; finished rows feed padding that nobody reads.
        width, position_ids = width + 1, position_ids[:, -1:] + 1
        next_ids = np.where(tokens < 0, pad_id, tokens)[:, None]
        logits = decoder.run(next_ids, mask[:, :width], position_ids)[:, -1, :]
