"""The sampling outputs: what the sampler's draw needs from the last position's logits, computed in the graph."""

import numpy as np
from edgelm.runtime.package.format import (
    SAMPLING_BLOCK,
    SAMPLING_BLOCK_SUMS,
    SAMPLING_TEMPERATURE,
    SAMPLING_WEIGHTS,
    sampling_blocks,
)

from .builder import FLOAT


def sampling_outputs(g, logits: str, vocab_size: int) -> None:
    """What the sampler's draw needs from the last position's logits, computed while they are in the caches with
    onnxruntime's vectorised exp, instead of a NumPy pass over them after the step (benchmarks/NOTES.md):
    weights softmax(logits / temperature) [R, 1, n_blocks * SAMPLING_BLOCK], zero past the vocabulary, and
    each block's sum [R, 1, n_blocks], for the first R rows. The temperature [R, 1] is an overridable initializer,
    [[1]] by default; fed [0, 1], the outputs are empty and cost nothing (greedy passes)."""
    blocks = sampling_blocks(vocab_size)
    temperature = g.input(SAMPLING_TEMPERATURE, FLOAT, ["sampled", 1])
    g.weight(SAMPLING_TEMPERATURE, np.ones((1, 1), dtype=np.float32))
    rows = g.op("Shape", [temperature], start=0, end=1)
    ends = g.op("Concat", [rows, g.const([np.iinfo(np.int64).max])], axis=0)
    last = g.op("Slice", [logits, g.const([0, -1]), ends, g.const([0, 1])])  # [R, 1, V]
    tempered = g.op("Div", [last, g.op("Unsqueeze", [temperature, g.const([2])])])  # x / 1 is x exactly
    pad = g.const([0, 0, 0, 0, 0, blocks * SAMPLING_BLOCK - vocab_size])
    # one fused, vectorised kernel (max, exp, sum): the weights exp((logit - max) / t) divided by their total
    weights = g.op("Pad", [g.op("Softmax", [tempered], axis=-1), pad], outputs=[SAMPLING_WEIGHTS])
    in_blocks = g.op("Reshape", [weights, g.const([0, 0, blocks, SAMPLING_BLOCK])])  # [R, 1, n_blocks, BLOCK]
    # Each block's sum as an Einsum, not a ReduceSum: onnxruntime 1.22's ReduceSum over zero rows (a greedy pass)
    # returns its input unreduced, and the check of the output's shape fails.
    g.op("Einsum", [in_blocks], outputs=[SAMPLING_BLOCK_SUMS], equation="rokb->rok")  # [R, 1, n_blocks]
    g.output(SAMPLING_WEIGHTS, FLOAT, ["sampled", 1, blocks * SAMPLING_BLOCK])
    g.output(SAMPLING_BLOCK_SUMS, FLOAT, ["sampled", 1, blocks])
