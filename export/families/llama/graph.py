"""Build the Llama-family decoder (Llama, Qwen2) as one ONNX graph for the prompt step and every decode step,
from the graph kit (export/graph/).

The same contract as GPT-2's (docs/package-format.md, "Llama and Qwen2"): the same inputs and outputs, the cache
[B, kv_heads, P, D] with one head per key/value head. Per block: RMSNorm, Q/K/V from one packed product (plus
Qwen2's biases), rotary embeddings on Q and K, grouped-query attention, RMSNorm with the residual add, and a
SwiGLU MLP (gate and up from one packed product).

Why rotary outside GroupQueryAttention: the runtime left-pads a batch and every row holds P + T cache positions
(graph/attention.py cache_lengths), so positions must come from position_ids, which counts real tokens only
(transformers' rule). com.microsoft RotaryEmbedding reads them, from cos/sin tables baked here. GroupQueryAttention's
own rotary (do_rotary) takes them too, but its CPU kernel gives a batch of rows decoding over the in-place cache
other logits (onnxruntime 1.32.0; one row is exact: tools/graph_variants.py rotary-in-attention).
"""

from functools import partial

import numpy as np
from edgelm.runtime.package.format import LOGITS, WEIGHTS_FILE, Architecture

from ...graph.attention import attention_bias, cache_lengths, group_query_attention
from ...graph.builder import FLOAT, INT8, MS_DOMAIN, GraphBuilder
from ...graph.contract import OPSET, Decoder, declare_outputs, decoder_inputs, kept_positions
from ...graph.embeddings import EMBEDDINGS_OUTSIDE, embedding_and_head
from ...graph.matmuls import MATMULS
from ...graph.norms import rms_norm, skip_rms_norm
from ...int4 import Int4Options
from .packing import pack_weights
from .rope import rope_tables


def build_decoder(
    arch: Architecture,
    weights: dict[str, np.ndarray],
    recipe: str = "none",
    cache_scales: dict | None = None,
    int4: Int4Options | None = None,
) -> Decoder:
    """weights: a LlamaForCausalLM / Qwen2ForCausalLM state dict as NumPy arrays (HF names, torch Linear's
    [out, in] layout). cache_scales, for an int8 cache: layer -> (key scale, value scale), float32
    [kv_heads, head_size] each. Returns a Decoder: the graph and its external arrays (graph/contract.py)."""
    g = GraphBuilder(f"edgelm_{arch.model_type}_decoder", WEIGHTS_FILE)
    H, KV, D = arch.n_head, arch.kv_heads, arch.head_size
    cache_type = INT8 if cache_scales else FLOAT
    tokens, attention_mask, position_ids, past, logits_to_keep = decoder_inputs(
        g, arch, KV, cache_type, inputs_embeds=recipe in EMBEDDINGS_OUTSIDE
    )

    packed = pack_weights(arch, weights)  # GPT-2's [in, out] layout, Q/K/V and gate/up packed
    matmul = partial(MATMULS[recipe], int4=int4)  # int4: the int4 recipe's options (export/int4.py)
    mask_bias = attention_bias(g, tokens, attention_mask)  # float [B, 1, T, P + T]: 0 or -large
    seqlens_k, total_length = cache_lengths(g, tokens, attention_mask)
    cos, sin = (g.weight(name, table) for name, table in zip(("rope.cos_cache", "rope.sin_cache"), rope_tables(arch)))
    embed, lm_head = _embedding_and_head(g, weights, recipe, arch, int4)
    x = embed(tokens)
    h = rms_norm(g, x, packed, "model.layers.0.input_layernorm.weight", arch)

    def linear(x, name):
        y = matmul(g, x, packed, name)
        return g.op("Add", [y, g.weight(name + ".bias", packed[name + ".bias"])]) if name + ".bias" in packed else y

    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        q, k, v = g.op(
            "Split", [linear(h, p + "self_attn.qkv_proj"), g.const([H * D, KV * D, KV * D])], outputs=3, axis=-1
        )
        q, k = (g.op("RotaryEmbedding", [t, position_ids, cos, sin], domain=MS_DOMAIN) for t in (q, k))
        lengths = (seqlens_k, total_length, mask_bias)
        cache = cache_scales and (cache_scales[i], f"{p}self_attn.")
        attn = group_query_attention(g, i, [q, k, v], past[i], lengths, cache, H, KV)
        out = matmul(g, attn, packed, p + "self_attn.o_proj")
        h, x = skip_rms_norm(
            g, out, x, packed, p + "post_attention_layernorm.weight", p + "self_attn.o_proj.bias", arch
        )
        gate, up = g.op("Split", [linear(h, p + "mlp.gate_up_proj"), g.const([arch.mlp_width] * 2)], outputs=2, axis=-1)
        m = matmul(g, g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up]), packed, p + "mlp.down_proj")
        if i + 1 < arch.n_layer:
            norm = f"model.layers.{i + 1}.input_layernorm.weight"
            h, x = skip_rms_norm(g, m, x, packed, norm, p + "mlp.down_proj.bias", arch)

    # Keep only the positions the caller wants logits for, then the last residual add, final norm, LM head.
    kept = kept_positions(g, logits_to_keep, (m, x))
    h, _ = skip_rms_norm(g, *kept, packed, "model.norm.weight", p + "mlp.down_proj.bias", arch)
    lm_head(h, LOGITS)
    declare_outputs(g, arch, cache_type, KV)
    doc = f"{arch.model_type} decoder with KV cache ({'int8' if cache_scales else 'float32'}), weights: {recipe}"
    return Decoder(g.model(OPSET, doc=doc), g.arrays)


def _embedding_and_head(g, weights, recipe, arch, int4):
    """(embed(tokens) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]): the kit's (graph/embeddings.py), the same
    layouts as GPT-2's for every recipe, tied or untied."""
    head = None if arch.tie_word_embeddings else weights["lm_head.weight"]
    return embedding_and_head(g, weights["model.embed_tokens.weight"], head, recipe, int4)
