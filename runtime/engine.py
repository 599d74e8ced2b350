"""The decode engine: token ids in, token ids out. It knows nothing about text (nanochat's rule).

One ONNX graph serves both steps. Shapes (B batch, T prompt length, S = tokens so far, V vocabulary):

    prefill  input_ids [B, T]  attention_mask [B, T]      position_ids [B, T]  past: empty [B, H, 0, D]
    decode   input_ids [B, 1]  attention_mask [B, S + 1]  position_ids [B, 1]  past: the cache so far
    both     logits [B, 1, V] (only the last position is computed)

The cache lives in onnxruntime OrtValues and is never converted between steps. With an edgelm package on
CPU it is one preallocated [B, H, T + max_new_tokens, D] buffer per tensor that the graph appends to in place
(InPlaceCache); otherwise each step's present [B, H, S + 1, D] becomes the next past (GrowingCache).
"""

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

from .config import GenerationConfig
from .sampling import log_softmax, pick, process_logits, top_logprobs
from .session import GraphIO


@dataclass
class Step:
    """What one decode step produced for every row."""

    tokens: np.ndarray  # int64 [B]; -1 for rows that had already finished
    finish_reasons: list  # per row: None (still running), "stop" (end-of-text) or "length"
    logprobs: list | None = None  # per row: (chosen log-prob, [(id, log-prob), ...]) or None


class Engine:
    """Runs the decoder graph one forward pass at a time."""

    def __init__(self, session: ort.InferenceSession, io: GraphIO, n_head: int, head_size: int, device: str):
        self.session, self.io, self.device = session, io, device
        # The decode loop talks to onnxruntime's C++ session and its OrtValues directly: the Python wrappers
        # cost ~0.5 ms per step (13+ objects built and unwrapped), 7% of an int8 distilgpt2 step.
        self._run = session._sess.run_with_ort_values
        self._host = ort_c.OrtDevice(ort_c.OrtDevice.cpu(), ort_c.OrtDevice.default_memory(), 0)
        self._cache_device = self._host if device == "cpu" else ort_c.OrtDevice(ort_c.OrtDevice.cuda(), ort_c.OrtDevice.default_memory(), 0)
        self.n_head, self.head_size = n_head, head_size
        self._present_names = [n for pair in zip(io.present_keys, io.present_values) for n in pair]
        self._past_names = [n for pair in zip(io.past_keys, io.past_values) for n in pair]
        self._output_names = ["logits", *self._present_names]

    def empty_past(self, batch: int) -> list:
        empty = np.zeros((batch, self.n_head, 0, self.head_size), dtype=np.float32)  # no elements: nothing to borrow
        return [ort_c.OrtValue.ortvalue_from_numpy(empty, self._cache_device) for _ in self._past_names]

    def forward(self, input_ids, attention_mask, position_ids, past: list, logits_to_keep: int = 1):
        """One pass. Returns logits [B, K, V] as NumPy (K = logits_to_keep, 0 = all) and the present cache."""
        arrays = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.io.has_position_ids:
            arrays["position_ids"] = position_ids
        if self.io.has_logits_to_keep:
            # An overridable initializer: IO binding cannot address it, run_with_ort_values can.
            arrays["logits_to_keep"] = np.array(logits_to_keep)
        # C-level OrtValues borrow the NumPy buffers: `arrays` keeps them alive until the run is over.
        arrays = {name: np.ascontiguousarray(a, dtype=np.int64) for name, a in arrays.items()}
        feeds = dict(zip(self._past_names, past))
        feeds.update({name: ort_c.OrtValue.ortvalue_from_numpy(a, self._host) for name, a in arrays.items()})
        outputs = self._run(feeds, self._output_names, None)
        logits = outputs[0].numpy()
        if not self.io.has_logits_to_keep and logits_to_keep:
            logits = logits[:, -logits_to_keep:]  # graphs without the input compute every position
        return logits, [outputs[i] for i in range(1, len(self._output_names))]

    def cache(self, present: list, capacity: int):
        """The decode-step cache after a prefill: updated in place when the graph and device allow it."""
        if self.io.kv_cache_in_place and self.device == "cpu":
            return InPlaceCache(self, present, capacity)
        return GrowingCache(self, present)


class GrowingCache:
    """The plain contract: each step's present (past + 1 row) is the next step's past."""

    def __init__(self, engine: Engine, present: list):
        self.engine, self.past = engine, present

    def step(self, input_ids, attention_mask, position_ids) -> np.ndarray:
        logits, self.past = self.engine.forward(input_ids, attention_mask, position_ids, self.past)
        return logits


