"""The token embedding and the LM head for each weight recipe, tied (one stored matrix serves both) or not.

float32: a Gather and a MatMul; int8, int8-rows and int8-dynamic: the runtime looks the tokens up from rows
in model.onnx.data (the graph takes inputs_embeds). int8's tied LM head is MatMulNBits over those rows, 8-bit in
the recipe's blocks (its products' kernel, faster for one row than QGemm's: benchmarks/results/
2026-12-07-int8-blocks.md); int8's untied one is the same MatMulNBits over a matrix of its own, the token rows
written for the runtime alone; int8-rows' and int8-dynamic's and int8's at a width 32 does not divide are QGemm
over 7-bit rows, in slices (int8 and int8-rows scale each row of activations by its own
largest value first; int8-dynamic quantizes them all with one scale); int4: GatherBlockQuantized and
MatMulNBits over one copy in blocks, 4-bit or (head_bits 8) 8-bit. The layouts are part of the graph contract
(docs/package-format.md)."""

import math

import numpy as np
from edgelm.runtime.package.format import ALIGN, TOKEN_ROWS, TOKEN_SCALE

from ..int4 import BlockWeight, Int4Options, quantize_blocks
from ..quantize import INT8_RECIPES, int8_block, quantize_int8, quantize_int8_blocks
from .builder import MS_DOMAIN
from .matmuls import matmul_nbits, nbits_weights, quantize_rows

EMBEDDINGS_OUTSIDE = INT8_RECIPES  # recipes whose graph takes inputs_embeds: the runtime looks tokens up
LM_HEAD_PARTS = 4


def embedding_and_head(g, wte, head, recipe, int4: Int4Options | None = None):
    """Returns (embed(tokens) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]) for the token embedding wte [V, C]
    and the LM head's matrix head [V, C] (as nn.Linear keeps it), or head None when the two are tied. Tied, the
    two share one stored matrix; untied, the LM head has its own. For int8 the tokens arrive embedded
    (inputs_embeds, EMBEDDINGS_OUTSIDE) and embed passes them through. The initializers keep GPT-2's names
    (transformer.wte.weight, lm_head.weight) in every family."""
    tied = head is None
    head = wte if tied else head  # [V, C]
    if recipe == "int4":
        return _embedding_int4(g, wte, head, tied, int4 or Int4Options())
    if recipe == "int8" and tied and wte.shape[1] % int8_block(wte.shape[1]) == 0:
        return _embedding_int8_blocks(g, wte)
    if recipe == "int8" and not tied:  # the products' kernel for the head; the table the runtime's alone
        head_blocks = quantize_int8_blocks(head)  # [V, C] is MatMulNBits' [N, K] already
        lm_head = nbits_head_slices(g, head_blocks, ("lm_head.weight_int8", "lm_head.weight_scale"))
        return runtime_token_rows(g, wte), lm_head
    if recipe in INT8_RECIPES:
        return _embedding_int8(g, wte, head, tied, per_row=recipe != "int8-dynamic")
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


def _embedding_int8_blocks(g, wte):
    """The int8 recipe's tied matrix as its products are stored (quantize_int8_blocks: uint8 [V, C / B, B] around
    128, one scale per block), written as the token table: the runtime reads its rows for the lookup
    (TokenTable.block) and the LM head's MatMulNBits slices name the same bytes, which onnxruntime prepacks."""
    w = quantize_int8_blocks(wte)
    return (lambda embeddings: embeddings), nbits_head_slices(g, w, (TOKEN_ROWS, TOKEN_SCALE), external=True)


