"""The int4 recipe's options (export/int4.py): block size, rounding method and the head's bits. Each exports a
package that loads and generates, records itself in the manifest and computes what its stored weights say; bad
values are refused with one line; the clipping search never does worse than plain rounding on any block."""

import json

import numpy as np
import onnx
import pytest
from checkpoints import graph_bytes
from edgelm.export.errors import ExportError
from edgelm.export.int4 import BLOCK_SIZES, Int4Options, block_error, clip, quantize_blocks, rtn
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

OPTIONS = [  # (block size, method, head bits): every block size and every method at least once
    (16, "rtn", 4),
    (32, "clip", 4),
    (64, "kquant", 4),
    (128, "rtn", 4),  # wider than the tiny model's 32 inputs: one padded block
    (32, "hqq", 4),
    (32, "gptq", 4),
    (32, "clip", 8),
]


@pytest.mark.parametrize("block_size, method, head_bits", OPTIONS)
def test_each_option_exports_a_package_that_loads_and_generates(
    tiny_checkpoint, tiny_package, tmp_path, block_size, method, head_bits
):
    from edgelm.export import export_model
    from edgelm.runtime import load

    options = Int4Options(block_size=block_size, method=method, head_bits=head_bits)
    result = export_model(str(tiny_checkpoint), tmp_path / "p", quantize="int4", int4=options, validate=False)
    recorded = json.loads((result.path / "manifest.json").read_text())["weights"]["quantization"]
    assert (recorded["block_size"], recorded["rounding"], recorded["head_bits"]) == (block_size, method, head_bits)
    assert recorded["symmetric"] == (method not in ("kquant", "hqq"))
    graph = onnx.load(str(result.path / "model.onnx")).graph
    for node in graph.node:
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized"):
            attributes = {a.name: a.i for a in node.attribute}
            head = node.op_type == "GatherBlockQuantized" or node.output[0] == "logits"
            assert attributes["block_size"] == block_size and attributes["bits"] == (head_bits if head else 4)
    completion = load(result.path).generate("Hello", max_new_tokens=6, min_new_tokens=6)
    assert len(completion.token_ids) == 6
    if block_size <= 32 and head_bits == 4:  # no padding on the 32-wide model: 4-bit codes and their block scales
        # float32 tables, norms and biases stay; 16 and hqq carry more per block
        assert graph_bytes(result.path) < graph_bytes(tiny_package) / 3


@pytest.mark.parametrize("options", [(16, "kquant", 4), (128, "hqq", 4), (64, "clip", 8), (32, "rtn", 8)])
def test_the_graph_computes_its_stored_weights(qwen2_checkpoint, options):
    """The int4 graph computes what the float32 graph computes on the weights as stored (dequantized), up to its
    int8 activations: codes, scales, zero points (uint8 and float), 8-bit heads and padded blocks are read as
    written. Qwen2's 64-wide model pads its 128-blocks; its embedding is tied (one copy for lookup and head)."""
    from edgelm.export.families.llama.graph import build_decoder
    from edgelm.export.load import load_checkpoint
    from edgelm.export.validate import _engine
    from edgelm.export.weights_file import split_weights

    int4 = Int4Options(*options)
    checkpoint = load_checkpoint(str(qwen2_checkpoint))

    def stored(name, w):  # [N, K] -> the same shape, as the int4 graph stores it
        head = name == "model.embed_tokens.weight"
        bits, method = (int4.head_bits, int4.head_method) if head else (4, int4.method)
        return quantize_blocks(w, int4.block_size, method, bits).dequantized()

    rounded = {k: stored(k, v) if v.ndim == 2 else v for k, v in checkpoint.weights.items()}
    ids = np.random.default_rng(0).integers(0, checkpoint.arch.vocab_size, size=(1, 40))
    logits = []
    for weights, recipe in ((rounded, "none"), (checkpoint.weights, "int4")):
        decoder = build_decoder(checkpoint.arch, weights, recipe, int4=int4)
        engine = _engine(split_weights(decoder.model.SerializeToString(), decoder.arrays), checkpoint.arch)
        ones = np.ones_like(ids)
        logits.append(engine.forward(ids, ones, np.arange(40)[None], engine.empty_past(1), logits_to_keep=0)[0])
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).mean() >= 0.85
    spread = logits[0].std()
    assert np.abs(logits[0] - logits[1]).mean() < 0.1 * spread


