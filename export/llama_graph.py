"""Build the Llama-family decoder (Llama, Qwen2) as one ONNX graph for the prompt step and every decode step.

The same contract as GPT-2's (models/README.md, "Llama and Qwen2"): the same inputs and outputs, the cache
[B, kv_heads, P, D] with one head per key/value head. Per block: RMSNorm, Q/K/V from one packed product (plus
Qwen2's biases), rotary embeddings on Q and K, grouped-query attention, RMSNorm with the residual add, and a
SwiGLU MLP (gate and up from one packed product).

Why rotary outside GroupQueryAttention: its own rotary (do_rotary) takes each row's positions from
seqlens_k, but the runtime left-pads a batch and every row holds P + T cache positions (graph._cache_lengths),
so a padded row's positions would be off by its padding. com.microsoft RotaryEmbedding reads the position_ids
input instead, which counts real tokens only (transformers' rule), from cos/sin tables baked here.
"""

import math

import numpy as np
from edgelm.runtime.package.format import WEIGHTS_FILE, Architecture

from . import graph as gpt2
from .graph import EMBEDDINGS_OUTSIDE, OPSET, Decoder
from .onnx_builder import FLOAT, INT8, INT64, MS_DOMAIN, GraphBuilder
from .quantize import quantize_int8

ROPE_TYPES = ("default", "llama3")  # rope_scaling types baked at export; others change with the sequence length


def build_decoder(
    arch: Architecture, weights: dict[str, np.ndarray], recipe: str = "none", cache_scales: dict | None = None
) -> Decoder:
    """weights: a LlamaForCausalLM / Qwen2ForCausalLM state dict as NumPy arrays (HF names, torch Linear's
    [out, in] layout). cache_scales, for an int8 cache: layer -> (key scale, value scale), float32
    [kv_heads, head_size] each. Returns a Decoder: the graph and its external arrays (export/graph.py)."""
    g = GraphBuilder(f"edgelm_{arch.model_type}_decoder", WEIGHTS_FILE)
    H, KV, D, C = arch.n_head, arch.kv_heads, arch.head_size, arch.n_embd
    cache_type = INT8 if cache_scales else FLOAT
    if (
        recipe in EMBEDDINGS_OUTSIDE and arch.tie_word_embeddings
    ):  # the runtime looks tokens up (runtime/engine/embeddings.py)
        tokens = g.input("inputs_embeds", FLOAT, ["batch", "sequence", C])
    else:
        tokens = g.input("input_ids", INT64, ["batch", "sequence"])
    attention_mask = g.input("attention_mask", INT64, ["batch", "total_sequence"])
    position_ids = g.input("position_ids", INT64, ["batch", "sequence"])
    shape = ["batch", KV, "past_sequence", D]
    past = [
        (
            g.input(f"past_key_values.{i}.key", cache_type, shape),
            g.input(f"past_key_values.{i}.value", cache_type, shape),
        )
        for i in range(arch.n_layer)
    ]
    logits_to_keep = g.input("logits_to_keep", INT64, [])
    g.weight("logits_to_keep", np.array(0, dtype=np.int64))  # default: every position

    packed = pack_weights(arch, weights)  # GPT-2's [in, out] layout, Q/K/V and gate/up packed
    matmul = {"none": gpt2._float_matmul, "int8": gpt2._int8_matmul, "int4": gpt2._int4_matmul}[recipe]
    attention_bias = gpt2._attention_bias(g, tokens, attention_mask)  # float [B, 1, T, P + T]: 0 or -large
    seqlens_k, total_length = gpt2._cache_lengths(g, tokens, attention_mask)
    cos, sin = (g.weight(name, table) for name, table in zip(("rope.cos_cache", "rope.sin_cache"), rope_tables(arch)))
    embed, lm_head = _embedding_and_head(g, weights, recipe, arch)
    x = embed(tokens)
    h = _rms_norm(g, x, packed, "model.layers.0.input_layernorm.weight", arch)

    def linear(x, name):
        y = matmul(g, x, packed, name)
        return g.op("Add", [y, g.weight(name + ".bias", packed[name + ".bias"])]) if name + ".bias" in packed else y

    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        q, k, v = g.op(
            "Split", [linear(h, p + "self_attn.qkv_proj"), g.const([H * D, KV * D, KV * D])], outputs=3, axis=-1
        )
        q, k = (g.op("RotaryEmbedding", [t, position_ids, cos, sin], domain=MS_DOMAIN) for t in (q, k))
        lengths = (seqlens_k, total_length, attention_bias)
        cache = cache_scales and (cache_scales[i], f"{p}self_attn.")
        attn = gpt2.group_query_attention(g, i, [q, k, v], past[i], lengths, cache, H, KV)
        out = matmul(g, attn, packed, p + "self_attn.o_proj")
        h, x = _skip_rms_norm(
            g, out, x, packed, p + "post_attention_layernorm.weight", p + "self_attn.o_proj.bias", arch
        )
        gate, up = g.op("Split", [linear(h, p + "mlp.gate_up_proj"), g.const([arch.mlp_width] * 2)], outputs=2, axis=-1)
        m = matmul(g, g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up]), packed, p + "mlp.down_proj")
        if i + 1 < arch.n_layer:
            norm = f"model.layers.{i + 1}.input_layernorm.weight"
            h, x = _skip_rms_norm(g, m, x, packed, norm, p + "mlp.down_proj.bias", arch)

    # Keep only the positions the caller wants logits for, then the last residual add, final norm, LM head.
    kept = gpt2.kept_positions(g, logits_to_keep, (m, x))
    h, _ = _skip_rms_norm(g, *kept, packed, "model.norm.weight", p + "mlp.down_proj.bias", arch)
    lm_head(h, "logits")
    gpt2.declare_outputs(g, arch, cache_type, KV)
    doc = f"{arch.model_type} decoder with KV cache ({'int8' if cache_scales else 'float32'}), weights: {recipe}"
    return Decoder(g.model(OPSET, doc=doc), g.arrays)