def nbits_head_slices(g, w: BlockWeight, names: tuple, external: bool = False):
    """lm_head(x, out) for the 8-bit BlockWeight w [V, C]: in LM_HEAD_PARTS slices of the vocabulary, a
    MatMulNBits each, their logits concatenated. onnxruntime holds a slice's mapped bytes and its packed copy at
    once while it prepacks, so a quarter of the matrix at a time keeps the load's peak memory down (Qwen2.5-0.5B's
    136 MB table: benchmarks/NOTES.md). names: the codes' and scales' initializer names (+ ".{part}");
    external: in the data file whatever their size (the token table, which the runtime reads)."""
    vocab = len(w.codes)
    step = _part_rows(vocab, (w.packed[0].nbytes, w.scale[0].nbytes))  # each part's codes and scales whole ALIGNs
    parts = []
    for k, start in enumerate(range(0, vocab, step)):
        piece = BlockWeight(w.codes[start : start + step], w.scale[start : start + step], None, 8, w.width)
        stored = zip(names, (piece.packed, piece.scale))
        parts.append((piece, [g.weight(f"{name}.{k}", a, external=external) for name, a in stored]))

    def lm_head(x, out):
        if len(parts) == 1:
            return matmul_nbits(g, x, *parts[0], outputs=[out])
        logits = [matmul_nbits(g, x, piece, stored) for piece, stored in parts]
        return g.op("Concat", logits, outputs=[out], axis=-1)  # the last op writes the caller's logits

    return lm_head


