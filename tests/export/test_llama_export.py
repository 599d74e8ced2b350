"""The Llama family's export: the manifest's architecture, the fp32 gate against transformers (grouped and
ungrouped key/value heads, a head size of 24, tied and untied heads, Qwen2's biases, Llama 3's rope scaling), the
quantized recipes' quality figures, the baked rotary tables, and bad checkpoints refused in one line."""

import json
import shutil

import numpy as np
import pytest
from checkpoints import copy_with_config
from click.testing import CliRunner
from edgelm.export.errors import ExportError
from edgelm.runtime.cli.main import main
from edgelm.runtime.package.open import open_package


def _export(checkpoint, output, **options):
    from edgelm.export.stages import export_model

    return export_model(str(checkpoint), output, **options)


def _manifest(package) -> dict:
    return json.loads((package / "manifest.json").read_text())


def _fp32_gate_held(manifest):
    fp32 = manifest["validation"]["fp32"]
    assert fp32["max_logits_relative_error"] <= 1e-5 and fp32["max_cache_path_relative_error"] <= 1e-5
    assert fp32["greedy_identical"] and {"one_token", "near_limit", "padded_batch"} <= set(fp32["cases"])


def test_llama_package_describes_its_family(llama_package):
    manifest = _manifest(llama_package)
    arch = manifest["architecture"]
    assert arch["model_type"] == "llama" and (arch["n_head"], arch["n_kv_head"], arch["head_size"]) == (4, 2, 16)
    assert (arch["norm"], arch["activation_function"], arch["positions"]) == ("rmsnorm", "silu", "rope")
    assert arch["rope_scaling"]["rope_type"] == "llama3" and arch["rope_theta"] == 10000.0
    assert arch["tie_word_embeddings"] is True and arch["biases"] == [] and arch["n_inner"] == 128
    graph = manifest["graph"]
    assert graph["inputs"]["past_key_values.0.key"]["shape"] == ["batch", 2, "past_sequence", 16]
    assert graph["outputs"]["present.1.value"]["shape"] == ["batch", 2, "total_sequence", 16]
    assert manifest["validation"]["reference"] == "transformers LlamaForCausalLM, float32, eager attention"
    _fp32_gate_held(manifest)
    info = CliRunner().invoke(main, ["info", "-m", str(llama_package)])
    assert info.exit_code == 0, info.output
    assert (
        "family        RMSNorm, SwiGLU MLP (silu) 128 wide, rope theta 10000 (llama3 scaling x8), "
        "2 KV heads (grouped, 2 per KV head), tied LM head, no biases" in info.output
    )


def test_qwen2_package_has_its_biases_and_one_kv_head(qwen2_package):
    manifest = _manifest(qwen2_package)
    arch = manifest["architecture"]
    assert arch["model_type"] == "qwen2" and arch["n_kv_head"] == 1 and arch["rope_theta"] == 1e6
    assert arch["biases"] == ["q_proj", "k_proj", "v_proj"] and arch["rope_scaling"] is None
    assert manifest["validation"]["reference"].startswith("transformers Qwen2ForCausalLM")
    _fp32_gate_held(manifest)
    assert "biases on q_proj, k_proj, v_proj" in open_package(qwen2_package).describe()


def test_untied_head_greedy_equals_transformers(tmp_path):
    """Untied head, ungrouped key/value heads of size 24 (the fp32 gate itself: the slow test below)."""
    import torch
    from edgelm.runtime import load
    from llama_checkpoints import build_llama_checkpoint
    from transformers import LlamaForCausalLM

    checkpoint = build_llama_checkpoint(tmp_path / "untied", "llama-untied", seed=2)
    manifest = _export(checkpoint, tmp_path / "fp32", validate=False).manifest
    assert (
        manifest["architecture"]["tie_word_embeddings"] is False
        and manifest["weights"]["tied_embedding_stored_once"] is False
    )
    assert list(manifest["graph"]["inputs"])[0] == "input_ids" and manifest["architecture"]["head_size"] == 24
    model, reference = (
        load(tmp_path / "fp32"),
        LlamaForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval(),
    )
    ids = model.encode("Once upon a time, in a land far away,")
    with torch.no_grad():
        expected = reference.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=10, min_new_tokens=10)
    assert model.generate([ids], max_new_tokens=10, min_new_tokens=10)[0].token_ids == expected[0, len(ids) :].tolist()


