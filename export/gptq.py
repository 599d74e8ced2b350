"""GPTQ for the int4 recipe (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"): the weights are rounded one input column at a time, and each column's rounding error
is spread over the columns not yet rounded, weighted by the inverse Hessian H = 2 X^T X of that product's input
activations X on calibration text.

The Hessians come from the float32 graph itself (every family's: each MatMul whose weight is named `*.weight`),
run over export/calibrate.py's calibration rows (its prose-and-code text and rows of random tokens), never the
evaluation text the quality figures are measured on.

Why not onnxruntime's own `gptq` (onnxruntime.quantization.neural_compressor.weight_only): it returns the
rounded weights as floats, and its caller derives each block's scale again from their min and max, which
rounds a block whose extreme codes are unused a second time, onto another grid. Here each block's scale is
chosen once, by the clip search (export/rounding.py) on the updated weights when the block's first column comes up,
and the codes are kept as they were rounded.
"""

from dataclasses import replace

import numpy as np
from edgelm.runtime.package.format import ATTENTION_MASK, INPUT_IDS, PAST, POSITION_IDS

from .rounding import clip, symmetric_codes

DAMPING = 0.01  # of the Hessian's mean diagonal, added to it: keeps the inverse stable (the paper's lambda)
LAZY_COLUMNS = 128  # columns rounded before the rest of the matrix is updated (the paper's lazy batch)


def gptq(blocks: np.ndarray, hessian: np.ndarray | None, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, nb, B] float32 blocks (a [N, K] weight padded to nb * B inputs) and the [K, K] Hessian of its inputs
    -> (codes uint8 [N, nb, B], scale float32 [N, nb]), symmetric (zero point 2^(bits-1))."""
    n, nb, b = blocks.shape
    k = nb * b
    if hessian is None:
        raise ValueError("gptq needs the Hessian of the product's inputs (calibration_hessians)")
    w = blocks.reshape(n, k).astype(np.float64)  # a copy, updated in place as columns are rounded
    h = np.zeros((k, k))
    h[: len(hessian), : len(hessian)] = hessian
    dead = np.diag(h) == 0  # padding, or an input the calibration never moved: any value is as good
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h[np.diag_indices(k)] += DAMPING * np.mean(np.diag(h))
    h_inv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: row i holds what column i's error does to those after
    half = 2 ** (bits - 1)
    codes = np.empty((n, k), np.uint8)
    scale = np.empty((n, nb), np.float32)
    lazy = max(LAZY_COLUMNS // b, 1) * b  # whole blocks per lazy batch
    for start in range(0, k, lazy):
        end = min(start + lazy, k)
        part, errors = w[:, start:end], np.zeros((n, end - start))
        for i in range(end - start):
            column = start + i
            if column % b == 0:  # the block's scale, from its weights as they stand now
                scale[:, column // b] = clip(part[:, i : i + b].astype(np.float32), bits)[1]
            s = scale[:, column // b]
            codes[:, column] = symmetric_codes(part[:, i : i + 1], s, bits)[:, 0]
            error = (part[:, i] - (codes[:, column].astype(np.float64) - half) * s) / h_inv[column, column]
            part[:, i:] -= np.outer(error, h_inv[column, column:end])
            errors[:, i] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    return codes.reshape(n, nb, b), scale


def calibration_hessians(graph, rows: list, arch) -> dict:
    """graph: the float32 ShippedGraph (export/weights_file.py); rows: token id lists. -> {weight name: [K, K]
    float64 2 X^T X / tokens} for every MatMul of the graph whose weight is named `*.weight` (the block products)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load_model_from_string(graph.graph)
    readers = {}  # activation name -> the weights multiplying it
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1].endswith(".weight"):
            readers.setdefault(node.input[0], []).append(node.input[1])
    for name in readers:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_external_initializers(
        list(graph.weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in graph.weights.values()]
    )
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    past = np.zeros((1, arch.kv_heads, 0, arch.head_size), np.float32)
    sums, tokens = {}, 0
    activations = list(readers)
    for row in rows:
        ids = np.asarray(row, dtype=np.int64)[None]
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids), POSITION_IDS: np.arange(ids.shape[1])[None]}
        feeds |= {i.name: past for i in session.get_inputs() if i.name.startswith(PAST)}
        for name, x in zip(activations, session.run(activations, feeds)):
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)  # [T, K]
            sums[name] = sums.get(name, 0.0) + x.T @ x
        tokens += ids.shape[1]
    return {weight: 2 * sums[name] / tokens for name, weights in readers.items() for weight in weights}


def with_hessians(int4, fp32_graph, tokenizer, arch):
    """The int4 options (an Int4Options, export/int4.py) with gptq's Hessians of every block product's inputs,
    from the float32 graph on the calibration rows (export/calibrate.py)."""
    from .calibrate import calibration_rows

    return replace(int4, hessians=calibration_hessians(fp32_graph, calibration_rows(tokenizer, arch), arch))
