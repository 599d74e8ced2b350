"""tools/graph_variants.py's decode-step levers rewrite a package into one that decodes what it did: rotary
inside GroupQueryAttention and attention without the bias (float32, batch 1: the same tokens and
log-probabilities), int8-rows' products as 8-bit MatMulNBits, the tied int8 head as one
8-bit MatMulNBits over the same rows, the 8-bit products requantized to another block size, and the 8-bit
products as the custom op of benchmarks/custom_op/ over the same inputs (its numbers are checked against
MatMulNBits by benchmarks/custom_op/check.py, which needs the library built)."""

import subprocess
import sys
from pathlib import Path

import edgelm.runtime as rt
import numpy as np
import onnx
import pytest
import step_profile
from onnx import numpy_helper

VARIANTS = Path(__file__).resolve().parents[2] / "tools" / "graph_variants.py"
PROMPTS = ["Hello there", "Once upon a time, in a land far away", "The"]


def variant(package, out, *args):
    subprocess.run([sys.executable, str(VARIANTS), str(package), str(out), *args], check=True, capture_output=True)
    return out


def greedy_alone(package):
    """Each prompt decoded greedily at batch 1: (token ids, their log-probabilities)."""
    model = rt.load(package)
    runs = [model.generate([p], max_new_tokens=12, ignore_eos=True, logprobs=1)[0] for p in PROMPTS]
    return [(c.token_ids, [entry["logprob"] for entry in c.logprobs]) for c in runs]


def initializers(package):
    """name -> array of the package's graph, external data read from its own files."""
    model = onnx.load(str(package / "model.onnx"))
    return model, {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_int8_nbits_makes_each_row_product_one_8bit_nbits_product_within_half_a_step(
    tiny_package_int8_rows, tmp_path
):
    out = variant(tiny_package_int8_rows, tmp_path / "blocks", "--variant", "int8-nbits", "--block", "32")
    model, arrays = initializers(out)
    _, before = initializers(tiny_package_int8_rows)
    ops = [n.op_type for n in model.graph.node]
    rows = [n for n in onnx.load(str(tiny_package_int8_rows / "model.onnx"), load_external_data=False).graph.node
            if n.op_type == "MatMulIntegerToFloat"]  # fmt: skip
    assert "MatMulIntegerToFloat" not in ops and ops.count("MatMulNBits") == len(rows) > 0
    assert ops.count("QuantizeLinear") == 1  # the LM head's row quantization stays
    for node in (n for n in model.graph.node if n.op_type == "MatMulNBits"):
        old = next(r for r in rows if node.input[1] == r.input[1] + ".nbits")
        was = before[old.input[1]].astype(np.float32) * before[old.input[3]]  # [K, N]
        scale = arrays[node.input[2]].reshape(was.shape[1], -1)  # [N, K / 32]
        now = (arrays[node.input[1]].astype(np.float32) - 128) * scale[..., None]  # [N, K / 32, 32]
        step = np.repeat(scale, 32, axis=1)
        assert np.all(np.abs(now.reshape(was.shape[1], -1) - was.T) <= step / 2 * (1 + 1e-5))
    # a variant of that variant reads the first one's data file and writes its own
    again = variant(out, tmp_path / "again", "--variant", "nbits", "--block", "64")
    assert {"variant.data", "variant-2.data"} <= {f.name for f in again.iterdir()}
    greedy = dict(do_sample=False, ignore_eos=True, max_new_tokens=12)
    for package in (out, again):
        model = rt.load(package)
        alone = [model.generate(prompt, **greedy).token_ids for prompt in PROMPTS]
        assert [c.token_ids for c in model.generate(PROMPTS, **greedy)] == alone


def test_rotary_inside_attention_decodes_the_same_float32_tokens_at_batch_1(llama_package, tmp_path):
    out = variant(llama_package, tmp_path / "rotary", "--variant", "rotary-in-attention")
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node]
    assert "RotaryEmbedding" not in ops
    assert greedy_alone(out) == greedy_alone(llama_package)  # exact: tokens and log-probabilities


