"""Is a lower-precision KV cache worth it? GroupQueryAttention alone, float32 against int8 cache.

    python benchmarks/gqa_cache.py [--threads 2]

One GroupQueryAttention node of distilgpt2's shape (12 heads of 64), run as the runtime runs it: the cache
buffer fed as past and fetched as present (in place), with the additive attention bias, once per layer over
six separate buffers (so the cache is read from memory, as in the model). int8 uses onnxruntime's quantized
cache (kv_cache_bit_width 8, per-channel scales, fixed at export). Medians of one decode step's six layers.
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

H, D, LAYERS, STEPS = 12, 64, 6, 60
HOST = ort_c.OrtDevice(ort_c.OrtDevice.cpu(), ort_c.OrtDevice.default_memory(), 0)


def attention(int8_cache: bool, threads: int) -> ort.InferenceSession:
    cache_type = TensorProto.INT8 if int8_cache else TensorProto.FLOAT
    inputs = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total", "", "", "", "bias"]
    attributes, scales = {"num_heads": H, "kv_num_heads": H}, []
    if int8_cache:
        inputs += ["", "k_scale", "v_scale"]
        attributes.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
        scales = [
            numpy_helper.from_array(np.full((H, 1, D), 0.03, np.float32), name) for name in ("k_scale", "v_scale")
        ]
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["out", "present_key", "present_value"], domain="com.microsoft", **attributes
    )
    graph = helper.make_graph(
        [node],
        "gqa",
        [
            helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["B", "T", 3 * H * D]),
            helper.make_tensor_value_info("past_key", cache_type, ["B", H, "C", D]),
            helper.make_tensor_value_info("past_value", cache_type, ["B", H, "C", D]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["B", 1, "T", "S"]),
        ],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (("out", TensorProto.FLOAT), ("present_key", cache_type), ("present_value", cache_type))
        ],
        scales,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def step_ms(session, batch: int, past: int, int8_cache: bool) -> float:
    capacity = past + STEPS + 1
    dtype = np.int8 if int8_cache else np.float32
    buffers = [[np.zeros((batch, H, capacity, D), dtype) for _ in range(2)] for _ in range(LAYERS)]
    caches = [[ort_c.OrtValue.ortvalue_from_numpy(b, HOST) for b in pair] for pair in buffers]
    out = np.zeros((batch, 1, H * D), np.float32)
    out_value = ort_c.OrtValue.ortvalue_from_numpy(out, HOST)
    qkv = np.random.default_rng(0).standard_normal((batch, 1, 3 * H * D), dtype=np.float32)
    times = []
    for step in range(STEPS):
        total = past + step + 1
        arrays = [
            qkv,
            np.full(batch, total - 1, np.int32),
            np.array(total, np.int32),
            np.zeros((batch, 1, 1, total), np.float32),
        ]
        started = time.perf_counter()
        for key, value in caches:
            feeds, fetches = ort_c.OrtValueVector(), ort_c.OrtValueVector()
            for v in (
                ort_c.OrtValue.ortvalue_from_numpy(arrays[0], HOST),
                key,
                value,
                *(ort_c.OrtValue.ortvalue_from_numpy(a, HOST) for a in arrays[1:]),
            ):
                feeds.push_back(v)
            for v in (out_value, key, value):
                fetches.push_back(v)
            session._sess.run_with_ortvaluevector(
                ort_c.RunOptions(),
                ["qkv", "past_key", "past_value", "seqlens_k", "total", "bias"],
                feeds,
                ["out", "present_key", "present_value"],
                fetches,
                [HOST] * 3,
            )
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times[5:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sessions = {False: attention(False, args.threads), True: attention(True, args.threads)}
    print("| batch | cache length | float32 cache, ms per step (6 layers) | int8 cache |")
    print("| --- | --- | --- | --- |")
    for batch, past in ((1, 8), (1, 640), (16, 8), (16, 64)):
        fp32, int8 = (step_ms(sessions[q], batch, past, q) for q in (False, True))
        print(f"| {batch} | {past} | {fp32:.2f} | {int8:.2f} |")


if __name__ == "__main__":
    main()
