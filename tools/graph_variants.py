"""Rewrite an exported package's graph into a variant the exporter does not make, to measure what it would change.

    python tools/graph_variants.py PKG OUT --variant kv-float16
    python benchmarks/package_ab.py PKG OUT            # then: decode and first token, side by side
    python benchmarks/rss_stages.py OUT                # peak memory

Variants (Llama-family graphs: RotaryEmbedding before each GroupQueryAttention):
- kv-float16: the key/value cache in float16. GroupQueryAttention takes float16 query, key, value and attention
  bias (Cast before it) and gives float16 attention (Cast back to float32); the packed Q/K/V is cast once,
  and the rotary tables with it.
- int8-nbits: every DynamicQuantizeMatMul of an int8 package as MatMulNBits with 8-bit weights in blocks of
  --block inputs (accuracy_level 4: int8 activations), requantized from the package's own int8 weights. The new
  weights go to variant.data; the LM head and the token lookup keep theirs.
- block-sums-reducesum: for a package of an older release, which has sampling outputs (docs/package-format.md):
  their block sums as a ReduceSum over each block instead of an Einsum (onnxruntime 1.22.0 cannot run a
  ReduceSum over zero rows).
- rotary-in-attention: GroupQueryAttention rotates Q and K itself (do_rotary, packed Q/K/V, the package's tables
  and position ids): 3 nodes fewer a layer. Batch 1 is exact; onnxruntime's CPU kernel gives a left-padded
  batch's prompt the wrong positions, which is why the exporter does not do this.

OUT is a measuring copy, not a package to ship: its manifest records the new files' checksums, nothing else.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from edgelm.runtime.package.open import file_record
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def kv_float16(graph):
    for value in list(graph.input) + list(graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    rotated = {node.input[0] for node in graph.node if node.op_type == "RotaryEmbedding"}
    nodes, cast = [], {}
    # the mask's large negative bias, brought into float16's range: cast as it is, it becomes -inf, a fully
    # masked (padding) query row's softmax NaN, and the cache rows it writes NaN for every later query
    lowest = numpy_helper.from_array(np.array(np.finfo(np.float16).min, dtype=np.float32), "float16_lowest")

    def half(name, clip=False):  # one Cast per tensor, however many nodes read it
        if name not in cast:
            cast[name] = name + ".f16"
            if clip:
                nodes.append(helper.make_node("Max", [name, lowest.name], [name + ".in_range"]))
            source = name + ".in_range" if clip else name
            nodes.append(helper.make_node("Cast", [source], [cast[name]], to=TensorProto.FLOAT16))
        return cast[name]

    for node in graph.node:
        if node.op_type == "Split" and rotated & set(node.output):  # the packed Q/K/V
            node.input[0] = half(node.input[0])
        if node.op_type == "RotaryEmbedding":
            node.input[2], node.input[3] = half(node.input[2]), half(node.input[3])
        if node.op_type == "GroupQueryAttention":
            if len(node.input) > 10 and node.input[10]:
                node.input[10] = half(node.input[10], clip=True)
            out = node.output[0]
            node.output[0] = out + ".f16"
            nodes += [node, helper.make_node("Cast", [out + ".f16"], [out], to=TensorProto.FLOAT)]
            continue
        nodes.append(node)
    return nodes, [lowest]


def int8_nbits(graph, data, block):
    initializers = {t.name: t for t in graph.initializer}

    def array(name):
        tensor = initializers[name]
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        where = {e.key: e.value for e in tensor.external_data}
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(where["length"]) // np.dtype(dtype).itemsize
        return np.frombuffer(data, dtype, count, int(where["offset"])).reshape(tensor.dims)

    nodes, added, chunks, offset = [], [], [], 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeMatMul":
            nodes.append(node)
            continue
        weight = array(node.input[1]).astype(np.float32) * array(node.input[2]).astype(np.float32)  # [K, N]
        k, n = weight.shape
        blocks = weight.T.reshape(n, k // block, block)
        scale = np.abs(blocks).max(axis=-1) / 127
        scale[scale == 0] = 1
        q = (np.clip(np.rint(blocks / scale[..., None]), -128, 127) + 128).astype(np.uint8)
        names = []
        for suffix, values in (("nbits", q), ("nbits_scale", scale.astype(np.float32).reshape(-1))):
            tensor = numpy_helper.from_array(np.ascontiguousarray(values), f"{node.input[1]}.{suffix}")
            raw = tensor.raw_data
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", "variant.data"), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            chunks.append(raw + b"\0" * (-len(raw) % 64))
            offset += len(chunks[-1])
            added.append(tensor)
            names.append(tensor.name)
        inputs = [node.input[0], *names] + (["", "", node.input[4]] if len(node.input) > 4 and node.input[4] else [])
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                inputs,
                list(node.output),
                domain=MS,
                K=k,
                N=n,
                bits=8,
                block_size=block,
                accuracy_level=4,
            )
        )
    return nodes, added, b"".join(chunks)


def block_sums_reducesum(graph):
    """Einsum(blocks, "rokb->rok") -> sampling_block_sums, as ReduceSum(blocks, -1, keepdims=0)."""
    einsum = next(node for node in graph.node if "sampling_block_sums" in node.output)
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "block_sums_axes")
    reduce = helper.make_node("ReduceSum", [einsum.input[0], axes.name], ["sampling_block_sums"], keepdims=0)
    return [n for n in graph.node if n is not einsum] + [reduce], [axes]


def rotary_in_attention(graph):
    producer = {out: node for node in graph.node for out in node.output}
    dropped = set()
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        rotary_q, rotary_k = producer[node.input[0]], producer[node.input[1]]
        split = producer[rotary_q.input[0]]
        inputs = list(node.input) + [""] * (11 - len(node.input))
        inputs[:3] = [split.input[0], "", ""]
        inputs[7:10] = [rotary_q.input[2], rotary_q.input[3], rotary_q.input[1]]  # cos, sin, position ids
        del node.input[:]
        node.input.extend(inputs)
        node.attribute.append(helper.make_attribute("do_rotary", 1))
        dropped |= {id(rotary_q), id(rotary_k), id(split)}
    return [n for n in graph.node if id(n) not in dropped], []


def in_order(graph, nodes):
    """The nodes sorted so each comes after what it reads (the rewrites append Casts out of place)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ordered, waiting = [], nodes
    while waiting:
        left = [n for n in waiting if not all(i in ready for i in n.input)]
        for node in waiting:
            if node not in left:
                ordered.append(node)
                ready |= set(node.output)
        if len(left) == len(waiting):
            raise SystemExit("the rewritten graph has a node whose inputs nothing makes")
        waiting = left
    return ordered


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--variant", choices=("kv-float16", "int8-nbits", "rotary-in-attention", "block-sums-reducesum"), required=True
    )
    parser.add_argument("--block", type=int, default=64, help="int8-nbits: inputs per scale")
    args = parser.parse_args()
    model = onnx.load(str(args.package / "model.onnx"), load_external_data=False)
    graph = model.graph
    ops = {node.op_type for node in graph.node}
    needs = {"kv-float16": "RotaryEmbedding", "rotary-in-attention": "RotaryEmbedding"}.get(args.variant)
    if needs and needs not in ops or args.variant == "int8-nbits" and "DynamicQuantizeMatMul" not in ops:
        raise SystemExit(
            f"{args.package} is not a graph {args.variant} applies to (a Llama-family package; int8 for int8-nbits)"
        )
    if args.variant == "kv-float16":
        nodes, added = kv_float16(graph)
    elif args.variant == "int8-nbits":
        nodes, added, extra = int8_nbits(graph, (args.package / "model.onnx.data").read_bytes(), args.block)
    elif args.variant == "block-sums-reducesum":
        nodes, added = block_sums_reducesum(graph)
    else:
        nodes, added = rotary_in_attention(graph)
    shutil.copytree(args.package, args.out)
    if args.variant == "int8-nbits":
        (args.out / "variant.data").write_bytes(extra)
    graph.initializer.extend(added)
    del graph.value_info[:]  # the export's inferred types: some no longer hold
    del graph.node[:]
    graph.node.extend(in_order(graph, nodes))
    read = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in read or t.name in {i.name for i in graph.input}]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.save(model, str(args.out / "model.onnx"))
    manifest = json.loads((args.out / "manifest.json").read_text())
    for name in ("model.onnx", "variant.data"):
        if (args.out / name).exists():
            manifest["files"][name] = file_record(args.out / name)
    if args.variant == "kv-float16":
        for side in ("inputs", "outputs"):
            for name, tensor in manifest["graph"][side].items():
                if name.startswith(("past_key_values.", "present.")):
                    tensor["dtype"] = "float16"
        manifest["graph"]["kv_cache"] = {"dtype": "float16"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{args.out}: {len(graph.node)} nodes")


if __name__ == "__main__":
    main()