def _part_rows(vocab: int, row_bytes: tuple) -> int:
    """Rows per LM-head slice: a quarter of the vocabulary, rounded up so that each slice of each array (row_bytes
    a row) is a whole number of ALIGN units and the next one starts where onnxruntime can map it."""
    step = -(-vocab // LM_HEAD_PARTS)
    grain = math.lcm(*(ALIGN // math.gcd(size, ALIGN) for size in row_bytes))
    return -(-step // grain) * grain


def _embedding_int8(g, wte, head, tied, per_row):
    """One scale per vocabulary entry, the same for its embedding row and its logit column, stored as [V, C]
    rows that the runtime reads itself (export/weights_file.py, runtime/engine/embeddings.py). Tied, the LM head's
    QGemm parts name those same rows; untied, the token rows are written for the runtime alone (runtime_token_rows)
    and the LM head quantizes `lm_head.weight` the same way into parts of its own."""
    if tied:
        w = quantize_int8(np.ascontiguousarray(wte.T))  # per column of [C, V]: one scale per vocabulary entry
        rows = np.ascontiguousarray(w.q.T)  # [V, C]
        return (lambda embeddings: embeddings), int8_lm_head(g, rows, w.scale, (TOKEN_ROWS, TOKEN_SCALE), per_row)
    h = quantize_int8(np.ascontiguousarray(head.T))
    return runtime_token_rows(g, wte), int8_lm_head(
        g, np.ascontiguousarray(h.q.T), h.scale, ("lm_head.weight_int8", "lm_head.weight_scale"), per_row
    )


def runtime_token_rows(g, wte):
    """An untied int8 graph's token table, which no product reads: 8-bit rows [V, C] with one float32 scale per
    row, written for the runtime's lookup alone (graph.token_embeddings without a block). The runtime reads the
    rows a prompt names with positioned reads, so they are never mapped into the process: a Gather over a mapped
    table made each token it read resident with its whole page-cache folio (TinyLlama's shape: 93 MB of mapped
    files after a 512-token prompt, 45 MB with the runtime's reads: benchmarks/NOTES.md). Returns embed, which
    passes the rows through."""
    w = quantize_int8(np.ascontiguousarray(wte.T), reduce_range=False)  # per vocabulary entry, [-127, 127]
    g.table(f"{TOKEN_ROWS}.0", np.ascontiguousarray(w.q.T))
    g.table(f"{TOKEN_SCALE}.0", w.scale)
    return lambda embeddings: embeddings


def int8_lm_head(g, rows, scale, names, per_row):
    """The LM head as QGemm reading int8 rows [V, C] transposed (as fast as DynamicQuantizeMatMul on [C, V]), in
    LM_HEAD_PARTS slices: onnxruntime transposes B into a scratch buffer to prepack it, and a quarter of the
    table at a time keeps that transient small. names: the rows' and scales' initializer names (+ ".{part}").

    per_row: each row of x quantized by its own largest |value| (matmuls.quantize_rows, as int8-rows' products), and
    its logits multiplied back by that value, so a row's logits do not depend on the other rows of the batch.
    Otherwise DynamicQuantizeLinear picks one scale for every row at once."""
    vocab, width = rows.shape
    step = _part_rows(vocab, (width,))  # every slice starts where it can be mapped
    parts = []  # (vocabulary entries, (rows, scale, zero point)) per slice
    for k, start in enumerate(range(0, vocab, step)):
        piece = slice(start, start + step)
        n = len(scale[piece])
        zero_point = np.zeros(n, dtype=np.int8)
        stored = zip((f"{names[0]}.{k}", f"{names[1]}.{k}"), (rows[piece], scale[piece]))
        weights_k = [g.weight(name, a, external=True) for name, a in stored]  # in the file: the runtime may read them
        weights_k.append(g.weight(f"{names[0].rsplit('_', 1)[0]}_zero_point.{k}", zero_point))
        parts.append((n, weights_k))

    def lm_head(x, out):
        flat = g.op("Reshape", [x, g.const([-1, width])])  # [B * K, C]
        if per_row:
            quantized, largest = quantize_rows(g, flat)
        else:
            quantized, largest = g.op("DynamicQuantizeLinear", [flat], outputs=3), None
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


def _embedding_int4(g, wte, head, tied, int4: Int4Options):
    """wte [V, C] is already MatMulNBits' [N, K] layout: tied, one copy serves the LM head and the lookup;
    untied, the lookup and the head each quantize their own matrix the same way: at int4.head_bits, rounded by
    int4.head_method. A width C that is not a multiple of the block is padded, and the lookup drops the padding."""
    vocab, width = wte.shape
    bits = int4.head_bits

    def blocks(matrix):
        return quantize_blocks(matrix, int4.block_size, int4.head_method, bits)

    head_w = blocks(head)
    head_weights = nbits_weights(g, head_w, "lm_head.weight")
    table_w = head_w if tied else blocks(wte)
    # Tied, the lookup reads the LM head's own codes and scales: the matrix is stored once. Untied, the table
    # stores its codes and scales only: the lookup reads its zero points one a byte (below), never MatMulNBits'
    # packed ones, and an initializer no node reads is dropped by onnxruntime, which then refuses it by name.
    if tied:
        table, scale = head_weights[:2]
    else:
        name = "transformer.wte.weight"
        table = g.weight(f"{name}_int{bits}", table_w.packed)
        scale = g.weight(f"{name}_scale", table_w.scale)
    # GatherBlockQuantized reads [V, nb, B] with one scale (and zero point) per row of its last axis: [V, nb, 1].
    lookup = [g.op("Unsqueeze", [scale, g.const([2])])]
    if table_w.zero_point is not None:  # uint8, one a byte: bits 8, or the 4-bit code in the low nibble
        lookup.append(g.weight(f"{table}_zero_point_rows", table_w.zero_point[..., None]))
    padded = table_w.codes.shape[1] * int4.block_size  # C rounded up to whole blocks

    def embed(ids):
        rows = g.op(
            "GatherBlockQuantized",
            [table, ids, *lookup],
            domain=MS_DOMAIN,
            bits=bits,
            block_size=int4.block_size,
            gather_axis=0,
            quantize_axis=2,
        )
        rows = g.op("Reshape", [rows, g.const([0, 0, padded])])  # [B, T, nb, B] -> [B, T, nb * B]
        if padded == width:
            return rows
        return g.op("Slice", [rows, g.const([0]), g.const([width]), g.const([2])])  # the padding dropped: [B, T, C]

    def lm_head(x, out):
        return matmul_nbits(g, x, head_w, head_weights, outputs=[out])

    return embed, lm_head