class InPlaceCache:
    """One [B, H, capacity, D] buffer per cache tensor, bound through IO binding as both past and present:
    GroupQueryAttention writes each step's new row in place, so no step copies the whole cache.
    (A decode step has T = 1, so the graph's default logits_to_keep, which IO binding cannot set, is fine.)"""

    def __init__(self, engine: Engine, present: list, capacity: int):
        self.session = engine.session
        self.binding = engine.session.io_binding()
        self.binding.bind_output("logits", "cpu")  # first bound, first in get_outputs()
        self.buffers = []
        for past_name, present_name, value in zip(engine._past_names, engine._present_names, present):
            rows = value.numpy()  # [B, H, T, D] from the prefill
            buffer = np.zeros(rows.shape[:2] + (capacity,) + rows.shape[3:], dtype=np.float32)
            buffer[:, :, :rows.shape[2]] = rows
            bound = ort.OrtValue.ortvalue_from_numpy(buffer)  # keeps `buffer` alive
            self.binding.bind_ortvalue_input(past_name, bound)
            self.binding.bind_ortvalue_output(present_name, bound)
            self.buffers.append(bound)
        self.has_position_ids = engine.io.has_position_ids

    def step(self, input_ids, attention_mask, position_ids) -> np.ndarray:
        self._inputs = [np.ascontiguousarray(a, dtype=np.int64) for a in (input_ids, attention_mask, position_ids)]
        self.binding.bind_cpu_input("input_ids", self._inputs[0])
        self.binding.bind_cpu_input("attention_mask", self._inputs[1])
        if self.has_position_ids:
            self.binding.bind_cpu_input("position_ids", self._inputs[2])
        self.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy()


def left_pad(prompts: list, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of different lengths -> input_ids and attention_mask [B, T], padding on the left."""
    width = max(len(p) for p in prompts)
    input_ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            input_ids[row, -len(prompt):] = prompt
            attention_mask[row, -len(prompt):] = 1
    return input_ids, attention_mask


def position_ids_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """transformers' rule: count real tokens, padding gets position 1 (it is masked out anyway)."""
    positions = np.cumsum(attention_mask, axis=1) - 1
    return np.where(attention_mask == 0, 1, positions).astype(np.int64)


def generate(engine: Engine, prompts: list, config: GenerationConfig, rngs: list, pad_id: int) -> Iterator[Step]:
    """Yield one Step per new token position until every row has finished (end-of-text or max_new_tokens)."""
    batch = len(prompts)
    input_ids, attention_mask = left_pad(prompts, pad_id)
    position_ids = position_ids_from_mask(attention_mask)
    seen = [list(p) for p in prompts]  # prompt + generated ids per row, for the repetition filters
    generated = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    eos = None if config.ignore_eos else config.eos_token_id

    # Prefill: the whole prompt in one pass; only the last position's logits are computed.
    logits, present = engine.forward(input_ids, attention_mask, position_ids, engine.empty_past(batch))
    cache = engine.cache(present, capacity=input_ids.shape[1] + config.max_new_tokens)
    for step in range(config.max_new_tokens):
        raw = logits[:, -1, :]  # [B, V]
        filtered = process_logits(raw, config, seen, generated)
        tokens = np.where(done, -1, pick(filtered, config.do_sample, rngs))
        reasons = [None] * batch
        for row in np.flatnonzero(~done):
            token = int(tokens[row])
            seen[row].append(token)
            generated[row].append(token)
            if token == eos:
                reasons[row], done[row] = "stop", True
            elif step == config.max_new_tokens - 1:
                reasons[row], done[row] = "length", True
        yield Step(tokens, reasons, _logprobs(raw, tokens, config.logprobs))
        if done.all():
            return
        # Decode: one token per row against the cache; finished rows feed padding that nobody reads.
        attention_mask = np.concatenate([attention_mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        position_ids = position_ids[:, -1:] + 1
        logits = cache.step(np.where(done, pad_id, tokens)[:, None], attention_mask, position_ids)


def _logprobs(raw: np.ndarray, tokens: np.ndarray, top_n: int | None):
    """The model's own log-probabilities (before any sampling filter) of the chosen and the top-N tokens."""
    if top_n is None:
        return None
    logprobs = log_softmax(raw)
    return [None if t < 0 else (float(logprobs[r, t]), list(zip(*top_logprobs(logprobs[r], top_n)))) for r, t in enumerate(tokens)]
