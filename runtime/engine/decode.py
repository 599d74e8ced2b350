"""The decode engine: token ids in, token ids out. It knows nothing about text (nanochat's rule).

One ONNX graph serves both steps: prefill (the prompt's T tokens over an empty cache) and decode (one token
over the cache so far), asking for the last position's logits only. Its inputs and outputs are the graph
contract, written once in docs/package-format.md.

The cache lives in onnxruntime OrtValues and is never converted between steps. With an edgelm package on
CPU it is one preallocated [B, KV, T + max_new_tokens, D] buffer (KV: key/value heads) per tensor that the graph
writes in place, the prompt included (at batch 1 in chunks of PREFILL_CHUNK tokens: InPlaceDecoder); otherwise each
step's present [B, KV, S + 1, D] becomes the next past (GrowingDecoder). With a PrefixCache, a batch-1 prompt that starts with
whole chunks a recent prompt had gets their rows copied in instead of computed (runtime/batching/prefix_cache.py).

Constrained rows (runtime/sampling/constraint.py) come as objects on ids: their next allowed tokens are computed in a
thread of their own while the graph runs the step, then applied as the sampler chain's first filter.
"""

from typing import Iterator

import numpy as np
import onnxruntime as ort

from ..generation_config import GenerationConfig
from ..package.format import ATTENTION_MASK, INPUT_IDS, INPUTS_EMBEDS, LOGITS, LOGITS_TO_KEEP, POSITION_IDS
from ..sampling import SamplerChain, graph_outputs
from ..sampling.constraint import Masks
from ..sampling.graph_outputs import Prepared
from . import fast_path as ort_fast_path
from .session import GraphIO
from .steps import RowState, position_ids_from_mask, prefill_inputs, row_stop_ids  # noqa: F401 (position_ids_from_mask: its users import it here)

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
    ):
        self.session, self.io, self.device, self.vocab_size = session, io, device, vocab_size
        self.prefix_cache = prefix_cache  # a PrefixCache for batch-1 prompts on the in-place cache, or None
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
        if self.io.has_sampling and self.device == "cpu":  # these passes fetch no sampling outputs: make none
            # (on CUDA the graph's default, one row, stays: its kernels are not run on empty tensors here)
            feeds.update(graph_outputs.none_feed(self.runner))
        outputs = self.runner.run(feeds, self._output_names)
        logits = outputs[0].numpy()
        if not self.io.has_logits_to_keep and logits_to_keep:
            logits = logits[:, -logits_to_keep:]  # graphs without the input compute every position
        return logits, outputs[1:]

    def token_input(self, input_ids) -> np.ndarray:
        """What the graph's first input takes: the ids as int64, or their embeddings when it takes inputs_embeds."""
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        return self.embeddings(ids) if self.io.takes_embeddings else ids

    @property
    def writes_cache_in_place(self) -> bool:
        """Whether decoders keep the cache in preallocated buffers the graph writes (InPlaceDecoder)."""
        return self.io.kv_cache_in_place and self.io.has_logits_to_keep and self.device == "cpu"

    def decoder(self, batch: int, capacity: int, buffers: list | None = None, sampling: tuple | None = None):
        """A decoder for `batch` rows of up to `capacity` positions: it owns their key/value cache (written in
        place when the graph and the device allow it) and runs the graph against it. Its
        run(input_ids, attention_mask, position_ids) takes the prompt, then each step, and returns the last
        position's logits [B, 1, V]. `buffers` (in-place only): the cache arrays to use, one
        [batch, H, capacity, D] per cache tensor, owned by the caller (a running batch's slots, slot_cache.py);
        the prefix cache serves batch-1 decoders that own their buffers. `sampling`: likewise the arrays for the
        graph's sampling outputs (sampling_arrays(batch), or the first rows of larger ones)."""
        if self.writes_cache_in_place:
            prefix_cache = self.prefix_cache if batch == 1 and buffers is None else None
            return InPlaceDecoder(self, batch, capacity, prefix_cache, buffers, sampling)
        return GrowingDecoder(self, batch)

    def sampling_arrays(self, rows: int) -> tuple | None:
        """Arrays for the graph's sampling outputs of `rows` rows (graph_outputs.arrays); None for a graph without
        them."""
        return graph_outputs.arrays(rows, self.vocab_size) if self.io.has_sampling else None


