"""Shared fixtures: tiny random GPT-2 checkpoints and the packages exported from them (built once per run).

The packages skip the export's comparison against PyTorch (`validate=False`), which is nearly all of an
export's time; the `validated_*` packages keep it, for the tests about the figures that comparison records.

The tests are grouped by the part they test (export/, model/, engine/, sampling/, text/, package/, store/,
server/, cli/, apps/, platforms/, repository/ for rules over the whole tree, benchmarks/ for the lab's own
parts); a folder's conftest.py holds what only its tests share, and tests/support/ (on pytest's path) the
helpers that tests of several folders import."""

import os
from pathlib import Path

import pytest
from built_once import build_once

SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared beside the checkout

# One PyTorch (OpenMP) thread per test process, and in the processes the tests start: the models are tiny, and
# `-n auto` already runs a worker per core, where a second spinning thread each only fights the other worker.
os.environ.setdefault("OMP_NUM_THREADS", "1")


PREBUILT = os.environ.get("EDGELM_TEST_PACKAGES")  # tiny-*/ exported beforehand: tools/ci/onnxruntime_matrix.sh


def _export(checkpoint, folder, **options):
    from edgelm.export.stages import export_model

    return export_model(str(checkpoint), folder, **options).path




@pytest.fixture(autouse=True)
def isolated_store(tmp_path_factory, monkeypatch):
    """Every test starts with an empty model store of its own (never the user's): commands resolve packages there."""
    monkeypatch.setenv("EDGELM_HOME", str(tmp_path_factory.mktemp("store")))
    monkeypatch.setenv("EDGELM_CACHE", str(tmp_path_factory.mktemp("verified")))  # package/verified.py's records


