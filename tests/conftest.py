"""Shared fixtures: tiny random GPT-2 checkpoints and the packages exported from them (built once per run).

The packages skip the export's comparison against PyTorch (`validate=False`), which is nearly all of an
export's time; the `validated_*` packages keep it, for the tests about the figures that comparison records."""

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared beside the checkout


PREBUILT = os.environ.get("EDGELM_TEST_PACKAGES")  # tiny-*/ exported beforehand: benchmarks/onnxruntime_matrix.sh


def _export(checkpoint, folder, **options):
    from edgelm.export.stages import export_model

    return export_model(str(checkpoint), folder, **options).path


@pytest.fixture(autouse=True)
def isolated_store(tmp_path_factory, monkeypatch):
    """Every test starts with an empty model store of its own (never the user's): commands resolve packages there."""
    monkeypatch.setenv("EDGELM_HOME", str(tmp_path_factory.mktemp("store")))


def _tiny(request, name, **options):
    """The tiny checkpoint exported with `options` into a folder called `name`; under EDGELM_TEST_PACKAGES, the
    folder of that name there (exported by a Python that has the export extra), so no export runs; a test
    that needs a package the installed onnxruntime is too old for is skipped there (test_onnxruntime_versions.py
    checks that such a package is refused)."""
    if PREBUILT:
        from edgelm.runtime.onnxruntime_compat import installed_version, version_tuple
        from edgelm.runtime.package import open_package

        folder = Path(PREBUILT) / name
        needed = open_package(folder, verify=False).min_onnxruntime
        if needed and version_tuple(installed_version()) < version_tuple(needed):
            pytest.skip(f"{name} needs onnxruntime {needed}; this is {installed_version()}")
        return folder
    checkpoint = request.getfixturevalue("tiny_checkpoint")
    return _export(checkpoint, request.getfixturevalue("tmp_path_factory").mktemp("pkg") / name, **options)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """2 layers, 4 heads, width 32, 64 positions, a 320-token byte-level BPE; safetensors weights."""
    from checkpoints import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_package(request):
    """The tiny checkpoint exported to an fp32 package."""
    return _tiny(request, "tiny-fp32", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int8(request):
    return _tiny(request, "tiny-int8", quantize="int8", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int4(request):
    return _tiny(request, "tiny-int4", quantize="int4", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int8_kv8(request):
    """int8 weights and an int8 KV cache."""
    return _tiny(request, "tiny-int8-kv8", quantize="int8", kv_cache="int8", validate=False)


@pytest.fixture(scope="session")
def validated_package(tiny_checkpoint, tmp_path_factory):
    """The fp32 package with the export's validation figures in its manifest."""
    return _export(tiny_checkpoint, tmp_path_factory.mktemp("validated") / "tiny-fp32")


@pytest.fixture(scope="session")
def validated_package_int8(tiny_checkpoint, tmp_path_factory):
    return _export(tiny_checkpoint, tmp_path_factory.mktemp("validated") / "tiny-int8", quantize="int8")


@pytest.fixture(scope="session")
def validated_package_int4(tiny_checkpoint, tmp_path_factory):
    return _export(tiny_checkpoint, tmp_path_factory.mktemp("validated") / "tiny-int4", quantize="int4")


@pytest.fixture(scope="session")
def validated_package_int8_kv8(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("validated") / "tiny-int8-kv8"
    return _export(tiny_checkpoint, folder, quantize="int8", kv_cache="int8")


@pytest.fixture(scope="module")
def model(tiny_package):
    """The fp32 tiny package, loaded."""
    import edgelm.runtime as rt

    return rt.load(tiny_package)


@pytest.fixture(scope="session")
def reference_model(tiny_checkpoint):
    """The same checkpoint in transformers (PyTorch), eager attention: the fidelity reference."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_checkpoint, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def shared_folder():
    """../shared beside the checkout (the real GPT-2 tokenizer, distilgpt2's config); tests skip without it."""
    return SHARED


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(shared_folder):
    folder = shared_folder / "gpt2-tokenizer"
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"the real GPT-2 tokenizer is not at {folder} (../shared is absent)")
    return folder


@pytest.fixture(scope="session")
def gpt2_vocab_package(gpt2_tokenizer_dir, tmp_path_factory):
    """A tiny random model over the real 50,257-token GPT-2 vocabulary, exported fp32."""
    if PREBUILT:
        return Path(PREBUILT) / "gpt2-vocab"
    from checkpoints import build_checkpoint

    folder = build_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "gpt2-vocab", n_positions=128, tokenizer_folder=gpt2_tokenizer_dir
    )
    return _export(folder, tmp_path_factory.mktemp("pkg") / "gpt2-vocab", validate=False)


# The Llama family: one tiny checkpoint and one package per family, shared by the export, runtime and server
# tests (tests/llama_checkpoints.py has the shapes). Both packages are validated against transformers: the
# export's fp32 gate is what these tests stand on.
@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    """Llama: 2 layers, 4 heads over 2 key/value heads, width 64, Llama 3 rope scaling, tied head, chat template."""
    from llama_checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama", "llama-gqa")


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory):
    """Qwen2: 2 layers, 4 heads over 1 key/value head, width 64, Q/K/V biases, rope_theta 1e6, tied head."""
    from llama_checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-qwen2", "qwen2", seed=1)


@pytest.fixture(scope="session")
def llama_package(llama_checkpoint, tmp_path_factory):
    return _export(llama_checkpoint, tmp_path_factory.mktemp("pkg") / "tiny-llama")


@pytest.fixture(scope="session")
def qwen2_package(qwen2_checkpoint, tmp_path_factory):
    return _export(qwen2_checkpoint, tmp_path_factory.mktemp("pkg") / "tiny-qwen2")