def test_attention_without_the_bias_decodes_the_same_float32_tokens_at_batch_1(llama_package, tmp_path):
    out = variant(llama_package, tmp_path / "no-bias", "--variant", "no-attention-bias")
    nodes = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
    assert {n.op_type for n in nodes}.isdisjoint({"Range", "LessOrEqual", "And"})  # the bias's nodes are gone
    assert all(len(n.input) <= 10 for n in nodes if n.op_type == "GroupQueryAttention")
    assert greedy_alone(out) == greedy_alone(llama_package)


def test_the_int8_head_as_one_nbits_product_keeps_the_rows_and_the_tokens(tiny_package_int8_rows, tmp_path):
    tiny_package_int8 = tiny_package_int8_rows  # a QGemm head over 7-bit rows (the int8 recipe's is MatMulNBits)
    out = variant(tiny_package_int8, tmp_path / "head", "--variant", "int8-head-nbits")
    model, arrays = initializers(out)
    ops = [n.op_type for n in model.graph.node]
    assert "QGemm" not in ops and ops.count("QuantizeLinear") == ops.count("MatMulIntegerToFloat")  # the head's gone
    head = next(n for n in model.graph.node if "logits" in n.output)
    assert head.op_type == "MatMulNBits"
    _, before = initializers(tiny_package_int8)
    rows = [before[name] for name in sorted(before) if name.startswith("transformer.wte.weight_int8.")]
    scales = [before[name] for name in sorted(before) if name.startswith("transformer.wte.weight_scale.")]
    expected = np.concatenate(rows).astype(np.float32) * np.concatenate(scales)[:, None]  # [V, C]
    codes, scale = arrays[head.input[1]], arrays[head.input[2]]
    weights = (codes.astype(np.float32) - 128) * scale[..., None]
    np.testing.assert_array_equal(weights.reshape(expected.shape), expected)
    assert [tokens for tokens, _ in greedy_alone(out)] == [tokens for tokens, _ in greedy_alone(tiny_package_int8)]


