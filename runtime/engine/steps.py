"""A prefill's inputs: what the decode loop (decode.py) and the running batch (runtime/batching/scheduler.py) both feed
the graph for prompts of any lengths, written once."""

import numpy as np


def prefill_inputs(prompts: list, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of any lengths -> (input_ids, attention_mask, position_ids), each [B, T] int64: left-padded with
    pad_id (masked, so any id serves), positions counting each row's real tokens (one unpadded prompt: 0..T-1)."""
    width = max(len(p) for p in prompts)
    input_ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            input_ids[row, -len(prompt) :] = prompt
            attention_mask[row, -len(prompt) :] = 1
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def position_ids_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """transformers' rule: count real tokens, padding gets position 1 (it is masked out anyway)."""
    positions = np.cumsum(attention_mask, axis=1) - 1
    return np.where(attention_mask == 0, 1, positions).astype(np.int64)
