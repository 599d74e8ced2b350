"""GPT2LMHeadModel's configurations: untied LM heads, MLP widths, every activation, the attention scale rules,
and one clear line for the ones edgelm refuses. Each is checked against transformers on tiny random weights."""

import json
import math
import re
from dataclasses import replace

import numpy as np
import onnx
import pytest
from checkpoints import copy_with_config
from edgelm.export.errors import ExportError

VARIANT = {  # one checkpoint that changes every GPT-2 setting at once, so one validated export covers them
    "tie_word_embeddings": False,
    "n_inner": 64,  # 2 x n_embd rather than GPT-2's 4 x
    "activation_function": "gelu",
    "scale_attn_by_inverse_layer_idx": True,
    "reorder_and_upcast_attn": True,
}


@pytest.fixture(scope="session")
def variant_checkpoint(tiny_checkpoint, tmp_path_factory):
    from checkpoints import build_checkpoint

    folder = tmp_path_factory.mktemp("ckpt") / "tiny-variant"
    return build_checkpoint(folder, seed=1, tokenizer_folder=tiny_checkpoint, **VARIANT)


@pytest.fixture(scope="session")
def validated_variant_int8_kv8(variant_checkpoint, tmp_path_factory):
    """The variant through the whole gate: fp32 parity (logits, cache path, greedy tokens) and int8 figures."""
    from edgelm.export.stages import export_model

    folder = tmp_path_factory.mktemp("validated") / "variant-int8-kv8"
    return export_model(str(variant_checkpoint), folder, quantize="int8", kv_cache="int8").path


def _reference(config: dict, weights: dict):
    """transformers' GPT2LMHeadModel with `config` and these NumPy weights, eager attention, float32."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config.from_dict(config | {"_attn_implementation": "eager"})).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    model.tie_weights()
    return model


def _relative_error(ours, reference):
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


def _graph_logits(arch, weights, recipe, ids):
    """The decoder built in memory, its logits for one padded batch, full and through the cache."""
    from edgelm.export.families.gpt2.graph import build_decoder
    from edgelm.export.validate import _engine
    from edgelm.export.weights_file import split_weights
    from edgelm.runtime.engine.decode import position_ids_from_mask
    from edgelm.runtime.quality.measure import cache_path_logits

    decoder = build_decoder(arch, weights, recipe)
    engine = _engine(split_weights(decoder.model.SerializeToString(), decoder.arrays), arch)
    mask = (ids != 0).astype(np.int64)
    full, _ = engine.forward(ids, mask, position_ids_from_mask(mask), engine.empty_past(len(ids)), logits_to_keep=0)
    return full, cache_path_logits(engine, ids, mask), mask


def _torch_logits(model, ids, mask):
    import torch
    from edgelm.runtime.engine.decode import position_ids_from_mask

    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(position_ids_from_mask(mask)),
        )
    return out.logits.numpy()


IDS = np.array([[0, 0, 5, 17, 33, 2, 99, 100], [3, 250, 7, 7, 1, 64, 9, 300]])  # row 0 left-padded


def test_every_transformers_activation_maps_to_onnx_ops_exactly():
    """Each ACT2FN name against transformers' own module, on values from -30 to 30 (the tails included)."""
    import onnxruntime as ort
    import torch
    from edgelm.export.families.gpt2.activations import ACTIVATIONS, mlp_activation
    from edgelm.export.graph.builder import FLOAT, GraphBuilder
    from transformers.activations import ACT2CLS, ACT2FN

    assert set(ACTIVATIONS) == set(ACT2CLS), "transformers' activations changed: map the new ones"
    x = np.concatenate([np.linspace(-30, 30, 601), np.random.default_rng(0).normal(0, 3, 399)]).astype(np.float32)
    bias = np.linspace(-0.5, 0.5, 1000).astype(np.float32)
    for name in sorted(ACTIVATIONS):
        module = ACT2FN[name]
        weights = {f"act.{k}": v.detach().float().numpy() for k, v in module.state_dict().items()}
        if name == "prelu":
            weights["act.weight"][:] = 0.1  # not torch's initial 0.25: the graph must read the checkpoint's
        g = GraphBuilder("act", "unused.data")
        g.output(
            mlp_activation(g, name, g.input("x", FLOAT, [1000]), g.input("bias", FLOAT, [1000]), weights, "act"),
            FLOAT,
            [1000],
        )
        with torch.no_grad():
            if name == "prelu":
                module.weight.fill_(0.1)
            expected = module(torch.from_numpy(x + bias)).numpy()
        session = ort.InferenceSession(g.model(17, "").SerializeToString(), providers=["CPUExecutionProvider"])
        ours = session.run(None, {"x": x, "bias": bias})[0]
        np.testing.assert_allclose(
            ours, expected, rtol=2e-6, atol=2e-6 * max(1.0, np.abs(expected).max()), err_msg=name
        )