def test_int8_products_requantized_to_blocks_of_32_stay_within_half_a_step(llama_package_int8, tmp_path):
    out = variant(llama_package_int8, tmp_path / "block32", "--variant", "nbits", "--block", "32")
    model, arrays = initializers(out)
    _, before = initializers(llama_package_int8)
    products = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert products and all(
        {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["block_size"] == 32 for n in products
    )
    for node in products:
        k = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["K"]
        assert all(name.endswith(".block32") for name in node.input[1:3])  # the recipe's 64 requantized
        old_codes, old_scale = (before[name.removesuffix(".block32")] for name in node.input[1:3])
        was = ((old_codes.astype(np.float32) - 128) * old_scale[..., None]).reshape(len(old_scale), -1)[:, :k]
        scale = arrays[node.input[2]].reshape(len(old_scale), -1)
        now = ((arrays[node.input[1]].astype(np.float32) - 128) * scale[..., None]).reshape(len(scale), -1)[:, :k]
        step = np.repeat(scale, 32, axis=1)[:, :k]
        assert np.all(np.abs(now - was) <= step / 2 * (1 + 1e-5))  # a tie rounds either way within float error
    rt.load(out).generate(PROMPTS[:1], max_new_tokens=2)  # onnxruntime runs it


def test_a_variant_refuses_a_package_it_does_not_apply_to(llama_package, tmp_path):
    run = subprocess.run(
        [sys.executable, str(VARIANTS), str(llama_package), str(tmp_path / "x"), "--variant", "int8-head-nbits"],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "it has no QGemm" in run.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("level", ["1", "4"])
def test_nbits_sets_the_accuracy_level_of_every_product(llama_package_int8, tmp_path, level):
    out = variant(llama_package_int8, tmp_path / f"level{level}", "--variant", "nbits", "--accuracy-level", level)
    nodes = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
    levels = {
        onnx.helper.get_attribute_value(a) for n in nodes if n.op_type == "MatMulNBits" for a in n.attribute
        if a.name == "accuracy_level"
    }
    assert levels == {int(level)}
    rt.load(out).generate(PROMPTS[:1], max_new_tokens=2)


def attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_custom_int8_names_the_custom_op_over_each_products_own_inputs(tiny_package_int8, tmp_path):
    refused = subprocess.run(
        [sys.executable, str(VARIANTS), str(tiny_package_int8), str(tmp_path / "x"), "--variant", "custom-int8"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "--variant nbits --block 32" in refused.stderr  # the recipe's blocks of 64
    blocks32 = variant(tiny_package_int8, tmp_path / "blocks32", "--variant", "nbits", "--block", "32")
    out = variant(blocks32, tmp_path / "custom", "--variant", "custom-int8")
    model, arrays = initializers(out)
    _, blocks_arrays = initializers(blocks32)
    assert {"MatMulNBits", "QGemm"}.isdisjoint(n.op_type for n in model.graph.node)
    assert ("edgelm", 1) in {(o.domain, o.version) for o in model.opset_import}
    custom = {n.name: n for n in model.graph.node if n.op_type == "Q8MatMul"}
    products = [n for n in onnx.load(str(blocks32 / "model.onnx"), load_external_data=False).graph.node]
    products = [n for n in products if n.op_type == "MatMulNBits"]
    assert len(custom) == len(products) > 1  # the blocks' products and the head
    for node in products:
        rewritten = custom[node.name]
        assert rewritten.domain == "edgelm"
        assert list(rewritten.input) == list(node.input) and list(rewritten.output) == list(node.output)
        expected = {k: v for k, v in attributes(node).items() if k != "accuracy_level"}
        assert attributes(rewritten) == expected and expected["bits"] == 8 and expected["block_size"] == 32
        for name in rewritten.input[1:]:
            np.testing.assert_array_equal(arrays[name], blocks_arrays[name])
    assert any(n.output[0] == "logits" for n in custom.values())


def test_custom_int8_leaves_4_bit_products_to_matmulnbits(llama_package_int4, tmp_path):
    out = variant(llama_package_int4, tmp_path / "custom", "--variant", "custom-int8")
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node]
    assert "Q8MatMul" not in ops and "MatMulNBits" in ops


def test_step_profile_registers_a_custom_op_library_rather_than_a_config_entry(tiny_package, tmp_path):
    missing = tmp_path / "libmissing.so"
    with pytest.raises(Exception, match="libmissing.so"):
        step_profile.make_session(tiny_package / "model.onnx", 1, {"custom_ops": str(missing)}, None)


def test_step_profile_times_the_prompt_pass_apart_from_the_steps(tiny_package_int8):
    session = step_profile.make_session(tiny_package_int8 / "model.onnx", 1, {}, None)  # fed rows, not ids
    prompt, cpu = [], []
    step = step_profile.run_steps(session, 6, 2, np.random.default_rng(0), cpu, prompt=prompt)
    assert len(prompt) == 1 and prompt[0] > 0 and step > 0 and len(cpu) == 1


def test_step_profile_keeps_the_last_positions_logits_as_the_runtime_does(tiny_package_int8):
    session = step_profile.make_session(tiny_package_int8 / "model.onnx", 1, {}, None)
    cache = [v for v in session.get_inputs() if v.name.startswith("past_key_values.")]
    past = {v.name: np.zeros((1, v.shape[1], 0, v.shape[3]), np.float32) for v in cache}
    feeds = step_profile.feeds_for(session, past, 6, 0, np.random.default_rng(0))
    assert session.run(["logits"], feeds)[0].shape[1] == 1  # a prompt of 6 positions, the head over the last
