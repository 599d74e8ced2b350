"""The export stage: graph contract, tied weights stored once, manifest, parity gates, int8 quality."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from checkpoints import graph_bytes
from edgelm.runtime.package.open import file_record


def _session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path / "model.onnx"), options)


def _feed(ids, n_layer=2, heads=4, head_size=8):
    ids = np.asarray(ids, dtype=np.int64)
    feed = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy(),
    }
    for i in range(n_layer):
        for kind in ("key", "value"):
            feed[f"past_key_values.{i}.{kind}"] = np.zeros((ids.shape[0], heads, 0, head_size), np.float32)
    return feed


def test_package_files_and_manifest(validated_package):
    manifest = json.loads((validated_package / "manifest.json").read_text())
    names = {p.name for p in validated_package.iterdir()}
    assert {
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "config.json",
        "generation_config.json",
        "manifest.json",
    } <= names
    assert manifest["format"] == "edgelm-package" and manifest["format_version"] == 2
    assert manifest["graph"]["weights_file"] == "model.onnx.data" and "token_embeddings" not in manifest["graph"]
    assert manifest["architecture"] == {
        "n_layer": 2,
        "n_head": 4,
        "head_size": 8,
        "n_embd": 32,
        "n_positions": 64,
        "vocab_size": 320,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": None,
        "layer_norm_epsilon": 1e-5,
        "model_type": "gpt2",
        "n_inner": None,
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
    }
    graph = manifest["graph"]
    assert list(graph["inputs"])[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert graph["inputs"]["past_key_values.1.value"] == {"dtype": "float32", "shape": ["batch", 4, "past_sequence", 8]}
    assert graph["outputs"]["present.0.key"]["shape"] == ["batch", 4, "total_sequence", 8]
    assert graph["inputs"]["logits_to_keep"] == {"dtype": "int64", "shape": []}
    assert manifest["weights"]["dtype"] == "float32" and manifest["weights"]["tied_embedding_stored_once"]
    # a local checkpoint is recorded by its folder's name: no path of the exporting machine leaves in the package
    assert manifest["source"] == {"local_folder": "tiny-gpt2", "weights_file": "model.safetensors"}
    for path in validated_package.iterdir():  # nor in any other file the package ships
        assert str(validated_package.parents[2]).encode() not in path.read_bytes(), path.name
    assert manifest["tools"]["onnx_opset"] == 17 and manifest["tools"]["torch"] and manifest["tools"]["onnxruntime"]
    # Every file but the manifest is listed with its real size and sha256.
    assert set(manifest["files"]) == names - {"manifest.json"}
    for name, record in manifest["files"].items():
        assert record == file_record(validated_package / name)
    assert set(manifest["export_seconds"]) == {"load", "export", "optimize", "validate"}


def test_fp32_validation_recorded(validated_package):
    validation = json.loads((validated_package / "manifest.json").read_text())["validation"]["fp32"]
    assert set(validation["cases"]) >= {"one_token", "near_limit", "padded_batch"}
    assert validation["cases"]["near_limit"]["prompt_tokens"] == [60]
    assert (
        validation["cases"]["padded_batch"]["prompt_tokens"][0]
        != validation["cases"]["padded_batch"]["prompt_tokens"][1]
    )
    for case in validation["cases"].values():
        assert (
            case["logits_relative_error"] <= 1e-5
            and case["cache_path_relative_error"] <= 1e-5
            and case["greedy_identical"]
        )


def test_graph_matches_transformers_logits(tiny_package, reference_model):
    import torch

    ids = np.array([[5, 17, 33, 2, 99, 100, 7]])
    ours = _session(tiny_package).run(["logits"], _feed(ids))[0]
    with torch.no_grad():
        reference = reference_model(torch.from_numpy(ids)).logits.numpy()
    assert ours.shape == (1, 7, 320)
    assert np.abs(ours - reference).max() / np.abs(reference).max() <= 1e-5


def test_logits_to_keep_computes_only_kept_positions(tiny_package):
    session = _session(tiny_package)
    ids = np.arange(1, 41)[None]
    all_logits = session.run(["logits"], _feed(ids))[0]
    last = session.run(["logits"], {**_feed(ids), "logits_to_keep": np.array(1)})[0]
    last3 = session.run(["logits"], {**_feed(ids), "logits_to_keep": np.array(3)})[0]
    assert all_logits.shape == (1, 40, 320) and last.shape == (1, 1, 320) and last3.shape == (1, 3, 320)
    np.testing.assert_allclose(last[0, 0], all_logits[0, -1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(last3[0], all_logits[0, -3:], rtol=1e-5, atol=1e-5)
    # Structure: the LM head consumes the final norm, whose inputs are both Sliced: no [T, V] product exists.
    graph = onnx.load(str(tiny_package / "model.onnx")).graph
    producer = {out: node for node in graph.node for out in node.output}
    head = producer["logits"]
    norm = producer[head.input[0]]
    assert head.op_type == "MatMul" and norm.op_type == "SkipLayerNormalization"
    assert [producer[name].op_type for name in norm.input[:2]] == ["Slice", "Slice"]


def test_tied_embedding_stored_once(tiny_package, tiny_package_int8, tiny_package_int4):
    for package in (tiny_package, tiny_package_int8, tiny_package_int4):
        graph = onnx.load(str(package / "model.onnx")).graph
        vocab_sized = [
            i for i in graph.initializer if 320 in list(i.dims)[:2] or i.name.startswith("transformer.wte.weight_int8.")
        ]
        tables = [i for i in vocab_sized if "scale" not in i.name and "zero_point" not in i.name]
        assert sum(t.dims[0] for t in tables) in (32, 320), [
            t.name for t in vocab_sized
        ]  # one [C, V] table, or [V, ...] rows in parts
        users = {n.op_type for t in tables for n in graph.node if t.name in n.input}
        assert users in ({"Gather", "MatMul"}, {"QGemm"}, {"MatMulNBits"}, {"GatherBlockQuantized", "MatMulNBits"})
        # int8 and int4 keep [V, ...] rows (contiguous per token); float32 keeps the head's [C, V].
        assert (tables[0].dims[0] != 32) == (package != tiny_package), (package, tables[0].dims)


@pytest.mark.parametrize("fixture, head", [("tiny_package_int8", "MatMulNBits"), ("tiny_package_int8_rows", "QGemm")])
def test_int8_graph_takes_embeddings_read_from_the_weights_file(request, fixture, head):
    """The int8 graphs take inputs_embeds; the runtime reads token rows from model.onnx.data, where the LM head
    names the same bytes (one copy on disk, none unpacked in memory): int8's MatMulNBits reads them as uint8
    blocks with a scale each, int8-rows' QGemm parts as 7-bit rows with a scale per row."""
    from edgelm.runtime.engine.embeddings import TokenEmbeddings
    from edgelm.runtime.package.open import read_manifest
    from onnx import numpy_helper
    from token_table import stored_table

    package = request.getfixturevalue(fixture)
    manifest = json.loads((package / "manifest.json").read_text())
    assert list(manifest["graph"]["inputs"])[0] == "inputs_embeds" and "input_ids" not in manifest["graph"]["inputs"]
    assert manifest["format_version"] == (3 if head == "MatMulNBits" else 2)  # older runtimes: "upgrade edgelm"
    graph = onnx.load(str(package / "model.onnx")).graph
    parts = sorted(
        (i for i in graph.initializer if i.name.startswith("transformer.wte.weight_int8.")),
        key=lambda i: int(i.name.rsplit(".", 1)[1]),
    )
    assert {n.op_type for n in graph.node if set(n.input) & {p.name for p in parts}} == {head}
    table = read_manifest(package).graph.token_embeddings
    assert table.block == (32 if head == "MatMulNBits" else 0)  # the tiny model's 32 inputs: one block
    rows, _, embeddings = stored_table(package, table)
    np.testing.assert_array_equal(rows, np.concatenate([numpy_helper.to_array(i) for i in parts]))
    lookup = TokenEmbeddings.open(package / table.file, table)
    ids = np.array([[0, 5, 319], [7, 7, 1]])
    np.testing.assert_array_equal(lookup(ids), embeddings[ids])
    out = np.full((*ids.shape, 32), np.nan, dtype=np.float32)  # a decode step's input, written in place
    assert lookup(ids, out) is out
    np.testing.assert_array_equal(out, lookup(ids))
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    info = CliRunner().invoke(main, ["info", str(package)])
    assert "token rows read from model.onnx.data by the runtime" in info.output