@pytest.mark.slow
def test_untied_head_int8_reports_quality(tmp_path):
    """Untied head, ungrouped key/value heads of size 24: the fp32 gate, and int8 with the token rows read by the
    runtime (inputs_embeds, 8-bit rows with one scale per row: no product reads that table)."""
    from llama_checkpoints import build_llama_checkpoint

    checkpoint = build_llama_checkpoint(tmp_path / "untied", "llama-untied", seed=2)
    manifest = _export(checkpoint, tmp_path / "int8", quantize="int8").manifest
    _fp32_gate_held(manifest)
    assert manifest["architecture"]["tie_word_embeddings"] is False and manifest["architecture"]["head_size"] == 24
    assert manifest["weights"]["tied_embedding_stored_once"] is False
    table = manifest["graph"]["token_embeddings"]
    assert list(manifest["graph"]["inputs"])[0] == "inputs_embeds" and "block" not in table
    assert table["rows"]["dtype"] == "int8" and table["rows"]["shape"] == [manifest["architecture"]["vocab_size"], 96]
    assert "no node reads them" in table["embedding"]
    quality = manifest["validation"]["int8"]
    # This random 96-wide model is far more peaked than a trained one (perplexity ~10^4 over 320 tokens): its tied
    # twin scores the same (top-1 0.77, KL 0.11), so these bounds are the model's, not the untied head's.
    assert quality["top1_agreement"] >= 0.6 and quality["mean_kl_divergence"] < 0.3
    assert "token embedding and LM head stored apart" in open_package(tmp_path / "int8").describe()


@pytest.mark.slow
@pytest.mark.parametrize(
    "checkpoint, quantize, kv_cache",
    [
        ("qwen2_checkpoint", "int4", "float32"),
        ("llama_checkpoint", "int8", "int8"),
        ("qwen2_checkpoint", "int4", "int8"),
    ],
)
def test_quantized_quality_figures(request, tmp_path, checkpoint, quantize, kv_cache):
    """The figures are recorded. These random models are far more peaked than trained ones, so weight error moves
    their top-1 a lot (int4 on the Qwen2 one: 0.16, while the int4 graph agrees with float32 on the same
    dequantized weights: test_int4_graph_equals_float32_on_its_dequantized_weights)."""
    checkpoint = request.getfixturevalue(checkpoint)
    manifest = _export(checkpoint, tmp_path / "pkg", quantize=quantize, kv_cache=kv_cache).manifest
    quality = manifest["validation"][quantize]
    assert quality["kv_cache"] == kv_cache and quality["cache_path"]["tokens"] > 0
    assert quality["top1_agreement"] >= (0.6 if quantize == "int8" else 0.1)
    assert 0 <= quality["mean_kl_divergence"] and 0 <= quality["cache_path"]["mean_kl_divergence"]


