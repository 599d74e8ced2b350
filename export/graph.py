"""Build the GPT-2 decoder as one ONNX graph that serves both the prompt step and every decode step.

The graph contract (input and output names, dtypes and shapes, the embedding and LM head's layout for each
recipe, tied or not, the in-place cache and the int8 cache) is written once, in models/README.md; this module
builds what it describes.
"""

import math
from dataclasses import dataclass

import numpy as np
from edgelm.runtime.package.format import (
    ALIGN,
    SAMPLING_BLOCK,
    SAMPLING_BLOCK_SUMS,
    SAMPLING_TEMPERATURE,
    SAMPLING_WEIGHTS,
    TOKEN_ROWS,
    TOKEN_SCALE,
    WEIGHTS_FILE,
    Architecture,
    sampling_blocks,
)

from .activations import mlp_activation
from .onnx_builder import FLOAT, INT8, INT64, MS_DOMAIN, GraphBuilder
from .quantize import INT4_BLOCK, quantize_int4, quantize_int8

OPSET = 17
EMBEDDINGS_OUTSIDE = ("int8",)  # recipes whose graph takes inputs_embeds: the runtime looks tokens up
LM_HEAD_PARTS = 4
MASKED = float(np.finfo(np.float32).min) / 2  # added to a score: exp() underflows to exactly 0


@dataclass
class Decoder:
    """The graph (its large initializers external, not yet placed) and the arrays for model.onnx.data."""

    model: object  # onnx.ModelProto
    arrays: dict  # name -> np.ndarray, in the order they were added


def build_decoder(
    arch: Architecture, weights: dict[str, np.ndarray], recipe: str = "none", cache_scales: dict | None = None
) -> Decoder:
    """weights: a GPT-2 state dict as NumPy arrays (HF names). cache_scales, for an int8 cache: layer ->
    (key scale, value scale), each float32 [H, D] (export/calibrate.py)."""
    g = GraphBuilder("edgelm_gpt2_decoder", WEIGHTS_FILE)
    H, D, C = arch.n_head, arch.head_size, arch.n_embd
    cache_type = INT8 if cache_scales else FLOAT
    if recipe in EMBEDDINGS_OUTSIDE:  # the runtime looks the tokens up (runtime/engine/embeddings.py)
        tokens = g.input("inputs_embeds", FLOAT, ["batch", "sequence", C])
    else:
        tokens = g.input("input_ids", INT64, ["batch", "sequence"])
    attention_mask = g.input("attention_mask", INT64, ["batch", "total_sequence"])
    position_ids = g.input("position_ids", INT64, ["batch", "sequence"])
    past = []
    for i in range(arch.n_layer):
        shape = ["batch", H, "past_sequence", D]
        past.append(
            (
                g.input(f"past_key_values.{i}.key", cache_type, shape),
                g.input(f"past_key_values.{i}.value", cache_type, shape),
            )
        )
    logits_to_keep = g.input("logits_to_keep", INT64, [])
    g.weight("logits_to_keep", np.array(0, dtype=np.int64))  # default: every position

    matmul = {"none": _float_matmul, "int8": _int8_matmul, "int4": _int4_matmul}[recipe]
    bias = lambda name: g.weight(name, weights[name])  # noqa: E731
    attention_bias = _attention_bias(g, tokens, attention_mask)  # float [B, 1, T, P + T]: 0 or -large
    seqlens_k, total_length = _cache_lengths(g, tokens, attention_mask)
    embed, lm_head = _embedding(g, weights, recipe, arch.tie_word_embeddings)
    x = g.op("Add", [embed(tokens), g.op("Gather", [g.weight("wpe", weights["transformer.wpe.weight"]), position_ids])])
    h = _layer_norm(g, x, weights, "transformer.h.0.ln_1", arch)

    # Each block is 8 fused onnxruntime ops: the residual add, its bias and the next layer norm are one
    # SkipLayerNormalization; the cache update and the attention are one GroupQueryAttention.
    for i in range(arch.n_layer):
        p = f"transformer.h.{i}."
        qkv = g.op("Add", [matmul(g, h, weights, p + "attn.c_attn"), bias(p + "attn.c_attn.bias")])  # [B, T, 3C] packed
        attn = group_query_attention(
            g,
            i,
            [qkv, "", ""],
            past[i],
            (seqlens_k, total_length, attention_bias),
            cache_scales and (cache_scales[i], f"{p}attn."),
            H,
            H,
            scale=arch.attention_scale(i),  # GPT-2's scale rule (scale_attn_weights, ..._by_inverse_layer_idx)
        )
        out = matmul(g, attn, weights, p + "attn.c_proj")
        h, x = _skip_layer_norm(g, out, x, weights, p + "ln_2", p + "attn.c_proj.bias", arch)  # x += out + bias
        m = mlp_activation(
            g,
            arch.activation_function,
            matmul(g, h, weights, p + "mlp.c_fc"),
            bias(p + "mlp.c_fc.bias"),
            weights,
            p + "mlp.act",
        )
        m = matmul(g, m, weights, p + "mlp.c_proj")
        if i + 1 < arch.n_layer:
            h, x = _skip_layer_norm(g, m, x, weights, f"transformer.h.{i + 1}.ln_1", p + "mlp.c_proj.bias", arch)

    # Keep only the positions the caller wants logits for, then the last residual add, final norm, LM head.
    kept = kept_positions(g, logits_to_keep, (m, x))
    h, _ = _skip_layer_norm(g, *kept, weights, "transformer.ln_f", p + "mlp.c_proj.bias", arch)
    lm_head(h, "logits")
    declare_outputs(g, arch, cache_type, H)
    doc = f"GPT-2 decoder with KV cache ({'int8' if cache_scales else 'float32'}), weights: {recipe}"
    return Decoder(g.model(OPSET, doc=doc), g.arrays)


