"""Build the GPT-2 decoder as one ONNX graph that serves both the prompt step and every decode step.

The ONNX contract (names as optimum and onnxruntime-genai use them; B batch, T new tokens, P past tokens,
H heads, D head size, V vocabulary, K kept logits positions):

    inputs   input_ids                      int64 [B, T]
             attention_mask                 int64 [B, P + T]   1 = real token, 0 = padding
             position_ids                   int64 [B, T]
             past_key_values.{i}.key/value  float [B, H, P, D]  P = 0 on the first step
             logits_to_keep                 int64 scalar, default 0 (an overridable initializer):
                                            K = the last logits_to_keep positions, 0 keeps all T
    outputs  logits                         float [B, K, V]
             present.{i}.key/value          float [B, H, P + T, D]

The tied embedding / LM-head matrix is stored once, as [C, V] (the LM head's layout): the embedding
lookup gathers its columns. The LM head runs only on the kept positions, so a 512-token prompt costs
one row of V logits when the caller asks for one.
"""

import numpy as np

from edgelm.runtime.architecture import Architecture

from .onnx_builder import FLOAT, INT64, MS_DOMAIN, GraphBuilder
from .quantize import quantize_int8

OPSET = 17
FLOAT_MIN = float(np.finfo(np.float32).min)


def build_decoder(arch: Architecture, weights: dict[str, np.ndarray], recipe: str = "none"):
    """weights: a GPT-2 state dict as NumPy arrays (HF names). Returns an onnx.ModelProto."""
    g = GraphBuilder("edgelm_gpt2_decoder")
    H, D, C = arch.n_head, arch.head_size, arch.n_embd
    input_ids = g.input("input_ids", INT64, ["batch", "sequence"])
    attention_mask = g.input("attention_mask", INT64, ["batch", "total_sequence"])
    position_ids = g.input("position_ids", INT64, ["batch", "sequence"])
    past = []
    for i in range(arch.n_layer):
        shape = ["batch", H, "past_sequence", D]
        past.append((g.input(f"past_key_values.{i}.key", FLOAT, shape), g.input(f"past_key_values.{i}.value", FLOAT, shape)))
    logits_to_keep = g.input("logits_to_keep", INT64, [])
    g.weight("logits_to_keep", np.array(0, dtype=np.int64))  # default: every position

    linear = _int8_linear if recipe == "int8" else _float_linear
    mask = _attention_mask(g, input_ids, attention_mask)  # bool [B, 1, T, P + T]
    embed, lm_head = _tied_embedding(g, weights, recipe)
    x = g.op("Add", [embed(input_ids), g.op("Gather", [g.weight("wpe", weights["transformer.wpe.weight"]), position_ids])])

    for i in range(arch.n_layer):
        p = f"transformer.h.{i}."
        h = _layer_norm(g, x, weights, p + "ln_1", arch)
        qkv = linear(g, h, weights, p + "attn.c_attn")  # [B, T, 3C]
        q, k, v = g.op("Split", [qkv, g.const([C, C, C])], outputs=3, axis=2)
        q, k, v = (g.op("Transpose", [g.op("Reshape", [t, g.const([0, 0, H, D])])], perm=[0, 2, 1, 3]) for t in (q, k, v))
        present_key = g.op("Concat", [past[i][0], k], outputs=[f"present.{i}.key"], axis=2)  # [B, H, P+T, D]
        present_value = g.op("Concat", [past[i][1], v], outputs=[f"present.{i}.value"], axis=2)
        scores = g.op("MatMul", [q, g.op("Transpose", [present_key], perm=[0, 1, 3, 2])])  # [B, H, T, P+T]
        scores = g.op("Div", [scores, g.const(np.sqrt(D), np.float32)])
        probs = g.op("Softmax", [g.op("Where", [mask, scores, g.const(FLOAT_MIN, np.float32)])], axis=-1)
        attn = g.op("Transpose", [g.op("MatMul", [probs, present_value])], perm=[0, 2, 1, 3])  # [B, T, H, D]
        attn = g.op("Reshape", [attn, g.const([0, 0, C])])
        x = g.op("Add", [x, linear(g, attn, weights, p + "attn.c_proj")])
        h = _layer_norm(g, x, weights, p + "ln_2", arch)
        h = _gelu_new(g, linear(g, h, weights, p + "mlp.c_fc"))
        x = g.op("Add", [x, linear(g, h, weights, p + "mlp.c_proj")])

    # Keep only the positions the caller wants logits for, before the final norm and the LM head.
    keep = g.op("Reshape", [logits_to_keep, g.const([1])])
    start = g.op("Where", [g.op("Greater", [keep, g.const([0])]), g.op("Neg", [keep]), g.const([0])])
    x = g.op("Slice", [x, start, g.const([np.iinfo(np.int64).max]), g.const([1])])
    x = _layer_norm(g, x, weights, "transformer.ln_f", arch)
    lm_head(x, "logits")

    g.output("logits", FLOAT, ["batch", "kept_sequence", arch.vocab_size])
    for i in range(arch.n_layer):
        for kind in ("key", "value"):
            g.output(f"present.{i}.{kind}", FLOAT, ["batch", H, "total_sequence", D])
    return g.model(OPSET, doc=f"GPT-2 decoder with KV cache, weights: {recipe}")


