"""The export stage: graph contract, tied weights stored once, manifest, parity gates, int8 quality."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgelm.runtime.package import file_record


def _session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path / "model.onnx"), options)


def _feed(ids, n_layer=2, heads=4, head_size=8):
    ids = np.asarray(ids, dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()}
    for i in range(n_layer):
        for kind in ("key", "value"):
            feed[f"past_key_values.{i}.{kind}"] = np.zeros((ids.shape[0], heads, 0, head_size), np.float32)
    return feed


def test_package_files_and_manifest(tiny_package):
    manifest = json.loads((tiny_package / "manifest.json").read_text())
    names = {p.name for p in tiny_package.iterdir()}
    assert {"model.onnx", "tokenizer.json", "config.json", "generation_config.json", "manifest.json"} <= names
    assert manifest["format"] == "edgelm-package" and manifest["format_version"] == 1
    assert manifest["architecture"] == {
        "n_layer": 2, "n_head": 4, "head_size": 8, "n_embd": 32, "n_positions": 64, "vocab_size": 320,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None, "layer_norm_epsilon": 1e-5, "model_type": "gpt2",
    }
    graph = manifest["graph"]
    assert list(graph["inputs"])[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert graph["inputs"]["past_key_values.1.value"] == {"dtype": "float32", "shape": ["batch", 4, "past_sequence", 8]}
    assert graph["outputs"]["present.0.key"]["shape"] == ["batch", 4, "total_sequence", 8]
    assert graph["inputs"]["logits_to_keep"] == {"dtype": "int64", "shape": []}
    assert manifest["weights"]["dtype"] == "float32" and manifest["weights"]["tied_embedding_stored_once"]
    assert manifest["source"]["local_path"].endswith("tiny-gpt2")
    assert manifest["tools"]["onnx_opset"] == 17 and manifest["tools"]["torch"] and manifest["tools"]["onnxruntime"]
    # Every file but the manifest is listed with its real size and sha256.
    assert set(manifest["files"]) == names - {"manifest.json"}
    for name, record in manifest["files"].items():
        assert record == file_record(tiny_package / name)
    assert set(manifest["export_seconds"]) == {"load", "export", "optimize", "validate"}


def test_fp32_validation_recorded(tiny_package):
    validation = json.loads((tiny_package / "manifest.json").read_text())["validation"]["fp32"]
    assert set(validation["cases"]) >= {"one_token", "near_limit", "padded_batch"}
    assert validation["cases"]["near_limit"]["prompt_tokens"] == [60]
    assert validation["cases"]["padded_batch"]["prompt_tokens"][0] != validation["cases"]["padded_batch"]["prompt_tokens"][1]
    for case in validation["cases"].values():
        assert case["logits_relative_error"] <= 1e-5 and case["cache_path_relative_error"] <= 1e-5 and case["greedy_identical"]


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
        vocab_sized = [i.name for i in graph.initializer if 320 in list(i.dims)[:2]]
        tables = [name for name in vocab_sized if "scale" not in name and "zero_point" not in name]
        assert len(tables) == 1, vocab_sized
        users = {n.op_type for n in graph.node if tables[0] in n.input}
        assert users in ({"Gather", "MatMul"}, {"Gather", "DynamicQuantizeMatMul"}, {"GatherBlockQuantized", "MatMulNBits"}), users


def test_int8_package_quality_and_recipe(tiny_package, tiny_package_int8):
    manifest = json.loads((tiny_package_int8 / "manifest.json").read_text())
    recipe = manifest["weights"]["quantization"]
    assert manifest["weights"]["dtype"] == "int8" and recipe["bits"] == 7 and recipe["reduce_range"] is True
    quality = manifest["validation"]["int8"]
    assert quality["top1_agreement"] >= 0.85
    assert 0 <= quality["mean_kl_divergence"] <= 0.05
    assert 0 < quality["greedy_agreement"] <= 1
    assert abs(quality["perplexity_change"]) <= 0.05
    # the fp32 graph was validated as the parity gate for the int8 export too
    assert manifest["validation"]["fp32"]["greedy_identical"]
    ops = {n.op_type for n in onnx.load(str(tiny_package_int8 / "model.onnx")).graph.node}
    assert "DynamicQuantizeMatMul" in ops and "MatMul" not in ops  # every weight product is int8
    assert "GroupQueryAttention" in ops  # attention itself stays float (activations only)
    int8_size = (tiny_package_int8 / "model.onnx").stat().st_size
    assert int8_size < 0.45 * (tiny_package / "model.onnx").stat().st_size


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


def test_int4_package(tiny_package, tiny_package_int4):
    manifest = json.loads((tiny_package_int4 / "manifest.json").read_text())
    assert manifest["weights"]["dtype"] == "int4" and manifest["weights"]["quantization"]["block_size"] == 32
    quality = manifest["validation"]["int4"]
    # 4 bits on a 32-wide toy model (one block per row) is coarse; the figures are recorded, and must stay sane.
    assert quality["top1_agreement"] >= 0.5 and quality["mean_kl_divergence"] <= 0.5
    graph = onnx.load(str(tiny_package_int4 / "model.onnx")).graph
    matmuls = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(matmuls) == 2 * 4 + 1  # four products per block and the LM head
    assert all({a.name: a.i for a in n.attribute}["accuracy_level"] == 4 for n in matmuls)
    assert (tiny_package_int4 / "model.onnx").stat().st_size < 0.3 * (tiny_package / "model.onnx").stat().st_size


def test_int4_quantization_round_trip():
    from edgelm.export.quantize import quantize_int4

    weight = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    q = quantize_int4(weight)
    assert q.packed.shape == (8, 2, 16) and q.packed.dtype == np.uint8 and q.scale.shape == (8, 2)
    values = np.empty((8, 2, 32), np.float32)
    values[..., 0::2], values[..., 1::2] = q.packed & 15, q.packed >> 4
    restored = ((values - 8) * q.scale[..., None]).reshape(8, 64)
    assert np.abs(restored - weight).max() <= q.scale.max() / 2 + 1e-6
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_int4(weight[:, :40])
