"""The token embedding and the LM head for each weight recipe, tied (one stored matrix serves both) or not.

float32: a Gather and a MatMul; int8 and int8-dynamic: the runtime looks the tokens up from int8 rows in
model.onnx.data (the graph takes inputs_embeds) and the LM head is QGemm over those rows, in slices (int8 scales
each row of activations by its own largest value first, int8-dynamic quantizes them all with one scale); int4: GatherBlockQuantized and
MatMulNBits over one 4-bit copy. The layouts are part of the graph contract (models/README.md).
"""

import math

import numpy as np
from edgelm.runtime.package.format import ALIGN, TOKEN_ROWS, TOKEN_SCALE

from ..quantize import INT4_BLOCK, INT8_RECIPES, quantize_int4, quantize_int8
from .builder import MS_DOMAIN
from .matmuls import nbits_matmul

EMBEDDINGS_OUTSIDE = INT8_RECIPES  # recipes whose graph takes inputs_embeds: the runtime looks tokens up
LM_HEAD_PARTS = 4


def embedding_and_head(g, wte, head, recipe):
    """Returns (embed(tokens) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]) for the token embedding wte [V, C]
    and the LM head's matrix head [V, C] (as nn.Linear keeps it), or head None when the two are tied. Tied, the
    two share one stored matrix; untied, the LM head has its own. For int8 the tokens arrive embedded
    (inputs_embeds, EMBEDDINGS_OUTSIDE) and embed passes them through. The initializers keep GPT-2's names
    (transformer.wte.weight, lm_head.weight) in every family."""
    tied = head is None
    head = wte if tied else head  # [V, C]
    if recipe == "int4":
        return _embedding_int4(g, wte, head, tied)
    if recipe in INT8_RECIPES:
        return _embedding_int8(g, wte, head, tied, per_row=recipe == "int8")
    head_t = g.weight("lm_head.weight_t", np.ascontiguousarray(head.T))  # [C, V]

    def lm_head(x, out):
        return g.op("MatMul", [x, head_t], outputs=[out])

    if tied:  # the lookup gathers the head's columns: [C, B, T] -> [B, T, C]

        def embed(ids):
            return g.op("Transpose", [g.op("Gather", [head_t, ids], axis=1)], perm=[1, 2, 0])

    else:
        table = g.weight("transformer.wte.weight", wte)

        def embed(ids):
            return g.op("Gather", [table, ids], axis=0)

    return embed, lm_head


def _embedding_int8(g, wte, head, tied, per_row):
    """One scale per vocabulary entry, the same for its embedding row and its logit column, stored as [V, C]
    rows that the runtime reads itself (export/weights_file.py, runtime/engine/embeddings.py). Tied, the LM head's
    QGemm parts name those same rows; untied, the token rows are written for the runtime alone (no node reads
    them) and the LM head quantizes `lm_head.weight` the same way into parts of its own."""
    w = quantize_int8(np.ascontiguousarray(wte.T))  # per column of [C, V]: one scale per vocabulary entry
    rows = np.ascontiguousarray(w.q.T)  # [V, C]
    if tied:
        return (lambda embeddings: embeddings), _int8_lm_head(g, rows, w.scale, (TOKEN_ROWS, TOKEN_SCALE), per_row)
    g.table(f"{TOKEN_ROWS}.0", rows)
    g.table(f"{TOKEN_SCALE}.0", w.scale)
    h = quantize_int8(np.ascontiguousarray(head.T))
    return (lambda embeddings: embeddings), _int8_lm_head(
        g, np.ascontiguousarray(h.q.T), h.scale, ("lm_head.weight_int8", "lm_head.weight_scale"), per_row
    )


