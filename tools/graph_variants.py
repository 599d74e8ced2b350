"""Rewrite an exported package's graph into a variant the exporter does not make, to measure what it would change.

    python tools/graph_variants.py PKG OUT --variant kv-float16
    python benchmarks/package_ab.py PKG OUT            # then: decode and first token, side by side
    python benchmarks/rss_stages.py OUT                # peak memory

Variants (Llama-family graphs: RotaryEmbedding before each GroupQueryAttention):
- kv-float16: the key/value cache in float16. GroupQueryAttention takes float16 query, key, value and attention
  bias (Cast before it) and gives float16 attention (Cast back to float32); the packed Q/K/V is cast once,
  and the rotary tables with it.
- int8-nbits: every weight product of an int8 package (its per-row MatMulIntegerToFloat products, or an
  int8-dynamic package's DynamicQuantizeMatMul) as MatMulNBits with 8-bit weights in blocks of --block inputs
  (accuracy_level 4: int8 activations, per row and block), requantized from the package's own int8 weights;
  without --block, the int8 recipe's blocks (64, or 32 where a product's inputs are not a multiple of 64). The
  new weights go to variant.data; the LM head and the token lookup keep theirs.
- block-sums-reducesum: for a package of an older release, which has sampling outputs (docs/package-format.md):
  their block sums as a ReduceSum over each block instead of an Einsum (onnxruntime 1.22.0 cannot run a
  ReduceSum over zero rows).
- rotary-in-attention: GroupQueryAttention rotates Q and K itself (do_rotary, packed Q/K/V, the package's tables
  and position ids): 3 nodes fewer a layer. Batch 1 is exact, and so is a left-padded batch's prompt pass; but
  onnxruntime's CPU kernel (1.32.0) gives a batch of rows decoding over the in-place cache other logits, every row
  (a growing cache is right), which is why the exporter does not do this.
- int8-head-nbits: a tied int8 LM head (QGemm slices over the token rows, each row's activations scaled by its
  largest value) as one MatMulNBits, bits 8, in blocks of --block inputs (default 32), accuracy_level 4. The
  weights are the package's own int8 rows, unchanged (each block keeps its row's scale); the activations are
  quantized per row and block instead of per row. 10-13 nodes fewer; the codes go to variant.data (the token
  rows stay in model.onnx.data for the lookup).
- no-attention-bias: GroupQueryAttention without the attention bias, and the nodes that make it (about a dozen
  small ops a step, not a layer): its own causal mask from the cache lengths is all a row without padding needs.
  Exact for one row; a left-padded batch would attend to its padding, so this measures the bias's cost only.
- custom-int8: every 8-bit MatMulNBits in blocks of 32 without zero points (the tied int8 head first made one, as
  int8-head-nbits does) as edgelm.Q8MatMul over the same inputs: the op of benchmarks/custom_op/'s library, which
  the session must register (benchmarks/step_profile.py PKG::custom_ops=LIB). The int8 recipe's blocks of 64
  are first made blocks of 32 by `--variant nbits --block 32` (variants chain).
- nbits: every MatMulNBits at another --accuracy-level and, for the 8-bit ones, requantized from their own
  codes to blocks of --block inputs (the int8 recipe's block size, measured on its speed alone: requantizing
  int8 codes rounds twice, so its tokens are not the export's at that block).

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


class PackageData:
    """A package's external data files, read when first asked for, and the name of the file a variant adds
    (variant.data, or variant-N.data for a variant of a variant)."""

    def __init__(self, folder: Path):
        self.folder, self.files = folder, {}
        taken = {p.name for p in folder.iterdir()}
        names = ["variant.data", *(f"variant-{n}.data" for n in range(2, 100))]
        self.new_file = next(name for name in names if name not in taken)

    def __getitem__(self, location: str) -> bytes:
        if location not in self.files:
            self.files[location] = (self.folder / Path(location).name).read_bytes()
        return self.files[location]


def reader(graph, data: PackageData):
    """name -> the initializer's array, external ones read from the package's files."""
    initializers = {t.name: t for t in graph.initializer}

    def array(name):
        tensor = initializers[name]
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        where = {e.key: e.value for e in tensor.external_data}
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(where["length"]) // np.dtype(dtype).itemsize
        return np.frombuffer(data[where["location"]], dtype, count, int(where.get("offset", 0))).reshape(tensor.dims)

    return array


class VariantData:
    """New initializers, stored as external data in `location` (64-byte aligned) beside the package's own."""

    def __init__(self, location: str):
        self.location, self.tensors, self.chunks, self.offset = location, [], [], 0

    def add(self, name, values) -> str:
        tensor = numpy_helper.from_array(np.ascontiguousarray(values), name)
        raw = tensor.raw_data
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(self.offset)), ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.chunks.append(raw + b"\0" * (-len(raw) % 64))
        self.offset += len(self.chunks[-1])
        self.tensors.append(tensor)
        return name

    def bytes(self) -> bytes:
        return b"".join(self.chunks)