def kept_positions(g, logits_to_keep: str, tensors) -> list:
    """Each of `tensors` [B, T, C] cut to its last logits_to_keep positions (0: all of them)."""
    keep = g.op("Reshape", [logits_to_keep, g.const([1])])
    start = g.op("Where", [g.op("Greater", [keep, g.const([0])]), g.op("Neg", [keep]), g.const([0])])
    return [g.op("Slice", [t, start, g.const([np.iinfo(np.int64).max]), g.const([1])]) for t in tensors]


def declare_outputs(g, arch, cache_type: int, kv_heads: int) -> None:
    """The graph contract's outputs: logits [B, K, V], each layer's present key and value, then the sampling
    outputs (sampling_outputs)."""
    g.output("logits", FLOAT, ["batch", "kept_sequence", arch.vocab_size])
    for i in range(arch.n_layer):
        for kind in ("key", "value"):
            g.output(f"present.{i}.{kind}", cache_type, ["batch", kv_heads, "total_sequence", arch.head_size])
    sampling_outputs(g, "logits", arch.vocab_size)


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
    in_blocks = g.op("Reshape", [weights, g.const([0, 0, blocks, SAMPLING_BLOCK])])
    g.op("ReduceSum", [in_blocks, g.const([-1])], outputs=[SAMPLING_BLOCK_SUMS], keepdims=0)
    g.output(SAMPLING_WEIGHTS, FLOAT, ["sampled", 1, blocks * SAMPLING_BLOCK])
    g.output(SAMPLING_BLOCK_SUMS, FLOAT, ["sampled", 1, blocks])


def group_query_attention(g, i, qkv, past, lengths, cache, heads, kv_heads, **attrs) -> str:
    """Layer i's attention over its cache: qkv ([packed, "", ""] or [q, k, v]), past (key, value), lengths
    (seqlens_k, total_length, attention_bias). cache: for an int8 cache, (the layer's (key scale, value scale),
    each [kv_heads, head_size], and the prefix their initializers are named with); else falsy."""
    seqlens_k, total_length, attention_bias = lengths
    inputs, quantized = [*qkv, *past, seqlens_k, total_length, "", "", "", attention_bias], {}
    if cache:
        scales, prefix = cache
        k_scale, v_scale = (
            g.weight(f"{prefix}{kind}_cache_scale", s.reshape(kv_heads, 1, -1).astype(np.float32))
            for kind, s in zip("kv", scales)
        )
        inputs += ["", k_scale, v_scale]
        quantized = {"k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL", "kv_cache_bit_width": 8}
    return g.op(
        "GroupQueryAttention",
        inputs,
        outputs=[f"attn_{i}", f"present.{i}.key", f"present.{i}.value"],
        domain=MS_DOMAIN,
        num_heads=heads,
        kv_num_heads=kv_heads,
        **attrs,
        **quantized,
    )[0]