@pytest.mark.parametrize(
    "fixture, recipe, products",
    [
        ("validated_package_int8", "int8", "MatMulNBits"),
        ("validated_package_int8_rows", "int8-rows", "MatMulIntegerToFloat"),
        ("validated_package_int8_dynamic", "int8-dynamic", "DynamicQuantizeMatMul"),
    ],
)
def test_int8_package_quality_and_recipe(request, tiny_package, fixture, recipe, products):
    package = request.getfixturevalue(fixture)
    manifest = json.loads((package / "manifest.json").read_text())
    described = manifest["weights"]["quantization"]
    assert manifest["weights"]["dtype"] == "int8" and described["method"] == recipe
    if recipe == "int8":
        assert described["bits"] == 8 and described["block_size"] == 64 and described["batch_invariant"] is True
    else:
        assert described["bits"] == 7 and described["reduce_range"] is True
        assert described["batch_invariant"] is (recipe == "int8-rows")
    quality = manifest["validation"][recipe]
    assert quality["top1_agreement"] >= 0.85
    assert 0 <= quality["mean_kl_divergence"] <= 0.05
    assert 0 < quality["greedy"]["prefix_agreement"] <= 1
    assert abs(quality["perplexity_change"]) <= 0.05
    # the fp32 graph was validated as the parity gate for the int8 export too
    assert manifest["validation"]["fp32"]["greedy_identical"]
    graph = onnx.load(str(package / "model.onnx")).graph
    ops = {n.op_type for n in graph.node}
    assert products in ops and "MatMul" not in ops  # every weight product is int8
    assert ("DynamicQuantizeLinear" in ops) == (recipe == "int8-dynamic")  # int8, int8-rows: no scale spans rows
    bits = {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert bits == ({8} if recipe == "int8" else set())
    assert "GroupQueryAttention" in ops  # attention itself stays float (activations only)
    assert graph_bytes(package) < 0.45 * graph_bytes(tiny_package)


def test_int8_weights_never_saturate():
    """7-bit weights keep u8 x s8 pair sums inside int16, the no-VNNI kernel's accumulator."""
    from edgelm.export.quantize import quantize_int8

    weight = np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32)
    weight[:, 3] *= 50  # an outlier column keeps its own scale
    q = quantize_int8(weight)
    assert q.q.dtype == np.int8 and q.q.min() >= -64 and q.q.max() <= 63
    assert 2 * 255 * int(np.abs(q.q).max()) <= 32767
    restored = q.q.astype(np.float32) * q.scale
    assert np.abs(restored - weight).max(axis=0)[0] <= q.scale[0] / 2 + 1e-7
    full = quantize_int8(weight, reduce_range=False)
    assert full.q.max() == 127