def _tiny(request, name, **options):
    """The tiny checkpoint exported with `options` into a folder called `name`; under EDGELM_TEST_PACKAGES, the
    folder of that name there (exported by a Python that has the export extra), so no export runs; a test
    that needs a package the installed onnxruntime is too old for is skipped there (test_onnxruntime_versions.py
    checks that such a package is refused)."""
    if PREBUILT:
        from edgelm.runtime.package.onnxruntime_compat import installed_version, version_tuple
        from edgelm.runtime.package.open import open_package

        folder = Path(PREBUILT) / name
        needed = open_package(folder, verify=False).min_onnxruntime
        if needed and version_tuple(installed_version()) < version_tuple(needed):
            pytest.skip(f"{name} needs onnxruntime {needed}; this is {installed_version()}")
        return folder
    checkpoint = request.getfixturevalue("tiny_checkpoint")
    return build_once(
        request.getfixturevalue("tmp_path_factory"), name, lambda folder: _export(checkpoint, folder, **options)
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """2 layers, 4 heads, width 32, 64 positions, a 320-token byte-level BPE; safetensors weights."""
    from checkpoints import build_checkpoint

    return build_once(tmp_path_factory, "tiny-gpt2", build_checkpoint)


@pytest.fixture(scope="session")
def tiny_package(request):
    """The tiny checkpoint exported to an fp32 package."""
    return _tiny(request, "tiny-fp32", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int8(request):
    return _tiny(request, "tiny-int8", quantize="int8", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int8_rows(request):
    """int8 weights per output channel, activations quantized row by row (MatMulIntegerToFloat)."""
    return _tiny(request, "tiny-int8-rows", quantize="int8-rows", validate=False)


@pytest.fixture(scope="session")
def tiny_package_int8_dynamic(request):
    """int8 weights per output channel, activations quantized per tensor (DynamicQuantizeMatMul)."""
    return _tiny(request, "tiny-int8-dynamic", quantize="int8-dynamic", validate=False)


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
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-fp32")


def _validated(checkpoint, tmp_path_factory, name, **options):
    return (
        build_once(tmp_path_factory, f"validated-{name}", lambda folder: _export(checkpoint, folder / name, **options))
        / name
    )


@pytest.fixture(scope="session")
def validated_package_int8(tiny_checkpoint, tmp_path_factory):
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-int8", quantize="int8")


@pytest.fixture(scope="session")
def validated_package_int8_rows(tiny_checkpoint, tmp_path_factory):
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-int8-rows", quantize="int8-rows")


@pytest.fixture(scope="session")
def validated_package_int8_dynamic(tiny_checkpoint, tmp_path_factory):
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-int8-dynamic", quantize="int8-dynamic")


@pytest.fixture(scope="session")
def validated_package_int4(tiny_checkpoint, tmp_path_factory):
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-int4", quantize="int4")


@pytest.fixture(scope="session")
def validated_package_int8_kv8(tiny_checkpoint, tmp_path_factory):
    return _validated(tiny_checkpoint, tmp_path_factory, "tiny-int8-kv8", quantize="int8", kv_cache="int8")


@pytest.fixture(scope="module")
def model(tiny_package):
    """The fp32 tiny package, loaded."""
    import edgelm.runtime as rt

    return rt.load(tiny_package)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store of its own under tmp_path, as store_support.make_store makes it."""
    from store_support import make_store

    return make_store(tmp_path, monkeypatch)


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

    def build(folder):
        folder.mkdir()
        checkpoint = build_checkpoint(folder / "checkpoint", n_positions=128, tokenizer_folder=gpt2_tokenizer_dir)
        _export(checkpoint, folder / "gpt2-vocab", validate=False)

    return build_once(tmp_path_factory, "gpt2-vocab", build) / "gpt2-vocab"


# The Llama family: one tiny checkpoint and one package per family, shared by the export, runtime and server
# tests (tests/support/llama_checkpoints.py has the shapes). Both packages are validated against transformers: the
# export's fp32 gate is what these tests stand on.
@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    """Llama: 2 layers, 4 heads over 2 key/value heads, width 64, Llama 3 rope scaling, tied head, chat template."""
    from llama_checkpoints import build_llama_checkpoint

    return build_once(tmp_path_factory, "tiny-llama", lambda folder: build_llama_checkpoint(folder, "llama-gqa"))


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory):
    """Qwen2: 2 layers, 4 heads over 1 key/value head, width 64, Q/K/V biases, rope_theta 1e6, tied head."""
    from llama_checkpoints import build_llama_checkpoint

    return build_once(tmp_path_factory, "tiny-qwen2", lambda folder: build_llama_checkpoint(folder, "qwen2", seed=1))


@pytest.fixture(scope="session")
def llama_package(request):
    if PREBUILT:
        return Path(PREBUILT) / "tiny-llama-pkg"
    checkpoint = request.getfixturevalue("llama_checkpoint")
    return build_once(request.getfixturevalue("tmp_path_factory"), "tiny-llama-pkg", lambda f: _export(checkpoint, f))


@pytest.fixture(scope="session")
def llama_package_int8(request):
    """The Llama checkpoint exported int8 (unvalidated)."""
    checkpoint = request.getfixturevalue("llama_checkpoint")
    build = lambda f: _export(checkpoint, f, quantize="int8", validate=False)  # noqa: E731
    return build_once(request.getfixturevalue("tmp_path_factory"), "tiny-llama-int8", build)


@pytest.fixture(scope="session")
def llama_package_int4(request):
    """The Llama checkpoint exported int4 (unvalidated)."""
    checkpoint = request.getfixturevalue("llama_checkpoint")
    build = lambda f: _export(checkpoint, f, quantize="int4", validate=False)  # noqa: E731
    return build_once(request.getfixturevalue("tmp_path_factory"), "tiny-llama-int4", build)


@pytest.fixture(scope="session")
def qwen2_package(request):
    if PREBUILT:
        return Path(PREBUILT) / "tiny-qwen2-pkg"
    checkpoint = request.getfixturevalue("qwen2_checkpoint")
    return build_once(request.getfixturevalue("tmp_path_factory"), "tiny-qwen2-pkg", lambda f: _export(checkpoint, f))


@pytest.fixture(scope="session")
def tiny_package_long(tmp_path_factory):
    """The tiny model's shape with a 1,024-position context: room for tool definitions and JSON schemas in a
    prompt (the server's tool and structured-output tests), exported fp32."""
    if PREBUILT:
        return Path(PREBUILT) / "tiny-long"
    from checkpoints import build_checkpoint

    def build(folder):
        folder.mkdir()
        checkpoint = build_checkpoint(folder / "checkpoint", n_positions=1024)
        _export(checkpoint, folder / "tiny-long", validate=False)

    return build_once(tmp_path_factory, "tiny-long", build) / "tiny-long"


@pytest.fixture(scope="session")
def layout_package(tmp_path_factory):
    """`layout_package(name)`: a tiny model whose tokenizer and chat template are laid out as family `name`'s
    ("qwen2.5", "llama3.2", "smollm2": their added tokens, Qwen2.5's `<tool_call>` among them as text, its padded
    logits, their end ids; tests/support/tokenizer_layouts.py), with 2,048 positions for tools in the prompt; exported fp32
    without validation, once per run."""

    def package(name: str) -> Path:
        if PREBUILT:
            return Path(PREBUILT) / f"tiny-{name}"
        from llama_checkpoints import build_llama_checkpoint
        from tokenizer_layouts import build_layout, eos_ids, logits_size

        def build(folder):
            layout = build_layout(folder / "tokenizer", name)
            ends = list(eos_ids(layout, name))
            checkpoint = build_llama_checkpoint(
                folder / "checkpoint",
                "qwen2" if name == "qwen2.5" else "llama-gqa",
                n_positions=2048,
                seed=2,
                chat_template=None,  # the layout's own
                tokenizer_folder=layout,
                vocab_size=logits_size(layout, name),
                eos_token_id=ends,
            )
            _export(checkpoint, folder / f"tiny-{name}", validate=False)

        return build_once(tmp_path_factory, f"tiny-{name}", build) / f"tiny-{name}"

    return package
