"""Every family (GPT-2, Llama, Qwen2), tied and untied, exports at every recipe: float32, int8, int8-dynamic and
int4 at each block size and head width. Each package is validated against transformers (the stage where
onnxruntime first reads the quantized graph), loads in the runtime and generates; no initializer of its graph is
left unread (onnxruntime drops such a weight, then refuses it by name when it is handed in from memory).

The untied checkpoints are 128 wide, so that int4's per-block zero points of the token table (kquant, blocks of
16) pass builder.py's INLINE_BELOW and travel as external data, as they do in a real model."""

import json

import onnx
import pytest
from edgelm.export.int4 import BLOCK_SIZES, HEAD_BITS, Int4Options

CHECKPOINTS = {  # name -> (builder, its settings)
    "gpt2-tied": ("gpt2", dict(n_embd=32)),
    "gpt2-untied": ("gpt2", dict(n_embd=128, tie_word_embeddings=False)),
    "llama-tied": ("llama-gqa", dict()),
    "llama-untied": ("llama-untied", dict(hidden_size=128)),
    "qwen2-tied": ("qwen2", dict()),
    "qwen2-untied": ("qwen2", dict(hidden_size=128, tie_word_embeddings=False)),
}
# int4: every block size and both head widths, each at least once (head 4 with blocks of 16: the untied table's
# zero points are external data)
INT4 = [(16, 4), (32, 8), (64, 4), (128, 8)]
RECIPES = [("none", None), ("int8", None), ("int8-dynamic", None)] + [("int4", options) for options in INT4]


def test_the_int4_cases_cover_every_block_size_and_head_width():
    assert {b for b, _ in INT4} == set(BLOCK_SIZES) and {h for _, h in INT4} == set(HEAD_BITS)


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    """One tiny checkpoint per family and tying, built once and shared by every recipe."""
    from built_once import build_once

    shape, settings = CHECKPOINTS[request.param]

    def build(folder):
        if shape == "gpt2":
            from checkpoints import build_checkpoint

            build_checkpoint(folder, **settings)
        else:
            from llama_checkpoints import build_llama_checkpoint

            build_llama_checkpoint(folder, shape, **settings)

    folder = build_once(tmp_path_factory, f"matrix-{request.param}", build)
    tied = json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", True)
    assert tied == request.param.endswith("-tied")
    return folder


@pytest.mark.parametrize("recipe, int4", RECIPES, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else v)
def test_every_family_exports_validates_and_generates(checkpoint, tmp_path, recipe, int4):
    from edgelm.export import export_model
    from edgelm.runtime import load

    options = None if int4 is None else Int4Options(block_size=int4[0], head_bits=int4[1])
    eval_tokens = {} if recipe == "none" else {"eval_tokens": 2048}
    result = export_model(str(checkpoint), tmp_path / "p", quantize=recipe, int4=options, **eval_tokens)

    validation = result.manifest["validation"]
    assert validation["fp32"]["greedy_identical"] is True
    if recipe != "none":
        assert 0 <= validation[recipe]["top1_agreement"] <= 1
    graph = onnx.load(str(result.path / "model.onnx"), load_external_data=False).graph
    read = {name for node in graph.node for name in node.input}
    assert [t.name for t in graph.initializer if t.name not in read] == []
    completion = load(result.path).generate("Hello", max_new_tokens=4, min_new_tokens=4)
    assert len(completion.token_ids) == 4