def test_bad_options_are_refused_with_one_line(tiny_checkpoint, tmp_path):
    from click.testing import CliRunner
    from edgelm.export import export_model
    from edgelm.runtime.cli.main import main

    for bad, words in (
        (dict(block_size=48), "int4 block size 48 is not one of 16, 32, 64, 128."),
        (dict(method="awq"), "int4 method 'awq' is not one of rtn, clip, kquant, hqq, gptq."),
        (dict(head_bits=6), "int4 head bits 6 is not one of 4, 8."),
        (dict(block_size=True), "int4 block size True is not one of"),
    ):
        with pytest.raises(ExportError) as refused:
            Int4Options(**bad)
        assert str(refused.value).startswith(words) and "\n" not in str(refused.value)
    with pytest.raises(ExportError, match=r"int4 options go with quantize='int4' \(--quantize int4\), not 'int8'"):
        export_model(str(tiny_checkpoint), tmp_path / "a", quantize="int8", int4=Int4Options())
    with pytest.raises(ExportError, match="int4 must be an Int4Options"):
        export_model(str(tiny_checkpoint), tmp_path / "b", quantize="int4", int4={"block_size": 64})
    export = ["export", str(tiny_checkpoint), "-o", str(tmp_path / "c")]
    wrong = CliRunner().invoke(main, [*export, "--quantize", "int8", "--int4-method", "rtn", "--int4-head", "8"])
    assert (
        wrong.exit_code == 2
        and "--int4-method, --int4-head go with --quantize int4, not --quantize int8." in wrong.output
    )
    unknown = CliRunner().invoke(main, [*export, "--quantize", "int4", "--int4-block", "48"])
    assert unknown.exit_code == 2 and "'48' is not one of '16', '32', '64', '128'" in unknown.output
    for result in (wrong, unknown):
        assert "Traceback" not in result.output
    assert not (tmp_path / "c").exists()


def test_the_export_command_takes_the_int4_options(tiny_checkpoint, tmp_path):
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    made = CliRunner().invoke(
        main,
        ["export", str(tiny_checkpoint), "-o", str(tmp_path / "p"), "--quantize", "int4", "--no-validate"]
        + ["--int4-block", "64", "--int4-method", "kquant", "--int4-head", "8"],
    )
    assert made.exit_code == 0, made.output
    recorded = json.loads((tmp_path / "p" / "manifest.json").read_text())["weights"]["quantization"]
    assert (recorded["block_size"], recorded["rounding"], recorded["head_bits"]) == (64, "kquant", 8)
    info = CliRunner().invoke(main, ["info", str(tmp_path / "p")])
    assert "4-bit, kquant, one float32 scale and a 4-bit zero point per block of 64 inputs" in info.output


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float32, st.tuples(st.integers(1, 6), st.sampled_from(BLOCK_SIZES)), elements=st.floats(-1e3, 1e3, width=32)
    ),  # fmt: skip
    st.sampled_from((4, 8)),
)
def test_the_clipping_search_never_does_worse_than_rounding(blocks, bits):
    rounded = block_error(blocks, *rtn(blocks, bits)[:2], bits)
    searched = block_error(blocks, *clip(blocks, bits)[:2], bits)
    assert np.all(searched <= rounded)


