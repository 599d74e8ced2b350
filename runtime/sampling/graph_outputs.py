"""The graph's sampling outputs, behind one seam: everything the runtime knows about them is here.

Packages exported by edgelm compute, in the decode step, what a draw from softmax(logits / t) needs at the last
position: `sampling_weights` [R, 1, n_blocks * BLOCK] (0 past the vocabulary) and `sampling_block_sums`
[R, 1, n_blocks], for the first R rows of the overridable `sampling_temperature` [R, 1] (docs/package-format.md;
the names are the package format's, package/format.py, which the export writes from too). This module says
whether a graph has them (in_graph), checks their shapes at load (problem), makes the arrays they are written
into (arrays), the feed that asks for none (none_feed) and the run that asks for R rows (bind), and holds what
the sampler reads of a pass's outputs (Prepared). The decoders (engine/decode.py) and the model's load check ask
it; the sampler chain decides where they serve (chain.py: prepared_temperature, _pick_prepared) and draws from
them (draw.py). A graph without them (optimum's, older packages) decodes the same tokens' distribution, the
sampler computing from the logits.

Why they stay: at a 2-core step of a few ms, the sampler's own pass over the vocabulary (max, exp, block sums
right after the step flushed the caches) costs 0.2-0.4 ms more a sampled step than the outputs' draw, and the
graph makes them for +0.06-0.13 ms (benchmarks/NOTES.md, results/2026-12-01-sampling-outputs-remeasured.md).
"""

import math
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from ..package.format import SAMPLING_BLOCK, SAMPLING_OUTPUTS, SAMPLING_TEMPERATURE, sampling_blocks

BLOCK = SAMPLING_BLOCK  # tokens per block of the inverse-CDF search, as the graph's sampling outputs have them
NO_ROWS = np.ones((0, 1), dtype=np.float32)  # a sampling temperature for no row: the graph makes no sampling outputs
# The weights are probabilities before any penalty (the largest at least 1/V): after penalties lower the likely
# tokens, a total this small would rest on weights that float32 holds inexactly (below 2**-126) or not at all,
# while at or above it those hold under 1e-13 of it.
MIN_TOTAL = 2.0**-64


def running_totals(sums: list) -> list:
    """np.cumsum's float64 sums, as Python floats."""
    return list(accumulate(sums))


@dataclass(frozen=True)
class Prepared:
    """A step's sampling outputs for the rows being sampled: weights [B, n_blocks * BLOCK] float32 (softmax(logits /
    temperature), 0 past the vocabulary), block_sums [B, n_blocks] float32, and the temperature each row's
    were made at (B float32 values, as Python floats). The arrays are the decoder's, overwritten by its next pass:
    a sampler may change them (the penalties do) until then. Never for a constrained row: the graph makes them from
    the unmasked logits (SamplerChain.constrain)."""

    weights: np.ndarray
    block_sums: np.ndarray
    temperatures: tuple

    def rows(self, index: list) -> "Prepared":
        """These rows only: views for consecutive rows (a scheduler job's), else copies."""
        first = index[0] if index else 0
        at = slice(first, first + len(index)) if list(index) == list(range(first, first + len(index))) else index
        return Prepared(self.weights[at], self.block_sums[at], tuple(self.temperatures[i] for i in index))

    def ends(self) -> list[list[float]] | None:
        """block_ends of the weights, from the block sums; None when a row's does not serve (row_ends)."""
        ends = [self.row_ends(r) for r in range(len(self.block_sums))]
        return None if None in ends else ends

    def row_ends(self, row: int) -> list[float] | None:
        """One row's block ends; None when its total is not finite and at least MIN_TOTAL (the logits held NaN or
        +inf, every token is banned, or penalties left only weights too small for float32 to hold exactly): the
        caller computes from the logits instead."""
        ends = running_totals(self.block_sums[row].tolist())
        return ends if MIN_TOTAL <= ends[-1] < math.inf else None


def in_graph(outputs: set, overridable: set) -> bool:
    """Whether a graph with these output names and overridable initializers makes the sampling outputs."""
    return set(SAMPLING_OUTPUTS) <= outputs and SAMPLING_TEMPERATURE in overridable


def arrays(rows: int, vocab_size: int) -> tuple:
    """Arrays for the sampling outputs of `rows` rows: weights [rows, 1, n_blocks * BLOCK], block sums
    [rows, 1, n_blocks], temperatures [rows, 1] (fed)."""
    blocks = sampling_blocks(vocab_size)
    return (
        np.zeros((rows, 1, blocks * BLOCK), dtype=np.float32),
        np.zeros((rows, 1, blocks), dtype=np.float32),
        np.ones((rows, 1), dtype=np.float32),
    )


def none_feed(runner) -> dict:
    """The feed that has a pass make no sampling outputs (a prompt's pass, a greedy step)."""
    return {SAMPLING_TEMPERATURE: runner.value(NO_ROWS)}


def bind(runner, names: list, outputs: dict, held: tuple) -> tuple:
    """The run whose passes make the sampling outputs into `held` (arrays() or views of their first rows, which the
    OrtValues borrow): (run, the temperature's OrtValue to feed after `names`' inputs, held)."""
    run = runner.bind([*names, SAMPLING_TEMPERATURE], outputs | dict(zip(SAMPLING_OUTPUTS, held)))
    return run, [runner.value(held[2])], held


def problem(session, vocab_size: int) -> str | None:
    """What is wrong with a graph's sampling outputs or their temperature, or None: each a float32 tensor of rank 3
    ([rows, 1, width]) or, for the temperature, an overridable initializer [rows, 1], rows left to the caller
    (a name, not a number)."""
    blocks = sampling_blocks(vocab_size)
    widths = dict(zip(SAMPLING_OUTPUTS, (blocks * BLOCK, blocks)))
    expected = {name: ["rows", 1, width] for name, width in widths.items()} | {SAMPLING_TEMPERATURE: ["rows", 1]}
    tensors = [o for o in session.get_outputs() if o.name in widths]
    tensors += [i for i in session.get_overridable_initializers() if i.name == SAMPLING_TEMPERATURE]
    for tensor in tensors:
        want = expected[tensor.name]
        shape_ok = len(tensor.shape) == len(want) and not isinstance(tensor.shape[0], int)
        shape_ok = shape_ok and all(d == w or not isinstance(d, int) for d, w in zip(tensor.shape[1:], want[1:]))
        if tensor.type != "tensor(float)" or not shape_ok:
            return f"has {tensor.name} of {tensor.type} {tensor.shape}, not float32 {want} for a vocabulary of {vocab_size} entries"
    if any(i.name == SAMPLING_TEMPERATURE for i in session.get_inputs()):
        return f"takes {SAMPLING_TEMPERATURE} as a required input, not an overridable initializer"
    return None