def test_int4_graph_equals_float32_on_its_dequantized_weights(qwen2_checkpoint):
    """The int4 graph computes what the float32 graph computes on the int4 weights dequantized (up to its int8
    activations): the 4-bit layouts, block scales and the tied lookup are read as they were written."""
    from edgelm.export.families.llama.graph import build_decoder
    from edgelm.export.load import load_checkpoint
    from edgelm.export.int4 import Int4Options, quantize_blocks
    from edgelm.export.validate import _engine
    from edgelm.export.weights_file import split_weights

    int4 = Int4Options()  # the defaults; tests/export/test_int4_options.py checks the other options the same way

    def dequantized(name, w):  # [N, K] -> the same shape, as stored
        head = name == "model.embed_tokens.weight"
        method, bits = (int4.head_method, int4.head_bits) if head else (int4.method, 4)
        return quantize_blocks(w, int4.block_size, method, bits).dequantized()

    checkpoint = load_checkpoint(str(qwen2_checkpoint))
    rounded = {k: dequantized(k, v) if v.ndim == 2 else v for k, v in checkpoint.weights.items()}
    ids = np.random.default_rng(0).integers(0, checkpoint.arch.vocab_size, size=(1, 40))
    logits = []
    for weights, recipe in ((rounded, "none"), (checkpoint.weights, "int4")):
        decoder = build_decoder(checkpoint.arch, weights, recipe)
        engine = _engine(split_weights(decoder.model.SerializeToString(), decoder.arrays), checkpoint.arch)
        ones = np.ones_like(ids)
        logits.append(engine.forward(ids, ones, np.arange(40)[None], engine.empty_past(1), logits_to_keep=0)[0])
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).mean() >= 0.85
    assert np.abs(logits[0] - logits[1]).max() / np.abs(logits[0]).max() < 0.15


def test_rope_tables_match_transformers_llama3_scaling():
    """The baked cos/sin tables equal what transformers' rotary module computes at run time, scaling included."""
    import torch
    from edgelm.export.families.llama.rope import rope_tables
    from edgelm.runtime.package.format import Architecture
    from llama_checkpoints import LLAMA3_ROPE
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256, rope_scaling=LLAMA3_ROPE)
    arch = Architecture(
        1, 4, 16, 64, 256, 320, None, None, None, positions="rope", rope_theta=10000.0, rope_scaling=LLAMA3_ROPE
    )
    positions = torch.arange(256)[None]
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1, 256, 16), positions)
    ours_cos, ours_sin = rope_tables(arch)
    assert np.array_equal(np.concatenate([ours_cos, ours_cos], -1), cos[0].numpy())
    assert np.array_equal(np.concatenate([ours_sin, ours_sin], -1), sin[0].numpy())
    plain = rope_tables(Architecture(1, 4, 16, 64, 256, 320, None, None, None, positions="rope", rope_theta=10000.0))
    assert not np.allclose(plain[0], ours_cos)  # the scaling changed the long wavelengths


def _refused(folder, tmp_path, message):
    """One clear line through the CLI (after the stage it reached), and nothing written."""
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and message in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_config_that_contradicts_its_weights(llama_checkpoint, tmp_path):
    folder = copy_with_config(llama_checkpoint, tmp_path / "ckpt", intermediate_size=256)
    _refused(
        folder,
        tmp_path,
        "does not match its config.json: model.layers.0.mlp.gate_proj.weight is [128, 64], the config makes it [256, 64]",
    )


def test_config_without_the_biases_its_weights_have(qwen2_checkpoint, tmp_path):
    folder = copy_with_config(
        qwen2_checkpoint, tmp_path / "ckpt", model_type="llama", architectures=["LlamaForCausalLM"]
    )
    _refused(folder, tmp_path, "_proj.bias, which the config does not describe")


