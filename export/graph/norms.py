"""The normalizations, each [B, T, C] -> [B, T, C] with the epsilon of arch: GPT-2's LayerNorm and the Llama
family's RMSNorm, each also as onnxruntime's fused op that adds the residual first and returns the new residual."""

import numpy as np

from .builder import MS_DOMAIN


def layer_norm(g, x, weights, prefix, arch):
    """LayerNorm(x) with weights[prefix + ".weight"] and [".bias"]."""
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


def skip_layer_norm(g, x, residual, weights, prefix, bias_name, arch):
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


def rms_norm(g, x, weights, name, arch):
    """x / sqrt(mean(x^2) + eps) * weight, in plain ops (onnxruntime fuses them into SimplifiedLayerNormalization,
    which is not an op onnx's checker knows)."""
    variance = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0, np.float32)])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [variance, g.const(arch.layer_norm_epsilon, np.float32)])])])
    return g.op("Mul", [normed, g.weight(name, weights[name])])


def skip_rms_norm(g, x, residual, weights, name, bias_name, arch):
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