@pytest.mark.parametrize(
    "change",
    [
        {"scale_attn_weights": False, "activation_function": "quick_gelu"},
        {"scale_attn_by_inverse_layer_idx": True, "activation_function": "relu"},
        {"activation_function": "prelu"},
        {"activation_function": "xielu"},
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_graph_follows_the_config_like_transformers(tiny_checkpoint, change):
    """The float32 graph against GPT2LMHeadModel with the same settings: full logits and the cache path."""
    from edgelm.export.load import load_checkpoint

    checkpoint = load_checkpoint(str(tiny_checkpoint))
    weights = dict(checkpoint.weights)
    config = checkpoint.config | change
    if change.get("activation_function") in ("prelu", "xielu"):  # the activation's own weights, per layer
        from transformers.activations import ACT2FN

        for i in range(checkpoint.arch.n_layer):
            for key, value in ACT2FN[change["activation_function"]].state_dict().items():
                weights[f"transformer.h.{i}.mlp.act.{key}"] = np.asarray(
                    value.float().numpy() * (1 + 0.1 * i), np.float32
                )
    arch = replace(checkpoint.arch, **{k: v for k, v in change.items()})
    full, cached, mask = _graph_logits(arch, weights, "none", IDS)
    reference = _torch_logits(_reference(config, weights), IDS, mask)
    real = mask.astype(bool)
    assert _relative_error(full[real], reference[real]) <= 1e-5
    assert _relative_error(cached, reference[:, -cached.shape[1] :]) <= 1e-5


def test_untied_variant_passes_the_export_gate(validated_variant_int8_kv8):
    """An untied head, a narrower MLP, the erf GELU and layer-scaled attention: fp32 token-exact with
    transformers, int8 (with its own quantized LM head and an int8 cache) within the usual quality."""
    manifest = json.loads((validated_variant_int8_kv8 / "manifest.json").read_text())
    arch = manifest["architecture"]
    assert {k: arch[k] for k in ("tie_word_embeddings", "n_inner", "activation_function")} == {
        "tie_word_embeddings": False,
        "n_inner": 64,
        "activation_function": "gelu",
    }
    assert arch["scale_attn_by_inverse_layer_idx"] is True and arch["scale_attn_weights"] is True
    fp32, int8 = manifest["validation"]["fp32"], manifest["validation"]["int8"]
    assert fp32["max_logits_relative_error"] <= 1e-5 and fp32["max_cache_path_relative_error"] <= 1e-5
    assert fp32["greedy_identical"]
    assert int8["top1_agreement"] >= 0.85 and int8["mean_kl_divergence"] <= 0.05 and int8["kv_cache"] == "int8"
    assert manifest["weights"]["tied_embedding_stored_once"] is False
    assert "token embedding and the LM head" in manifest["weights"]["quantization"]["covers"]
    assert "no node reads them" in manifest["graph"]["token_embeddings"]["embedding"]  # the runtime's rows alone

    graph = onnx.load(str(validated_variant_int8_kv8 / "model.onnx")).graph
    scales = [{a.name: a.f for a in n.attribute}["scale"] for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert scales == pytest.approx([1 / math.sqrt(8), 1 / math.sqrt(8) / 2])
    read = {name for n in graph.node for name in n.input}
    heads = [n for n in graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith("lm_head.weight_int8.")]
    assert heads and not any(n.op_type == "QGemm" for n in graph.node)  # the head is the products' kernel
    assert not any(name.startswith("transformer.wte.") for name in read)  # the token rows: the runtime's alone
    assert "BiasGelu" in {n.op_type for n in graph.node} and "FastGelu" not in {n.op_type for n in graph.node}


def test_untied_int8_package_runs_and_says_what_it_is(validated_variant_int8_kv8, variant_checkpoint):
    """The runtime looks tokens up in the table written for it; its greedy tokens follow transformers'."""
    import edgelm.runtime as rt
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main
    from transformers import GPT2LMHeadModel

    model = rt.load(validated_variant_int8_kv8)
    ours = model.generate("The quick brown fox", max_new_tokens=4).token_ids
    reference = GPT2LMHeadModel.from_pretrained(variant_checkpoint, attn_implementation="eager").eval()
    ids = model.encode("The quick brown fox")
    import torch

    with torch.no_grad():
        theirs = reference.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert ours[0] == theirs[0, len(ids)].item()  # the first step's top-1 (int8 may drift after)
    info = CliRunner().invoke(main, ["info", str(validated_variant_int8_kv8)]).output
    assert "MLP 64 wide, gelu; attention scale 1/sqrt(head_size) / (layer + 1); LM head a matrix of its own" in info
    assert "token embedding and LM head stored apart" in info


def test_untied_int4_has_a_head_of_its_own(variant_checkpoint, tmp_path):
    """int4: the lookup reads the token table's 4-bit copy, the LM head its own; top-1 stays with transformers."""
    from edgelm.export.load import load_checkpoint

    checkpoint = load_checkpoint(str(variant_checkpoint))
    full, _, mask = _graph_logits(checkpoint.arch, checkpoint.weights, "int4", IDS)
    reference = _torch_logits(_reference(checkpoint.config, checkpoint.weights), IDS, mask)
    real = mask.astype(bool)
    assert (full[real].argmax(-1) == reference[real].argmax(-1)).mean() >= 0.6

    from edgelm.export.families.gpt2.graph import build_decoder

    graph = build_decoder(checkpoint.arch, checkpoint.weights, "int4").model.graph
    by_op = {n.op_type: n for n in graph.node if n.op_type in ("GatherBlockQuantized",)}
    assert by_op["GatherBlockQuantized"].input[0] == "transformer.wte.weight_int4"
    head = [n for n in graph.node if n.output[0] == "logits"][0]
    assert head.op_type == "MatMulNBits" and head.input[1] == "lm_head.weight_int4"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"add_cross_attention": True}, "add_cross_attention=True: the model adds cross-attention over an encoder"),
        ({"pruned_heads": {"0": [1]}}, "pruned_heads={'0': [1]}: the model prunes attention heads"),
        ({"activation_function": "gelu_newer"}, "not one of transformers' activations; edgelm exports gelu, gelu_10"),
        ({"scale_attn_weights": "yes"}, "scale_attn_weights must be true or false, not 'yes'"),
        ({"tie_word_embeddings": False}, "lm_head.weight, which tie_word_embeddings false needs"),
    ],
    ids=["cross-attention", "pruned-heads", "activation", "flag", "untied-without-head"],
)
def test_configs_edgelm_cannot_run_are_refused_in_one_line(tiny_checkpoint, tmp_path, change, message):
    from edgelm.export.load import load_checkpoint

    with pytest.raises(ExportError, match=re.escape(message)) as error:
        load_checkpoint(str(copy_with_config(tiny_checkpoint, tmp_path / "variant", **change)))
    assert "\n" not in str(error.value)