def test_int4_package(tiny_package, validated_package_int4):
    manifest = json.loads((validated_package_int4 / "manifest.json").read_text())
    assert manifest["weights"]["dtype"] == "int4" and manifest["weights"]["quantization"]["block_size"] == 128
    quality = manifest["validation"]["int4"]
    # 4 bits on a 32-wide toy model (one block per row) is coarse; the figures are recorded, and must stay sane
    # (on the evaluation text: top-1 0.53, KL 0.17; a broken graph agrees on about 1/320 of the positions).
    assert quality["top1_agreement"] >= 0.4 and quality["mean_kl_divergence"] <= 0.5
    graph = onnx.load(str(validated_package_int4 / "model.onnx")).graph
    matmuls = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(matmuls) == 2 * 4 + 1  # four products per block and the LM head
    assert all({a.name: a.i for a in n.attribute}["accuracy_level"] == 4 for n in matmuls)
    # blocks of 128 (the default): the toy model's 32-wide products pad to one block each, so 4 bits take about
    # half of float32's bytes here; unpadded widths take under a third (test_int4_options)
    assert graph_bytes(validated_package_int4) < 0.6 * graph_bytes(tiny_package)


def test_int4_quantization_round_trip():
    from edgelm.export.int4 import quantize_blocks

    weight = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    q = quantize_blocks(weight, 32, "rtn")
    assert q.packed.shape == (8, 2, 16) and q.packed.dtype == np.uint8 and q.scale.shape == (8, 2)
    values = np.empty((8, 2, 32), np.float32)
    values[..., 0::2], values[..., 1::2] = q.packed & 15, q.packed >> 4
    restored = ((values - 8) * q.scale[..., None]).reshape(8, 64)
    assert np.abs(restored - weight).max() <= q.scale.max() / 2 + 1e-6
    assert np.array_equal(restored, q.dequantized())