def test_sharded_checkpoint_with_a_missing_shard(llama_checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    _refused(folder, tmp_path, "names 1 shard that")
    _refused(folder, tmp_path, "(first: model-00002-of-00002.safetensors); the download is incomplete")


def test_sharded_checkpoint_loads_every_shard(llama_checkpoint, tmp_path):
    """Shards listed by model.safetensors.index.json are read as one state dict."""
    from edgelm.export.load import load_checkpoint
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(folder / shard), metadata={"format": "pt"})
    weight_map = {k: shard for shard, keys in halves.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    checkpoint = load_checkpoint(str(folder))
    assert checkpoint.weight_file == "model.safetensors.index.json"
    assert np.array_equal(checkpoint.weights["model.norm.weight"], tensors["model.norm.weight"])


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling type 'yarn'; edgelm exports rotary embeddings of type default or llama3",
        ),
        ({"hidden_act": "gelu"}, "sets hidden_act='gelu'; edgelm's Llama-family graph supports only hidden_act='silu'"),
        (
            {"num_key_value_heads": 3},
            "num_key_value_heads must be a positive whole number dividing num_attention_heads (4), not 3",
        ),
        ({"head_dim": 32}, "sets head_dim=32; edgelm exports heads of hidden_size / num_attention_heads (16) only"),
        ({"architectures": ["MyLlama"]}, "needs Python code shipped with the checkpoint (MyLlama)"),
    ],
)
def test_settings_the_graph_does_not_reproduce(llama_checkpoint, tmp_path, changes, message):
    folder = copy_with_config(llama_checkpoint, tmp_path / "ckpt", **changes)
    with pytest.raises(ExportError, match=None) as error:
        _export(folder, tmp_path / "out")
    assert message in str(error.value) and not (tmp_path / "out").exists()


def test_untied_int8_lm_head_in_parts_gives_the_same_logits(tmp_path, monkeypatch):
    """An untied int8 LM head is 8-bit MatMulNBits in slices of the vocabulary, as a tied one is, so that
    onnxruntime's prepacking holds a slice at a time beside its packed copy. The tiny model's head is one slice;
    forced into parts (ALIGN 256: 96-byte rows and 12-byte scale rows in slices of 128), the logits keep their bits."""
    import onnx
    from edgelm.export.families.llama.graph import build_decoder
    from edgelm.export.graph import embeddings as embeddings_module
    from edgelm.export.load import load_checkpoint
    from edgelm.export.validate import _engine
    from edgelm.export.weights_file import split_weights
    from edgelm.runtime.engine.decode import position_ids_from_mask
    from llama_checkpoints import build_llama_checkpoint

    checkpoint = load_checkpoint(str(build_llama_checkpoint(tmp_path / "untied", "llama-untied", seed=2)))
    assert checkpoint.arch.tie_word_embeddings is False
    shipped = {}
    for align in (embeddings_module.ALIGN, 256):
        monkeypatch.setattr(embeddings_module, "ALIGN", align)
        decoder = build_decoder(checkpoint.arch, checkpoint.weights, "int8")
        shipped[align] = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    for graph, count in zip(shipped.values(), (1, 3)):
        nodes = onnx.load_model_from_string(graph.graph).graph.node
        heads = [n for n in nodes if n.op_type == "MatMulNBits" and n.input[1].startswith("lm_head.weight_int8.")]
        assert len(heads) == count
    ids = np.array([[3, 100, 319, 5, 0]])
    mask = np.ones_like(ids)
    engines = [_engine(s, checkpoint.arch) for s in shipped.values()]
    logits = [e.forward(ids, mask, position_ids_from_mask(mask), e.empty_past(1), logits_to_keep=0)[0] for e in engines]
    np.testing.assert_array_equal(*logits)


def test_untied_int8_head_at_a_width_32_does_not_divide(tmp_path):
    """80 inputs: the head's MatMulNBits pads its last block of 32 (the body's products do the same); the package
    validates against transformers and generates."""
    import edgelm.runtime as rt
    from llama_checkpoints import build_llama_checkpoint

    checkpoint = build_llama_checkpoint(
        tmp_path / "untied-80", "llama-untied", hidden_size=80, num_attention_heads=2, num_key_value_heads=2
    )
    manifest = _export(checkpoint, tmp_path / "int8", quantize="int8").manifest
    assert manifest["architecture"]["n_embd"] == 80 and manifest["architecture"]["tie_word_embeddings"] is False
    assert manifest["validation"]["fp32"]["greedy_identical"] and manifest["validation"]["int8"]["top1_agreement"] > 0.5
    assert rt.load(tmp_path / "int8").generate("Hello", max_new_tokens=3).token_ids