def test_a_head_that_config_ties_but_the_weights_do_not_is_refused(tiny_checkpoint, tmp_path):
    from edgelm.export.load import load_checkpoint
    from safetensors.numpy import load_file, save_file

    folder = copy_with_config(tiny_checkpoint, tmp_path / "variant")
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + np.float32(0.5)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ExportError, match='Set "tie_word_embeddings": false in config.json'):
        load_checkpoint(str(folder))


def test_int4_pads_widths_its_blocks_cannot_split(tmp_path):
    """An MLP 40 wide, not a multiple of the 32-input blocks: its blocks are padded with zeros (MatMulNBits'
    ceil(K / block_size) blocks) and the graph computes the float32 graph's products on the stored weights."""
    from checkpoints import build_checkpoint
    from edgelm.export.int4 import Int4Options, quantize_blocks
    from edgelm.export.load import load_checkpoint

    checkpoint = load_checkpoint(str(build_checkpoint(tmp_path / "narrow", n_inner=40)))
    assert checkpoint.arch.mlp_width == 40
    int4 = Int4Options()

    def stored(name, w):  # GPT-2's Conv1D [in, out] -> the weight as the int4 graph stores it
        if name == "transformer.wte.weight":  # [V, C], the tied head's [N, K]
            return quantize_blocks(w, int4.block_size, int4.head_method, int4.head_bits).dequantized()
        return quantize_blocks(np.ascontiguousarray(w.T), int4.block_size, int4.method).dequantized().T

    rounded = {
        k: stored(k, v) if v.ndim == 2 and k != "transformer.wpe.weight" else v for k, v in checkpoint.weights.items()
    }
    full, _, mask = _graph_logits(checkpoint.arch, checkpoint.weights, "int4", IDS)
    expected, _, _ = _graph_logits(checkpoint.arch, rounded, "none", IDS)
    real = mask.astype(bool)
    assert (full.argmax(-1) == expected.argmax(-1))[real].mean() >= 0.85


def test_untied_variant_int4_records_its_quality(variant_checkpoint, tmp_path):
    """The same gate for int4 with a head of its own: fp32 parity, then the int4 figures in the manifest."""
    from edgelm.export.stages import export_model

    manifest = export_model(str(variant_checkpoint), tmp_path / "variant-int4", quantize="int4").manifest
    assert manifest["validation"]["fp32"]["greedy_identical"] and manifest["weights"]["dtype"] == "int4"
    int4 = manifest["validation"]["int4"]
    assert int4["top1_agreement"] >= 0.5 and int4["mean_kl_divergence"] <= 0.5