def _attention_bias(g: GraphBuilder, tokens: str, attention_mask: str) -> str:
    """Causal and padding mask together as an additive bias [B, 1, T, P + T]: 0 where a query may attend,
    MASKED elsewhere. MASKED is finite so a fully padded query row gives a uniform softmax, never NaN."""
    new = g.op("Gather", [g.op("Shape", [tokens]), g.const(1)])  # T
    total = g.op("Gather", [g.op("Shape", [attention_mask]), g.const(1)])  # P + T
    query_pos = g.op("Range", [g.op("Sub", [total, new]), total, g.const(1)])  # [T] absolute positions
    key_pos = g.op("Range", [g.const(0), total, g.const(1)])  # [P + T]
    causal = g.op(
        "LessOrEqual", [g.op("Unsqueeze", [key_pos, g.const([0])]), g.op("Unsqueeze", [query_pos, g.const([1])])]
    )
    padding = g.op("Unsqueeze", [g.op("Cast", [attention_mask], to=9), g.const([1, 2])])  # [B, 1, 1, P + T]
    return g.op("Where", [g.op("And", [causal, padding]), g.const(0.0, np.float32), g.const(MASKED, np.float32)])


def _cache_lengths(g: GraphBuilder, tokens: str, attention_mask: str) -> tuple[str, str]:
    """GroupQueryAttention's view of the cache: every row holds P + T positions (left padding included,
    masked by the attention bias), so seqlens_k = P + T - 1 for each row and total_sequence_length = P + T."""
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", [attention_mask]), g.const(1)])], to=6)  # int32 scalar
    batch = g.op("Slice", [g.op("Shape", [tokens]), g.const([0]), g.const([1])])
    seqlens = g.op("Expand", [g.op("Sub", [total, g.const(1, np.int32)]), batch])
    return seqlens, total


def _layer_norm(g, x, weights, prefix, arch):
    return g.op(
        "LayerNormalization",
        [
            x,
            g.weight(prefix + ".weight", weights[prefix + ".weight"]),
            g.weight(prefix + ".bias", weights[prefix + ".bias"]),
        ],
        axis=-1,
        epsilon=arch.layer_norm_epsilon,
    )


def _skip_layer_norm(g, x, residual, weights, prefix, bias_name, arch):
    """LayerNorm(residual + x + bias) and the new residual, in one op."""
    outputs = g.op(
        "SkipLayerNormalization",
        [
            x,
            residual,
            g.weight(prefix + ".weight", weights[prefix + ".weight"]),
            g.weight(prefix + ".bias", weights[prefix + ".bias"]),
            g.weight(bias_name, weights[bias_name]),
        ],
        outputs=[g.fresh("normed"), "", "", g.fresh("residual")],
        domain=MS_DOMAIN,
        epsilon=arch.layer_norm_epsilon,
    )
    return outputs[0], outputs[3]


def _float_matmul(g, x, weights, prefix):
    """x @ W with GPT-2's Conv1D layout W [in, out]; the bias is added by the op that follows."""
    return g.op("MatMul", [x, g.weight(prefix + ".weight", weights[prefix + ".weight"])])


def _int8_matmul(g, x, weights, prefix):
    """The same product with int8 weights; activations are quantized on the fly by onnxruntime."""
    w = quantize_int8(weights[prefix + ".weight"])
    scale = g.weight(prefix + ".weight_scale", w.scale)
    zero_point = g.weight(prefix + ".weight_zero_point", np.zeros_like(w.scale, dtype=np.int8))
    return g.op(
        "DynamicQuantizeMatMul", [x, g.weight(prefix + ".weight_int8", w.q), scale, zero_point], domain=MS_DOMAIN
    )