class GrowingDecoder:
    """The plain contract: each pass's present (past + T rows) is the next pass's past."""

    def __init__(self, engine: Engine, batch: int):
        self.engine, self.past = engine, engine.empty_past(batch)

    def run(self, input_ids, attention_mask, position_ids) -> np.ndarray:
        logits, self.past = self.engine.forward(input_ids, attention_mask, position_ids, self.past)
        return logits

    def set_temperatures(self, temperatures) -> None:
        pass  # no sampling outputs are fetched: the sampler computes from the logits

    def prepared(self, rows: list | None = None) -> None:
        return None


class InPlaceDecoder:
    """One [B, KV, capacity, D] buffer per cache tensor, fed as past and fetched as present: GroupQueryAttention
    writes each pass's new rows in place, so neither the prompt nor any step copies the cache. The logits come
    back in one preallocated [B, 1, V] array, valid until the next run. With a prefix cache (batch 1), the prompt
    is prefilled in that cache's chunks, starting after the rows it restores, and its whole chunks are stored."""

    def __init__(
        self,
        engine: Engine,
        batch: int,
        capacity: int,
        prefix_cache=None,
        buffers: list | None = None,
        sampling: tuple | None = None,
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
        ]
        outputs = dict(zip(engine._output_names, [self.logits, *self.buffers]))
        self.keep_last_array = np.array(1, dtype=np.int64)
        self.keep_last = runner.value(self.keep_last_array)  # borrows it: the array lives as long as the decoder
        # Each pass writes the logits and the new cache rows into these same arrays; with the graph's sampling
        # outputs, for the first rows its temperature input has: runs[r] makes them for the first r rows, at
        # self.temperatures' first r, and runs[0] for none (greedy passes, which then cost nothing more).
        self.sampling, self.sampled, self.made = None, 0, False  # made: the last pass made them
        self._names, self._outputs = names, outputs
        if not engine.io.has_sampling:
            self.runs = {0: (runner.bind(names, outputs), [], None)}  # the run, the inputs after the cache, arrays
        else:
            self.held = sampling or engine.sampling_arrays(batch)  # (weights, block sums, temperatures), every row
            self.temperatures, self.runs = self.held[2], {}
            self.sampling = Prepared(self.held[0][:, 0], self.held[1][:, 0], (1.0,) * batch)

    def set_temperatures(self, temperatures) -> None:
        """Have the next passes make the sampling outputs at these temperatures: one for every row, or a list for
        the first len(list) rows (the rows after them greedy, or sampled without them); with None or [], none."""
        if self.sampling is None:
            return
        self.made = False  # what the last pass made was made at others
        if temperatures is None or np.ndim(temperatures) == 0:
            temperatures = [] if temperatures is None else [temperatures] * len(self.temperatures)
        if len(temperatures) > len(self.temperatures):
            raise ValueError(f"{len(temperatures)} temperatures for a decoder of {len(self.temperatures)} rows")
        self.sampled = rows = len(temperatures)
        if rows:
            self.temperatures[:rows, 0] = temperatures
            made_at = tuple(self.temperatures[:rows, 0].tolist())
            self.sampling = Prepared(self.held[0][:rows, 0], self.held[1][:rows, 0], made_at)

    def prepared(self, rows: list | None = None) -> Prepared | None:
        """The last pass's sampling outputs for `rows` (all when None); None where the graph has none, or that pass
        made none."""
        if not self.made or rows is None:
            return self.sampling if self.made else None
        return self.sampling.rows(rows)

    def run(self, input_ids, attention_mask, position_ids) -> np.ndarray:
        width, new = attention_mask.shape[1], input_ids.shape[1]
        # GroupQueryAttention takes several new tokens over an existing cache for one row only.
        chunk = PREFILL_CHUNK if len(input_ids) == 1 else new
        first, cached = 0, self._cacheable(input_ids, attention_mask, position_ids)
        if cached:  # the rows it has, then the chunks its blocks were made in: the passes a cold prefill makes
            chunk, first = self.prefix_cache.chunk, self.prefix_cache.restore(input_ids[0], self.buffers)
        for start in range(first, new, chunk):  # a decode step is one chunk of one token
            end = min(start + chunk, new)
            self._pass(input_ids[:, start:end], attention_mask[:, : width - new + end], position_ids[:, start:end])
        if cached:
            self.prefix_cache.store(input_ids[0], self.buffers)
        return self.logits

    def _bind(self, rows: int) -> tuple:
        """The run that makes the sampling outputs for the first `rows` rows (views of the first rows of the arrays,
        which the OrtValues borrow: kept with it), bound once per number of rows."""
        held = tuple(a[:rows] for a in self.held) if rows else self.engine.sampling_arrays(0)
        self.runs[rows] = graph_outputs.bind(self.engine.runner, self._names, self._outputs, held)
        return self.runs[rows]

    def _cacheable(self, input_ids, attention_mask, position_ids) -> bool:
        """A prompt over an empty cache, one row, unpadded at positions 0..T-1: the only prefill a prefix cache
        knows the rows of (a decode step, a padded row and a batch go without it)."""
        new = input_ids.shape[1]
        return (
            self.prefix_cache is not None
            and len(input_ids) == 1
            and new > 1
            and attention_mask.shape[1] == new
            and bool(np.all(attention_mask == 1))
            and np.array_equal(position_ids[0], np.arange(new))
        )

    def _pass(self, input_ids, attention_mask, position_ids):
        # The arrays must outlive the run: the OrtValues below only borrow them.
        arrays = [
            self.engine.token_input(input_ids),
            *(np.ascontiguousarray(a, dtype=np.int64) for a in (attention_mask, position_ids)[: self.id_inputs - 1]),
        ]
        run, temperature, _ = self.runs.get(self.sampled) or self._bind(self.sampled)
        self.made = False  # until the pass has written them
        run([*(self.engine.runner.value(a) for a in arrays), self.keep_last, *self.cache, *temperature])
        self.made = self.sampled > 0


