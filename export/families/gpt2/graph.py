"""Build the GPT-2 decoder as one ONNX graph that serves both the prompt step and every decode step, from the
graph kit (export/graph/). The graph contract is written once, in docs/package-format.md."""

from functools import partial

import numpy as np
from edgelm.runtime.package.format import LOGITS, WEIGHTS_FILE, Architecture

from ...graph.attention import attention_bias, cache_lengths, group_query_attention
from ...graph.builder import FLOAT, INT8, GraphBuilder
from ...graph.contract import OPSET, Decoder, declare_outputs, decoder_inputs, kept_positions
from ...graph.embeddings import EMBEDDINGS_OUTSIDE, embedding_and_head
from ...graph.matmuls import MATMULS
from ...graph.norms import layer_norm, skip_layer_norm
from ...int4 import Int4Options
from .activations import mlp_activation


def build_decoder(
    arch: Architecture,
    weights: dict[str, np.ndarray],
    recipe: str = "none",
    cache_scales: dict | None = None,
    int4: Int4Options | None = None,
) -> Decoder:
    """weights: a GPT-2 state dict as NumPy arrays (HF names). cache_scales, for an int8 cache: layer ->
    (key scale, value scale), each float32 [H, D] (families/gpt2/reference.py)."""
    g = GraphBuilder("edgelm_gpt2_decoder", WEIGHTS_FILE)
    H = arch.n_head
    cache_type = INT8 if cache_scales else FLOAT
    tokens, attention_mask, position_ids, past, logits_to_keep = decoder_inputs(
        g, arch, H, cache_type, inputs_embeds=recipe in EMBEDDINGS_OUTSIDE
    )

    matmul = partial(MATMULS[recipe], int4=int4)  # int4: the int4 recipe's options (export/int4.py)
    bias = lambda name: g.weight(name, weights[name])  # noqa: E731
    mask_bias = attention_bias(g, tokens, attention_mask)  # float [B, 1, T, P + T]: 0 or -large
    seqlens_k, total_length = cache_lengths(g, tokens, attention_mask)
    head = None if arch.tie_word_embeddings else weights["lm_head.weight"]
    embed, lm_head = embedding_and_head(g, weights["transformer.wte.weight"], head, recipe, int4)
    x = g.op("Add", [embed(tokens), g.op("Gather", [g.weight("wpe", weights["transformer.wpe.weight"]), position_ids])])
    h = layer_norm(g, x, weights, "transformer.h.0.ln_1", arch)

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
            (seqlens_k, total_length, mask_bias),
            cache_scales and (cache_scales[i], f"{p}attn."),
            H,
            H,
            scale=arch.attention_scale(i),  # GPT-2's scale rule (scale_attn_weights, ..._by_inverse_layer_idx)
        )
        out = matmul(g, attn, weights, p + "attn.c_proj")
        h, x = skip_layer_norm(g, out, x, weights, p + "ln_2", p + "attn.c_proj.bias", arch)  # x += out + bias
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
            h, x = skip_layer_norm(g, m, x, weights, f"transformer.h.{i + 1}.ln_1", p + "mlp.c_proj.bias", arch)

    # Keep only the positions the caller wants logits for, then the last residual add, final norm, LM head.
    kept = kept_positions(g, logits_to_keep, (m, x))
    h, _ = skip_layer_norm(g, *kept, weights, "transformer.ln_f", p + "mlp.c_proj.bias", arch)
    lm_head(h, LOGITS)
    declare_outputs(g, arch, cache_type, H)
    doc = f"GPT-2 decoder with KV cache ({'int8' if cache_scales else 'float32'}), weights: {recipe}"
    return Decoder(g.model(OPSET, doc=doc), g.arrays)