def _attention_mask(g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
    """Causal and padding mask together: bool [B, 1, T, P + T], True where a query may attend."""
    new = g.op("Gather", [g.op("Shape", [input_ids]), g.const(1)])  # T
    total = g.op("Gather", [g.op("Shape", [attention_mask]), g.const(1)])  # P + T
    query_pos = g.op("Range", [g.op("Sub", [total, new]), total, g.const(1)])  # [T] absolute positions
    key_pos = g.op("Range", [g.const(0), total, g.const(1)])  # [P + T]
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [key_pos, g.const([0])]), g.op("Unsqueeze", [query_pos, g.const([1])])])
    padding = g.op("Unsqueeze", [g.op("Cast", [attention_mask], to=9), g.const([1, 2])])  # [B, 1, 1, P + T]
    return g.op("And", [causal, padding])


def _layer_norm(g, x, weights, prefix, arch):
    return g.op(
        "LayerNormalization",
        [x, g.weight(prefix + ".weight", weights[prefix + ".weight"]), g.weight(prefix + ".bias", weights[prefix + ".bias"])],
        axis=-1,
        epsilon=arch.layer_norm_epsilon,
    )


def _gelu_new(g, x):
    """GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715, np.float32)])]), g.const(np.sqrt(2.0 / np.pi), np.float32)])
    return g.op("Mul", [g.op("Mul", [x, g.const(0.5, np.float32)]), g.op("Add", [g.op("Tanh", [inner]), g.const(1.0, np.float32)])])


def _float_linear(g, x, weights, prefix):
    """x @ W + b with GPT-2's Conv1D layout W [in, out]."""
    y = g.op("MatMul", [x, g.weight(prefix + ".weight", weights[prefix + ".weight"])])
    return g.op("Add", [y, g.weight(prefix + ".bias", weights[prefix + ".bias"])])


def _int8_linear(g, x, weights, prefix):
    """The same product with int8 weights; activations are quantized on the fly by onnxruntime."""
    w = quantize_int8(weights[prefix + ".weight"])
    inputs = [
        x,
        g.weight(prefix + ".weight_int8", w.q),
        g.weight(prefix + ".weight_scale", w.scale),
        g.weight(prefix + ".weight_zero_point", np.zeros_like(w.scale, dtype=np.int8)),
        g.weight(prefix + ".bias", weights[prefix + ".bias"]),
    ]
    return g.op("DynamicQuantizeMatMul", inputs, domain=MS_DOMAIN)


def _tied_embedding(g, weights, recipe):
    """Returns (embed(ids) -> [B, T, C], lm_head(x, out_name) -> [B, K, V]) sharing one stored matrix."""
    wte_t = np.ascontiguousarray(weights["transformer.wte.weight"].T)  # [C, V]
    if recipe == "none":
        table = g.weight("lm_head.weight_t", wte_t)

        def embed(ids):
            return g.op("Transpose", [g.op("Gather", [table, ids], axis=1)], perm=[1, 2, 0])  # [C,B,T] -> [B,T,C]

        def lm_head(x, out):
            return g.op("MatMul", [x, table], outputs=[out])

        return embed, lm_head

    w = quantize_int8(wte_t)  # one scale per vocabulary entry: the same for its embedding row and logit column
    table = g.weight("lm_head.weight_int8", w.q)
    scale = g.weight("lm_head.weight_scale", w.scale)
    zero_point = g.weight("lm_head.weight_zero_point", np.zeros_like(w.scale, dtype=np.int8))

    def embed(ids):
        columns = g.op("Cast", [g.op("Gather", [table, ids], axis=1)], to=FLOAT)  # [C, B, T]
        rows = g.op("Transpose", [columns], perm=[1, 2, 0])  # [B, T, C]
        return g.op("Mul", [rows, g.op("Unsqueeze", [g.op("Gather", [scale, ids]), g.const([-1])])])

    def lm_head(x, out):
        return g.op("DynamicQuantizeMatMul", [x, table, scale, zero_point], outputs=[out], domain=MS_DOMAIN)

    return embed, lm_head