def _int4_matmul(g, x, weights, prefix):
    """x @ W with W in 4-bit blocks; accuracy_level 4 quantizes x to int8 (its default 0 is ~100x slower)."""
    weight = weights[prefix + ".weight"]  # [K, N]
    w = quantize_int4(np.ascontiguousarray(weight.T))
    k, n = weight.shape
    inputs = [x, g.weight(prefix + ".weight_int4", w.packed), g.weight(prefix + ".weight_scale", w.scale)]
    return g.op("MatMulNBits", inputs, domain=MS_DOMAIN, K=k, N=n, bits=4, block_size=INT4_BLOCK, accuracy_level=4)


def _embedding(g, weights, recipe, tied):
    """Returns (embed(tokens) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]). Tied, the two share one stored
    matrix; untied, the LM head has its own (`lm_head.weight`, [V, C] as nn.Linear keeps it). For int8 the
    tokens arrive embedded (inputs_embeds) and embed passes them through."""
    wte = weights["transformer.wte.weight"]  # [V, C]
    head = wte if tied else weights["lm_head.weight"]  # [V, C]
    if recipe == "int4":
        return _embedding_int4(g, wte, head, tied)
    if recipe == "int8":
        return _embedding_int8(g, wte, head, tied)
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


def _embedding_int8(g, wte, head, tied):
    """One scale per vocabulary entry, the same for its embedding row and its logit column, stored as [V, C]
    rows that the runtime reads itself (export/weights_file.py, runtime/engine/embeddings.py). Tied, the LM head's
    QGemm parts name those same rows; untied, the token rows are written for the runtime alone (no node reads
    them) and the LM head quantizes `lm_head.weight` the same way into parts of its own."""
    w = quantize_int8(np.ascontiguousarray(wte.T))  # per column of [C, V]: one scale per vocabulary entry
    rows = np.ascontiguousarray(w.q.T)  # [V, C]
    if tied:
        return (lambda embeddings: embeddings), _int8_lm_head(g, rows, w.scale, (TOKEN_ROWS, TOKEN_SCALE))
    g.table(f"{TOKEN_ROWS}.0", rows)
    g.table(f"{TOKEN_SCALE}.0", w.scale)
    h = quantize_int8(np.ascontiguousarray(head.T))
    return (lambda embeddings: embeddings), _int8_lm_head(
        g, np.ascontiguousarray(h.q.T), h.scale, ("lm_head.weight_int8", "lm_head.weight_scale")
    )


def _int8_lm_head(g, rows, scale, names):
    """The LM head as QGemm reading int8 rows [V, C] transposed (as fast as DynamicQuantizeMatMul on [C, V]), in
    LM_HEAD_PARTS slices: onnxruntime transposes B into a scratch buffer to prepack it, and a quarter of the
    table at a time keeps that transient small. names: the rows' and scales' initializer names (+ ".{part}")."""
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

    def lm_head(x, out):
        quantized = g.op("DynamicQuantizeLinear", [g.op("Reshape", [x, g.const([-1, width])])], outputs=3)  # [B * K, C]
        batch, shapes = g.op("Shape", [x], start=0, end=1), {}
        logits = []
        for n, weights_k in parts:
            if n not in shapes:
                shapes[n] = g.op("Concat", [batch, g.const([-1, n])], axis=0)  # [B, K, n]
            logits.append(
                g.op("Reshape", [g.op("QGemm", [*quantized, *weights_k], domain=MS_DOMAIN, transB=1), shapes[n]])
            )
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
        return g.op(
            "MatMulNBits",
            [x, head_table, head_scale],
            outputs=[out],
            domain=MS_DOMAIN,
            K=width,
            N=vocab,
            bits=4,
            block_size=INT4_BLOCK,
            accuracy_level=4,
        )

    return embed, lm_head
