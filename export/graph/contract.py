"""The decoder graph's inputs and outputs, the same for every family (the graph contract, written once in
docs/package-format.md), and what a family's build_decoder returns."""

from dataclasses import dataclass

import numpy as np
from edgelm.runtime.package.format import (
    ATTENTION_MASK,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LOGITS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    Architecture,
    past_name,
    present_name,
)

from .builder import FLOAT, INT64, GraphBuilder

OPSET = 17


@dataclass
class Decoder:
    """The graph (its large initializers external, not yet placed) and the arrays for model.onnx.data."""

    model: object  # onnx.ModelProto
    arrays: dict  # name -> np.ndarray, in the order they were added


def decoder_inputs(g: GraphBuilder, arch: Architecture, kv_heads: int, cache_type: int, inputs_embeds: bool):
    """The graph contract's inputs, in order: input_ids [B, T] (inputs_embeds [B, T, C] when the runtime looks
    the tokens up), attention_mask [B, P + T], position_ids [B, T], each layer's past key and value
    [B, kv_heads, P, D], and logits_to_keep (a scalar, 0 by default: every position).
    Returns (tokens, attention_mask, position_ids, past [(key, value) per layer], logits_to_keep)."""
    if inputs_embeds:  # the runtime looks the tokens up (runtime/engine/embeddings.py)
        tokens = g.input(INPUTS_EMBEDS, FLOAT, ["batch", "sequence", arch.n_embd])
    else:
        tokens = g.input(INPUT_IDS, INT64, ["batch", "sequence"])
    attention_mask = g.input(ATTENTION_MASK, INT64, ["batch", "total_sequence"])
    position_ids = g.input(POSITION_IDS, INT64, ["batch", "sequence"])
    shape = ["batch", kv_heads, "past_sequence", arch.head_size]
    past = [
        (
            g.input(past_name(i, "key"), cache_type, shape),
            g.input(past_name(i, "value"), cache_type, shape),
        )
        for i in range(arch.n_layer)
    ]
    logits_to_keep = g.input(LOGITS_TO_KEEP, INT64, [])
    g.weight(LOGITS_TO_KEEP, np.array(0, dtype=np.int64))  # default: every position
    return tokens, attention_mask, position_ids, past, logits_to_keep


def kept_positions(g, logits_to_keep: str, tensors) -> list:
    """Each of `tensors` [B, T, C] cut to its last logits_to_keep positions (0: all of them)."""
    keep = g.op("Reshape", [logits_to_keep, g.const([1])])
    start = g.op("Where", [g.op("Greater", [keep, g.const([0])]), g.op("Neg", [keep]), g.const([0])])
    return [g.op("Slice", [t, start, g.const([np.iinfo(np.int64).max]), g.const([1])]) for t in tensors]


def declare_outputs(g, arch, cache_type: int, kv_heads: int) -> None:
    """The graph contract's outputs: logits [B, K, V], then each layer's present key and value."""
    g.output(LOGITS, FLOAT, ["batch", "kept_sequence", arch.vocab_size])
    for i in range(arch.n_layer):
        for kind in ("key", "value"):
            g.output(present_name(i, kind), cache_type, ["batch", kv_heads, "total_sequence", arch.head_size])