@pytest.mark.parametrize("recipe, head, parts", [("int8", "MatMulNBits", 3), ("int8-rows", "QGemm", 4)])
def test_int8_lm_head_in_parts_gives_the_same_logits(tiny_checkpoint, monkeypatch, recipe, head, parts):
    """A distilgpt2-sized int8 LM head is four slices of the vocabulary (so onnxruntime's prepacking holds a
    quarter of the table at a time beside its packed copy); the tiny model has one. Forced into parts here (at
    ALIGN 256: int8-rows' 32-byte rows in slices of 80; int8's, with 4-byte scales, of 128), the logits must not
    change, and the token rows and scales must stay contiguous in model.onnx.data, where the runtime reads them."""
    from edgelm.export.families.gpt2.graph import build_decoder
    from edgelm.export.graph import embeddings as embeddings_module
    from edgelm.export.load import load_checkpoint
    from edgelm.export.validate import _engine
    from edgelm.export.weights_file import split_weights
    from edgelm.runtime.engine.decode import position_ids_from_mask

    checkpoint = load_checkpoint(str(tiny_checkpoint))
    shipped = {}
    for align in (embeddings_module.ALIGN, 256):
        monkeypatch.setattr(embeddings_module, "ALIGN", align)
        decoder = build_decoder(checkpoint.arch, checkpoint.weights, recipe)
        shipped[align] = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    one, several = shipped.values()
    for graph, count in ((one, 1), (several, parts)):
        nodes = onnx.load_model_from_string(graph.graph).graph.node
        heads = [n for n in nodes if n.op_type == head and any(i.startswith("transformer.wte.") for i in n.input)]
        assert len(heads) == count
    assert several.token_embeddings == one.token_embeddings  # one table, the same place, rows and scales
    table = several.token_embeddings
    for region in (table.rows, table.scale):
        at = slice(region.offset, region.offset + region.nbytes)
        assert several.data[at] == one.data[at]
    ids = np.array([[3, 100, 319, 5, 0]])
    mask = np.ones_like(ids)
    engines = [_engine(s, checkpoint.arch) for s in (one, several)]
    logits = [e.forward(ids, mask, position_ids_from_mask(mask), e.empty_past(1), logits_to_keep=0)[0] for e in engines]
    np.testing.assert_array_equal(*logits)


def test_graph_protobuf_holds_no_weights(tiny_checkpoint):
    """Weights stay out of the graph's protobuf (which cannot pass 2 GB: gpt2-large and gpt2-xl) until
    model.onnx.data is written piece by piece; only shapes and scalars are inline."""
    from edgelm.export.families.gpt2.graph import build_decoder
    from edgelm.export.load import load_checkpoint
    from edgelm.export.weights_file import split_weights

    checkpoint = load_checkpoint(str(tiny_checkpoint))
    decoder = build_decoder(checkpoint.arch, checkpoint.weights, "none")
    inline = [t for t in decoder.model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert max(len(t.raw_data) for t in inline) < 1024
    assert decoder.arrays["wpe"] is checkpoint.weights["transformer.wpe.weight"]  # the checkpoint's array, not a copy
    shipped = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    assert len(shipped.graph) < 64 * 1024 and len(shipped.data) == shipped.size
    start = dict((name, offset) for name, offset, _ in shipped.pieces)["wpe"]
    wpe = checkpoint.weights["transformer.wpe.weight"]
    np.testing.assert_array_equal(np.frombuffer(shipped.data, np.float32, wpe.size, start).reshape(wpe.shape), wpe)