def test_clipping_helps_blocks_with_an_outlier():
    """Gaussian blocks with one large weight each: the search trades the outlier's error for everyone else's."""
    blocks = np.random.default_rng(3).normal(size=(256, 32)).astype(np.float32)
    blocks[:, 0] *= 6
    rounded = block_error(blocks, *rtn(blocks, 4)[:2], 4).sum()
    assert block_error(blocks, *clip(blocks, 4)[:2], 4).sum() < 0.9 * rounded


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("method", ["rtn", "clip", "kquant", "hqq"])
def test_widths_that_are_not_a_multiple_of_the_block_are_padded(block_size, method):
    """[N, 40] at blocks of 16 (2.5 blocks) and 128 (one block, mostly padding): the tail is padded with zeros,
    and the stored weights come back at [N, 40] within half a step of each weight's block."""
    weight = np.random.default_rng(1).normal(size=(8, 40)).astype(np.float32)
    stored = quantize_blocks(weight, block_size, method)
    assert stored.codes.shape == (8, -(-40 // block_size), block_size) and stored.scale.shape == stored.codes.shape[:2]
    assert stored.packed.shape == (8, stored.codes.shape[1], block_size // 2)
    restored = stored.dequantized()
    assert restored.shape == weight.shape
    if method == "clip":  # clips on purpose: judged by its squared error, no worse than plain rounding's
        plain = quantize_blocks(weight, block_size, "rtn").dequantized()
        assert np.square(restored - weight).sum() <= np.square(plain - weight).sum()
        return
    step = np.repeat(stored.scale, block_size, axis=1)[:, :40]
    # hqq moves its zero point off the grid's centre; kquant tries scales up to 15.9 levels per range, which clip
    slack = {"rtn": 0.5, "hqq": 1.0, "kquant": 1.5}[method]
    assert np.all(np.abs(restored - weight) <= slack * step + 1e-6)


def test_gptq_lowers_the_output_error_on_correlated_inputs():
    """GPTQ's aim: a smaller error in X @ W^T than rounding each weight alone, for inputs X whose features are
    correlated (as activations are). Its codes and scales are the symmetric layout MatMulNBits reads."""
    from edgelm.export.gptq import gptq
    from edgelm.export.int4 import padded_blocks

    rng = np.random.default_rng(0)
    mix = rng.normal(size=(64, 64))
    x = rng.normal(size=(2048, 64)) @ mix  # [T, K], correlated features
    weight = rng.normal(size=(24, 64)).astype(np.float32)
    hessian = 2 * x.T @ x / len(x)
    codes, scale = gptq(padded_blocks(weight, 32), hessian, 4)
    assert codes.dtype == np.uint8 and codes.max() <= 15 and scale.shape == (24, 2)
    by_gptq = quantize_blocks(weight, 32, "gptq", 4, hessian).dequantized()
    by_clip = quantize_blocks(weight, 32, "clip", 4).dequantized()
    error = {name: np.square(x @ (w - weight).T).mean() for name, w in (("gptq", by_gptq), ("clip", by_clip))}
    assert error["gptq"] < 0.8 * error["clip"]


def test_gptq_hessians_come_from_every_block_product(tiny_checkpoint, tiny_package):
    """One [K, K] symmetric, positive semi-definite Hessian per block product, named by its weight."""
    from edgelm.export.calibrate import calibration_rows
    from edgelm.export.families.gpt2.graph import build_decoder
    from edgelm.export.gptq import calibration_hessians
    from edgelm.export.load import load_checkpoint
    from edgelm.export.weights_file import split_weights
    from tokenizers import Tokenizer

    checkpoint = load_checkpoint(str(tiny_checkpoint))
    arch = checkpoint.arch
    decoder = build_decoder(arch, checkpoint.weights, "none")
    graph = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    tokenizer = Tokenizer.from_file(str(tiny_package / "tokenizer.json"))
    hessians = calibration_hessians(graph, calibration_rows(tokenizer, arch), arch)
    products = {"attn.c_attn": arch.n_embd, "attn.c_proj": arch.n_embd, "mlp.c_fc": arch.n_embd}
    products["mlp.c_proj"] = arch.mlp_width
    expected = {f"transformer.h.{i}.{p}.weight": k for i in range(arch.n_layer) for p, k in products.items()}
    assert {k: len(h) for k, h in hessians.items()} == expected
    for h in hessians.values():
        assert np.allclose(h, h.T) and np.linalg.eigvalsh(h).min() > -1e-6 * np.abs(h).max()
