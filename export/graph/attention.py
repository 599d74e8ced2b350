"""Attention over the KV cache: the mask as an additive bias, the cache lengths GroupQueryAttention reads, and
the attention op itself (the cache update and the attention in one onnxruntime op, float32 or int8 cache)."""

import numpy as np
from edgelm.runtime.package.format import present_name

from .builder import MS_DOMAIN, GraphBuilder

MASKED = float(np.finfo(np.float32).min) / 2  # added to a score: exp() underflows to exactly 0


def attention_bias(g: GraphBuilder, tokens: str, attention_mask: str) -> str:
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


def cache_lengths(g: GraphBuilder, tokens: str, attention_mask: str) -> tuple[str, str]:
    """GroupQueryAttention's view of the cache: every row holds P + T positions (left padding included,
    masked by the attention bias), so seqlens_k = P + T - 1 for each row and total_sequence_length = P + T."""
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", [attention_mask]), g.const(1)])], to=6)  # int32 scalar
    batch = g.op("Slice", [g.op("Shape", [tokens]), g.const([0]), g.const([1])])
    seqlens = g.op("Expand", [g.op("Sub", [total, g.const(1, np.int32)]), batch])
    return seqlens, total


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
        outputs=[f"attn_{i}", present_name(i, "key"), present_name(i, "value")],
        domain=MS_DOMAIN,
        num_heads=heads,
        kv_num_heads=kv_heads,
        **attrs,
        **quantized,
    )[0]