def _int8_lm_head(g, rows, scale, names, per_row):
    """The LM head as QGemm reading int8 rows [V, C] transposed (as fast as DynamicQuantizeMatMul on [C, V]), in
    LM_HEAD_PARTS slices: onnxruntime transposes B into a scratch buffer to prepack it, and a quarter of the
    table at a time keeps that transient small. names: the rows' and scales' initializer names (+ ".{part}").

    per_row: each row of x is divided by its own largest |value| and quantized with the fixed scale 1/127 (zero
    point 128), and its logits multiplied back by that value, so a row's logits do not depend on the other rows
    of the batch. Otherwise DynamicQuantizeLinear picks one scale for every row at once."""
    vocab, width = rows.shape
    step = -(-vocab // LM_HEAD_PARTS)
    grain = ALIGN // math.gcd(width, ALIGN)  # rows per 64 KiB boundary: every slice starts where it can be mapped
    step = -(-step // grain) * grain
    parts = []  # (vocabulary entries, (rows, scale, zero point)) per slice
    for k, start in enumerate(range(0, vocab, step)):
        piece = slice(start, start + step)
        n = len(scale[piece])
        zero_point = np.zeros(n, dtype=np.int8)
        stored = zip((f"{names[0]}.{k}", f"{names[1]}.{k}"), (rows[piece], scale[piece]))
        weights_k = [g.weight(name, a, external=True) for name, a in stored]  # in the file: the runtime may read them
        weights_k.append(g.weight(f"{names[0].rsplit('_', 1)[0]}_zero_point.{k}", zero_point))
        parts.append((n, weights_k))

    def quantize_rows(flat):  # [B * K, C] -> (uint8 [B * K, C], its scale, its zero point), [B * K, 1] or None
        if not per_row:
            return g.op("DynamicQuantizeLinear", [flat], outputs=3), None
        largest = g.op("Max", [g.op("ReduceMax", [g.op("Abs", [flat])], axes=[-1]), g.const(1e-30, np.float32)])
        fixed = [g.const(1 / 127, np.float32), g.const(128, np.uint8)]
        return [g.op("QuantizeLinear", [g.op("Div", [flat, largest]), *fixed]), *fixed], largest

    def lm_head(x, out):
        quantized, largest = quantize_rows(g.op("Reshape", [x, g.const([-1, width])]))  # [B * K, C]
        batch, shapes = g.op("Shape", [x], start=0, end=1), {}
        logits = []
        for n, weights_k in parts:
            if n not in shapes:
                shapes[n] = g.op("Concat", [batch, g.const([-1, n])], axis=0)  # [B, K, n]
            part = g.op("QGemm", [*quantized, *weights_k], domain=MS_DOMAIN, transB=1)  # [B * K, n]
            part = part if largest is None else g.op("Mul", [part, largest])
            logits.append(g.op("Reshape", [part, shapes[n]]))
        # The last op writes the logits: into the caller's preallocated output, without a copy after it.
        return g.op("Concat", logits, outputs=[out], axis=-1)

    return lm_head


def _embedding_int4(g, wte, head, tied):
    """wte [V, C] is already MatMulNBits' [N, K] layout: tied, one 4-bit copy serves the LM head and the lookup;
    untied, the lookup and the head each quantize their own matrix the same way."""
    vocab, width = wte.shape

    def blocks(name, matrix):
        w = quantize_int4(matrix)
        return g.weight(f"{name}_int4", w.packed), g.weight(f"{name}_scale", w.scale)  # [V, C/32, 16], [V, C/32]

    head_table, head_scale = blocks("lm_head.weight", head)
    table, scale = (head_table, head_scale) if tied else blocks("transformer.wte.weight", wte)
    block_scale = g.op("Unsqueeze", [scale, g.const([2])])  # [V, C / 32, 1]: one block per row of the table

    def embed(ids):
        rows = g.op(
            "GatherBlockQuantized",
            [table, ids, block_scale],
            domain=MS_DOMAIN,
            bits=4,
            block_size=INT4_BLOCK,
            gather_axis=0,
            quantize_axis=2,
        )
        return g.op("Reshape", [rows, g.const([0, 0, width])])  # [B, T, C/32, 32] -> [B, T, C]

    def lm_head(x, out):
        return nbits_matmul(g, x, head_table, head_scale, width, vocab, 4, INT4_BLOCK, outputs=[out])

    return embed, lm_head