def int8_products(nodes):
    """Each int8 weight product among `nodes`: (the indices of its nodes, x, output, int8 weight [K, N] name, scale
    [N] name, bias or ""). An int8-dynamic product is one DynamicQuantizeMatMul; an int8 one is the row
    quantization (Abs, ReduceMax, Max, Div, QuantizeLinear), MatMulIntegerToFloat, and the Mul by each row's
    largest value."""
    made = {out: i for i, node in enumerate(nodes) for out in node.output}
    users = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            users.setdefault(name, []).append(i)
    for i, node in enumerate(nodes):
        if node.op_type == "DynamicQuantizeMatMul":
            bias = node.input[4] if len(node.input) > 4 else ""
            yield [i], node.input[0], node.output[0], node.input[1], node.input[2], bias
        elif node.op_type == "MatMulIntegerToFloat":
            chain = [made[node.input[0]]]  # QuantizeLinear, then Div, Max, ReduceMax, Abs
            chain.append(made[nodes[chain[-1]].input[0]])
            x, largest = nodes[chain[-1]].input[:2]
            chain.append(made[largest])
            chain.append(made[nodes[chain[-1]].input[0]])
            chain.append(made[nodes[chain[-1]].input[0]])
            (back,) = (j for j in users[node.output[0]] if nodes[j].op_type == "Mul")
            yield chain + [i, back], x, nodes[back].output[0], node.input[1], node.input[3], ""


def int8_nbits(graph, data, block):
    from edgelm.export.quantize import quantize_int8_blocks

    array, stored = reader(graph, data), VariantData(data.new_file)
    nodes = list(graph.node)
    replaced, made = set(), {}
    for indices, x, out, weight_name, scale_name, bias in int8_products(nodes):
        weight = array(weight_name).astype(np.float32) * array(scale_name).astype(np.float32)  # [K, N]
        k, n = weight.shape
        w = quantize_int8_blocks(np.ascontiguousarray(weight.T), block)  # the int8 recipe's rounding and blocks
        names = [
            stored.add(f"{weight_name}.{suffix}", values)
            for suffix, values in (("nbits", w.packed), ("nbits_scale", w.scale.astype(np.float32)))
        ]
        attributes = dict(K=k, N=n, bits=8, block_size=w.codes.shape[-1], accuracy_level=4)
        inputs = [x, *names] + (["", "", bias] if bias else [])
        name = nodes[indices[-1] if len(indices) == 1 else indices[-2]].name  # the product's own node
        made[indices[-1]] = helper.make_node("MatMulNBits", inputs, [out], name=name, domain=MS, **attributes)
        replaced |= set(indices)
    kept = [made.get(i, node) for i, node in enumerate(nodes) if i in made or i not in replaced]
    return kept, stored.tensors, stored.bytes()