# The products the graph multiplies by, each from its parts (LlamaForCausalLM's names within a layer), side by side.
PACKED = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
    ("self_attn.o_proj", ("self_attn.o_proj",)),
    ("mlp.down_proj", ("mlp.down_proj",)),
)


def pack_weights(arch: Architecture, weights: dict) -> dict:
    """The block weights as the graph multiplies them: [in, out] (x @ W), Q/K/V side by side in one matrix and
    gate/up in another, so each is one product (one activation quantization for int8). A bias missing from a
    packed part (Qwen2 has none on o_proj; a config may bias some projections only) is zero there. Parts the
    loader read straight into their packed matrix (llama_checkpoint.read_weights) give that matrix, not a copy."""
    packed = {"model.norm.weight": weights["model.norm.weight"]}
    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            packed[p + norm] = weights[p + norm]
        for name, parts in PACKED:
            matrices = [weights[p + part + ".weight"] for part in parts]
            matrix = packed_matrix(matrices)
            if matrix is None:
                matrix = np.ascontiguousarray(np.concatenate(matrices, axis=0).T)
            packed[p + name + ".weight"] = matrix
            if any(p + part + ".bias" in weights for part in parts):
                packed[p + name + ".bias"] = np.concatenate(
                    [weights.get(p + part + ".bias", np.zeros(len(m), np.float32)) for part, m in zip(parts, matrices)]
                )
    return packed


def packed_matrix(matrices: list) -> np.ndarray | None:
    """The C-contiguous [in, sum(out)] array whose column blocks, in order, are the transposes of `matrices`
    ([out, in] each), when they are views of one; else None."""
    first, width = matrices[0], sum(len(m) for m in matrices)
    owner = first
    while isinstance(owner, np.ndarray) and not (
        owner.shape == (first.shape[1], width) and owner.flags.c_contiguous and _address(owner) == _address(first)
    ):
        owner = owner.base
    if not isinstance(owner, np.ndarray):
        return None
    column = 0
    for m in matrices:
        if (
            m.dtype != owner.dtype
            or m.strides != (owner.itemsize, owner.strides[0])
            or _address(m) != _address(owner) + column * owner.itemsize
        ):
            return None
        column += len(m)
    return owner


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def inverse_frequencies(arch: Architecture):
    """The rotary inverse frequencies [D / 2] as transformers computes them (float32, torch), with Llama 3's
    scaling where rope_scaling asks for it: wavelengths longer than the original context are divided by
    `factor`, short ones kept, the band between blended smoothly."""
    import torch

    D = arch.head_size
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).to(dtype=torch.float) / D))
    scaling = arch.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type", "default")) != "llama3":
        return inv_freq
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old_context = scaling["original_max_position_embeddings"]
    low_wavelength, high_wavelength = old_context / low, old_context / high
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled)