def left_pad(prompts: list, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of different lengths -> input_ids and attention_mask [B, T], padding on the left."""
    return prefill_inputs(prompts, pad_id)[:2]


def decode_steps(
    engine: Engine,
    prompts: list,
    config: GenerationConfig,
    rngs: list,
    pad_id: int,
    finished: dict | None = None,
    constraints: list | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (tokens [B] int64, logits [B, V]) per new position until every row has finished.

    tokens: each row's next id, -1 for a row finished before this step. logits: the scores the tokens were picked
    from (the model's, with a constrained row's forbidden tokens at -inf), valid until the next step. `finished`
    maps row -> reason: the loop adds "stop" when a row picks end-of-text (that id is still yielded) or its
    constraint is finished, and "length" at max_new_tokens; the caller may add rows between steps (a stop string),
    and a finished row is no longer sampled or fed to the model. `constraints`: per row a
    sampling.constraint.RowConstraint or None (stop_ids: the row's end ids, config.stop_ids by default).
    """
    finished = {} if finished is None else finished
    batch, sampler = len(prompts), SamplerChain(config, engine.vocab_size)
    input_ids, attention_mask, position_ids = prefill_inputs(prompts, pad_id)
    constraints = constraints or [None] * batch
    states = [
        RowState(p, row_stop_ids(config.stop_ids, c), config.max_new_tokens, c) for p, c in zip(prompts, constraints)
    ]
    masks = Masks(batch, engine.vocab_size) if any(constraints) else None  # their allowed tokens, off-thread

    # Prefill: the whole prompt into the cache; only the last position's logits are computed.
    decoder = engine.decoder(batch, capacity=input_ids.shape[1] + config.max_new_tokens)
    if masks:
        masks.start(constraints)  # the first masks while the prompt runs
    logits = decoder.run(input_ids, attention_mask, position_ids)[:, -1, :]  # [B, V]
    # From the first decode step on, the graph's sampling outputs (where it has them) serve the pick, but never a
    # constrained batch's; the first token comes from the prompt's logits, as in a running batch (scheduler.py), so
    # a seeded row draws the same tokens alone and there.
    if sampler.prepared_temperature is not None and not masks:
        decoder.set_temperatures(sampler.prepared_temperature)
    while True:
        rows = [r for r in range(batch) if r not in finished]
        tokens = np.full(batch, -1, dtype=np.int64)
        every = len(rows) == batch
        if masks:
            logits = sampler.constrain(logits, masks.wait())
        tokens[rows] = sampler(
            logits if every else logits[rows],
            [states[r].seen for r in rows],
            [states[r].generated for r in rows],
            [rngs[r] for r in rows],
            decoder.prepared(None if every else rows),
        )
        for row in rows:
            reason = states[row].append(int(tokens[row]))
            if reason is not None:
                finished[row] = reason
        if masks:  # the next masks while the caller reads this step and the graph runs the next
            masks.start([None if r in finished else c for r, c in enumerate(constraints)])
        yield tokens, logits
        if len(finished) == batch:
            return
        # Decode: one token per row against the cache; finished rows feed padding that nobody reads.
        attention_mask = np.concatenate([attention_mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        position_ids = position_ids[:, -1:] + 1
        next_ids = [[pad_id if r in finished else tokens[r]] for r in range(batch)]
        logits = decoder.run(np.array(next_ids, dtype=np.int64), attention_mask, position_ids)[:, -1, :]
