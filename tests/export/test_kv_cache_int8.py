"""The optional int8 KV cache (`edgelm export --quantize int8 --kv-cache int8`): calibration, the graph, the
quality report, and the runtime's cache paths with int8 buffers."""

import json

import edgelm.runtime as rt
import numpy as np
import onnx
import pytest
from edgelm.export.errors import ExportError
from onnx import TensorProto


def test_scales_give_headroom_over_the_largest_key_and_value_per_channel(tiny_checkpoint, reference_model):
    """Checked against transformers' own cache (past_key_values), not against the hook that computes them."""
    import torch
    from edgelm.export.calibrate import HEADROOM, calibration_rows
    from edgelm.export.families.gpt2.reference import kv_cache_scales
    from edgelm.runtime.package.format import Architecture
    from tokenizers import Tokenizer

    arch = Architecture.from_hf_config(json.loads((tiny_checkpoint / "config.json").read_text()))
    tokenizer = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    scales = kv_cache_scales(reference_model, tokenizer, arch)
    largest = [np.zeros((2, arch.n_head, arch.head_size)) for _ in range(arch.n_layer)]
    with torch.no_grad():
        for row in calibration_rows(tokenizer, arch):
            cache = reference_model(input_ids=torch.tensor([row]), use_cache=True).past_key_values
            for i in range(arch.n_layer):
                k, v = cache[i]  # [1, H, T, D]
                largest[i] = np.maximum(largest[i], np.stack([k[0].abs().amax(1).numpy(), v[0].abs().amax(1).numpy()]))
    assert set(scales) == set(range(arch.n_layer))
    for i, (k_scale, v_scale) in scales.items():
        assert k_scale.shape == v_scale.shape == (arch.n_head, arch.head_size) and k_scale.dtype == np.float32
        np.testing.assert_allclose(np.stack([k_scale, v_scale]) * 127 / HEADROOM, largest[i], rtol=1e-5)


def test_the_graph_stores_the_cache_as_int8_with_fixed_scales(tiny_package_int8_kv8):
    manifest = json.loads((tiny_package_int8_kv8 / "manifest.json").read_text())
    assert manifest["graph"]["kv_cache"]["dtype"] == "int8"
    assert manifest["graph"]["inputs"]["past_key_values.0.key"]["dtype"] == "int8"
    assert manifest["graph"]["outputs"]["present.1.value"]["dtype"] == "int8"
    graph = onnx.load(str(tiny_package_int8_kv8 / "model.onnx")).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2
    for node in attention:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["kv_cache_bit_width"] == 8 and attributes["k_quant_type"] == b"PER_CHANNEL"
        assert node.input[12].endswith("k_cache_scale") and node.input[13].endswith("v_cache_scale")
    assert {i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_")} == {TensorProto.INT8}


def test_the_quality_report_measures_the_cache_path(validated_package_int8, validated_package_int8_kv8):
    plain = json.loads((validated_package_int8 / "manifest.json").read_text())["validation"]["int8"]
    kv8 = json.loads((validated_package_int8_kv8 / "manifest.json").read_text())["validation"]["int8"]
    assert plain["kv_cache"] == "float32" and kv8["kv_cache"] == "int8"
    assert kv8["cache_path"]["tokens"] == 4 * 32  # the last 32 positions of four windows, through the cache
    assert kv8["top1_agreement"] >= 0.85 and abs(kv8["perplexity_change"]) <= 0.05
    assert 0 < kv8["cache_path"]["mean_kl_divergence"] <= 0.05
    # what the int8 cache adds on top of int8 weights stays small: within twice the weights' own divergence
    assert kv8["cache_path"]["mean_kl_divergence"] <= 2 * plain["cache_path"]["mean_kl_divergence"] + 1e-4


def test_the_runtime_decodes_into_int8_buffers_and_both_cache_paths_agree(tiny_package_int8_kv8, monkeypatch):
    from edgelm.runtime.engine import decode as engine_module
    from edgelm.runtime.engine.decode import GrowingDecoder, InPlaceDecoder, left_pad, position_ids_from_mask

    model = rt.load(tiny_package_int8_kv8)
    assert model.engine.io.cache_dtype == "int8"
    in_place = model.engine.decoder(1, 40)
    assert isinstance(in_place, InPlaceDecoder) and {b.dtype for b in in_place.buffers} == {np.dtype(np.int8)}
    monkeypatch.setattr(engine_module, "PREFILL_CHUNK", 4)
    prompt = model.encode("Once upon a time, in a land far away")
    ids, mask = left_pad([prompt], 0)
    positions = position_ids_from_mask(mask)
    growing = GrowingDecoder(model.engine, 1)
    # The prompt in chunks of 4 both ways (int8 activations are quantized per pass, so the passes must match):
    # the same int8 rows land in the preallocated buffer as in the growing cache, and the same logits come out.
    b = in_place.run(ids, mask, positions)
    for start in range(0, ids.shape[1], 4):
        end = min(start + 4, ids.shape[1])
        a = growing.run(ids[:, start:end], mask[:, :end], positions[:, start:end])
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    for grown, buffer in zip(growing.past, in_place.buffers):
        np.testing.assert_array_equal(grown.numpy(), buffer[:, :, : ids.shape[1]])
    completion = model.generate("Once upon a time", max_new_tokens=12, ignore_eos=True)
    assert len(completion.token_ids) == 12
    monkeypatch.setattr(model.engine, "decoder", lambda batch, capacity: GrowingDecoder(model.engine, batch))
    assert model.generate("Once upon a time", max_new_tokens=12, ignore_eos=True).token_ids == completion.token_ids


def test_an_int8_cache_needs_quantized_weights(tiny_checkpoint, tmp_path):
    from edgelm.export.stages import export_model

    with pytest.raises(ExportError, match="token-exact"):
        export_model(str(tiny_checkpoint), tmp_path / "out", kv_cache="int8")
    with pytest.raises(ExportError, match="unknown KV cache type"):
        export_model(str(tiny_checkpoint), tmp_path / "out", quantize="int8", kv_cache="int4")
    assert not (tmp_path / "out").exists()


def test_the_export_command_takes_the_kv_cache_option(tiny_checkpoint, tmp_path):
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    refused = CliRunner().invoke(
        main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "a"), "--kv-cache", "int8"]
    )
    assert (
        refused.exit_code == 1
        and "--quantize int8, int8-dynamic or int4" in refused.output
        and "Traceback" not in refused.output
    )
    unknown = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "b"), "--kv-cache", "fp8"])
    assert unknown.exit_code == 2 and "'fp8' is not one of" in unknown.output
    made = CliRunner().invoke(
        main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "c"), "--quantize", "int4", "--kv-cache", "int8"]
    )
    assert made.exit_code == 0, made.output
    info = CliRunner().invoke(main, ["info", str(tmp_path / "c")])
    assert "KV cache      int8" in info.output and "through the cache" in info.output
    assert "token rows read" not in info.output  # int4 keeps its lookup in the graph
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
