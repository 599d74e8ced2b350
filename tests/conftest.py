"""Shared fixtures: tiny random GPT-2 checkpoints and the packages exported from them (built once per run)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """2 layers, 4 heads, width 32, 64 positions, a 320-token byte-level BPE; safetensors weights."""
    from checkpoints import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_package(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint exported to an fp32 package."""
    from edgelm.export.stages import export_model

    return export_model(str(tiny_checkpoint), tmp_path_factory.mktemp("pkg") / "tiny-fp32").path


@pytest.fixture(scope="session")
def tiny_package_int8(tiny_checkpoint, tmp_path_factory):
    from edgelm.export.stages import export_model

    return export_model(str(tiny_checkpoint), tmp_path_factory.mktemp("pkg") / "tiny-int8", quantize="int8").path


@pytest.fixture(scope="session")
def tiny_package_int4(tiny_checkpoint, tmp_path_factory):
    from edgelm.export.stages import export_model

    return export_model(str(tiny_checkpoint), tmp_path_factory.mktemp("pkg") / "tiny-int4", quantize="int4").path


@pytest.fixture(scope="session")
def reference_model(tiny_checkpoint):
    """The same checkpoint in transformers (PyTorch), eager attention: the fidelity reference."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_checkpoint, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir():
    folder = SHARED / "gpt2-tokenizer"
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"the real GPT-2 tokenizer is not at {folder} (../shared is absent)")
    return folder


@pytest.fixture(scope="session")
def gpt2_vocab_package(gpt2_tokenizer_dir, tmp_path_factory):
    """A tiny random model over the real 50,257-token GPT-2 vocabulary, exported fp32."""
    from checkpoints import build_checkpoint
    from edgelm.export.stages import export_model

    folder = build_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "gpt2-vocab", n_positions=128, tokenizer_folder=gpt2_tokenizer_dir
    )
    return export_model(str(folder), tmp_path_factory.mktemp("pkg") / "gpt2-vocab").path


@pytest.fixture(scope="session")
def tiny_package_int8_kv8(tiny_checkpoint, tmp_path_factory):
    """int8 weights and an int8 KV cache."""
    from edgelm.export.stages import export_model

    return export_model(
        str(tiny_checkpoint), tmp_path_factory.mktemp("pkg") / "tiny-int8-kv8", quantize="int8", kv_cache="int8"
    ).path