def int8_head_nbits(graph, data, block):
    """The tied int8 head's subgraph (from the final norm's output to `logits`: Reshape, the per-row scaling,
    QGemm slices, Mul, Reshape, Concat) as one MatMulNBits over the same int8 rows: [B, K, C] -> [B, K, V]."""
    array, stored = reader(graph, data), VariantData(data.new_file)
    producer = {out: node for node in graph.node for out in node.output}
    head, waiting, normed = {}, ["logits"], None
    while waiting:  # every node between the final norm and the logits
        node = producer.get(waiting.pop())
        if node is None or id(node) in head:
            continue
        if node.op_type.endswith("Normalization"):
            normed = node.output[0]
            continue
        head[id(node)] = node
        waiting += list(node.input)
    slices = [n for n in graph.node if id(n) in head and n.op_type == "QGemm"]
    if not slices or normed is None:
        raise SystemExit("int8-head-nbits applies to a package whose LM head is QGemm over int8 rows (a tied head)")
    slices.sort(key=lambda n: int(n.input[3].rsplit(".", 1)[1]))  # the rows' slices are named NAME.0, NAME.1, ...
    rows = np.concatenate([array(n.input[3]) for n in slices])  # [V, C] int8
    scale = np.concatenate([array(n.input[4]) for n in slices]).astype(np.float32)  # [V]
    vocab, width = rows.shape
    if width % block:
        raise SystemExit(f"--block {block} does not divide the head's {width} inputs")
    codes = (rows.astype(np.int16) + 128).astype(np.uint8).reshape(vocab, width // block, block)
    scales = np.repeat(scale[:, None], width // block, axis=1)  # [V, nb]: each block keeps its row's scale
    names = [stored.add("lm_head.nbits", codes), stored.add("lm_head.nbits_scale", scales)]
    attributes = dict(K=width, N=vocab, bits=8, block_size=block, accuracy_level=4)
    matmul = helper.make_node("MatMulNBits", [normed, *names], ["logits"], domain=MS, name="lm_head", **attributes)
    return [n for n in graph.node if id(n) not in head] + [matmul], stored.tensors, stored.bytes()


def nbits(graph, data, block, accuracy_level):
    """Every MatMulNBits at accuracy_level; the 8-bit ones requantized to `block` (None: as they are)."""
    from edgelm.export.int4 import quantize_blocks

    array, stored = reader(graph, data), VariantData(data.new_file)
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attributes["accuracy_level"] = accuracy_level
        if block and attributes["bits"] == 8 and block != attributes["block_size"]:
            if len(node.input) > 3 and node.input[3]:
                raise SystemExit(f"{node.name}: 8-bit weights with zero points; --block requantizes symmetric ones")
            codes = array(node.input[1]).astype(np.float32) - 128  # [N, nb, B], zero point 128
            scale = array(node.input[2]).astype(np.float32).reshape(codes.shape[0], -1, 1)
            weight = (codes * scale).reshape(codes.shape[0], -1)[:, : attributes["K"]]  # [N, K]
            w = quantize_blocks(weight, block, "rtn", 8)
            node.input[1] = stored.add(f"{node.input[1]}.block{block}", w.packed)
            node.input[2] = stored.add(f"{node.input[2]}.block{block}", w.scale.astype(np.float32))
            attributes["block_size"] = block
        del node.attribute[:]
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attributes.items())
    return list(graph.node), stored.tensors, stored.bytes()


def custom_int8(nodes, int8_recipe):
    """8-bit MatMulNBits in blocks of 32 over whole blocks, with no input past the scales (zero points, g_idx,
    bias: the exporter writes none) -> edgelm.Q8MatMul(A, B, scales), the same attributes but accuracy_level.
    int8_recipe: the package is the int8 recipe's, whose every product must be in blocks of 32 first (an int4
    package's 8-bit head in other blocks stays MatMulNBits)."""
    rewritten = []
    for node in nodes:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        blocks = node.op_type == "MatMulNBits" and attributes["bits"] == 8 and attributes["block_size"] != 32
        if blocks and int8_recipe:
            raise SystemExit(
                f"{node.name}: 8-bit weights in blocks of {attributes['block_size']}; the custom op reads blocks of 32: "
                "make them first with --variant nbits --block 32, then run custom-int8 on that variant"
            )
        if (
            node.op_type == "MatMulNBits"
            and (attributes["bits"], attributes["block_size"], attributes["K"] % 32) == (8, 32, 0)
            and not any(node.input[3:])
        ):
            keep = {k: attributes[k] for k in ("K", "N", "bits", "block_size")}
            node = helper.make_node("Q8MatMul", node.input[:3], node.output, name=node.name, domain="edgelm", **keep)
        rewritten.append(node)
    return rewritten


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


def no_attention_bias(graph):
    for node in graph.node:
        if node.op_type == "GroupQueryAttention" and len(node.input) > 10:
            node.input[10] = ""
            while node.input and not node.input[-1]:
                del node.input[-1]
    return live(graph, list(graph.node)), []


def live(graph, nodes):
    """The nodes whose outputs something reads: a graph output, or a node that is itself live."""
    wanted = {o.name for o in graph.output}
    kept = []
    for node in reversed(in_order(graph, nodes)):
        if wanted & set(node.output):
            kept.append(node)
            wanted |= set(node.input)
    return kept[::-1]


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


VARIANTS = (
    "kv-float16",
    "int8-nbits",
    "rotary-in-attention",
    "block-sums-reducesum",
    "int8-head-nbits",
    "nbits",
    "no-attention-bias",
    "custom-int8",
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument(
        "--block", type=int, help="inputs per scale: int8-nbits (default: the int8 recipe's), int8-head-nbits (32), nbits (as stored)"
    )
    parser.add_argument("--accuracy-level", type=int, default=4, choices=(0, 1, 2, 3, 4), help="nbits: the level")
    args = parser.parse_args()
    model = onnx.load(str(args.package / "model.onnx"), load_external_data=False)
    graph = model.graph
    ops = {node.op_type for node in graph.node}
    needs = {
        "kv-float16": "RotaryEmbedding",
        "rotary-in-attention": "RotaryEmbedding",
        "int8-nbits": "DynamicQuantizeMatMul" if "MatMulIntegerToFloat" not in ops else None,
        "int8-head-nbits": "QGemm",
        "nbits": "MatMulNBits",
        "no-attention-bias": "GroupQueryAttention",
        "custom-int8": "MatMulNBits",
    }.get(args.variant)
    if needs and needs not in ops:
        raise SystemExit(f"{args.package} is not a graph {args.variant} applies to (it has no {needs})")
    data = PackageData(args.package)
    extra = None
    if args.variant == "kv-float16":
        nodes, added = kv_float16(graph)
    elif args.variant == "int8-nbits":
        nodes, added, extra = int8_nbits(graph, data, args.block)
    elif args.variant == "int8-head-nbits":
        nodes, added, extra = int8_head_nbits(graph, data, args.block or 32)
    elif args.variant == "nbits":
        nodes, added, extra = nbits(graph, data, args.block, args.accuracy_level)
    elif args.variant == "custom-int8":
        nodes, added, extra = int8_head_nbits(graph, data, 32) if "QGemm" in ops else (list(graph.node), [], None)
        recipe = json.loads((args.package / "manifest.json").read_text())["weights"].get("quantization", {})
        nodes = custom_int8(nodes, recipe.get("method") == "int8")
        model.opset_import.append(helper.make_opsetid("edgelm", 1))
    elif args.variant == "no-attention-bias":
        nodes, added = no_attention_bias(graph)
    elif args.variant == "block-sums-reducesum":
        nodes, added = block_sums_reducesum(graph)
    else:
        nodes, added = rotary_in_attention(graph)
    shutil.copytree(args.package, args.out)
    if extra:
        (args.out / data.new_file).write_bytes(extra)
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
    for name in ("model.onnx", data.new_file):
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