def rope_tables(arch: Architecture) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position x inverse frequency, float32 [n_positions, D / 2], computed as transformers does
    at run time (a float32 product, then float32 cos and sin), so the baked tables match it bit for bit."""
    import torch

    angles = torch.arange(arch.n_positions, dtype=torch.float32)[:, None] * inverse_frequencies(arch)[None, :]
    return angles.cos().numpy(), angles.sin().numpy()


def _rms_norm(g, x, weights, name, arch):
    """x / sqrt(mean(x^2) + eps) * weight, in plain ops (onnxruntime fuses them into SimplifiedLayerNormalization,
    which is not an op onnx's checker knows)."""
    variance = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0, np.float32)])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [variance, g.const(arch.layer_norm_epsilon, np.float32)])])])
    return g.op("Mul", [normed, g.weight(name, weights[name])])


def _skip_rms_norm(g, x, residual, weights, name, bias_name, arch):
    """RMSNorm(residual + x [+ bias]) and the new residual, in one op."""
    inputs = [x, residual, g.weight(name, weights[name])]
    if bias_name in weights:
        inputs.append(g.weight(bias_name, weights[bias_name]))
    outputs = g.op(
        "SkipSimplifiedLayerNormalization",
        inputs,
        outputs=[g.fresh("normed"), "", "", g.fresh("residual")],
        domain=MS_DOMAIN,
        epsilon=arch.layer_norm_epsilon,
    )
    return outputs[0], outputs[3]


def _embedding_and_head(g, weights, recipe, arch):
    """(embed(tokens) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]): GPT-2's (graph._embedding) for a tied
    head, where one stored matrix serves both (for int8 the runtime reads the token rows), and for an untied one
    in float32 and int4. An untied int8 head keeps two matrices, and the graph looks tokens up itself
    (input_ids): its table serves no product, so a row Gather reads it in 8 bits."""
    table = weights["model.embed_tokens.weight"]  # [V, C]
    tied = arch.tie_word_embeddings
    if tied or recipe != "int8":
        named = {"transformer.wte.weight": table} | ({} if tied else {"lm_head.weight": weights["lm_head.weight"]})
        return gpt2._embedding(g, named, recipe, tied=tied)
    # A row Gather reads the embedding: this table serves nothing else, so onnxruntime keeps it mapped once.
    w = quantize_int8(np.ascontiguousarray(table.T), reduce_range=False)  # no product reads it: 8 bits
    rows = g.weight("model.embed_tokens.weight_int8", np.ascontiguousarray(w.q.T))  # [V, C]
    row_scale = g.weight("model.embed_tokens.weight_scale", w.scale[:, None])  # [V, 1]

    def embed(ids):
        return g.op("Mul", [g.op("Cast", [g.op("Gather", [rows, ids])], to=FLOAT), g.op("Gather", [row_scale, ids])])

    head_w = quantize_int8(np.ascontiguousarray(weights["lm_head.weight"].T))  # [C, V], one scale per entry

    def lm_head(x, out):
        inputs = [x, g.weight("lm_head.weight_int8", head_w.q), g.weight("lm_head.weight_scale", head_w.scale)]
        inputs.append(g.weight("lm_head.weight_zero_point", np.zeros_like(head_w.scale, dtype=np.int8)))
        return g.op("DynamicQuantizeMatMul", inputs, outputs=[out], domain=MS_DOMAIN)

    return embed, lm_head
