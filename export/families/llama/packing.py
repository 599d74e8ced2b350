"""The Llama family's block weights as the graph multiplies them: [in, out], the projections that read the same
input side by side in one matrix (Q/K/V, gate/up), so each is one product (one activation quantization for int8)."""

import numpy as np
from edgelm.runtime.package.format import Architecture

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
    loader read straight into their packed matrix (weights.read_weights) give that matrix, not a copy."""
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
