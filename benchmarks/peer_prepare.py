"""Each peer system's model for benchmarks/peers.py, converted once from the checkpoint and cached under
benchmarks/out/peers/CHECKPOINT_FOLDER_NAME/SYSTEM.

onnxruntime-genai's model comes from optimum's export for GPT-2 (genai has no GPT-2 builder; its "llama" type is a
plain decoder loop that runs optimum's graph as it is), and from genai's own model builder
(`python -m onnxruntime_genai.models.builder`) for every other family: its Llama graph, int8 and int4 weights
as MatMulNBits (accuracy_level 4, blocks of 32: the builder's defaults for the CPU); at int8 a tied LM head is
kept apart from the token table (shared_embeddings=false), which the builder cannot share at 8 bits.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "peers"


def prepare(system: str, checkpoint: Path) -> Path:
    system = system.removesuffix("-nofa")  # the same model, run without flash attention
    kind, _, variant = system.partition("-")
    target = OUT / checkpoint.resolve().name / system
    if kind in ("transformers",):
        return checkpoint
    if target.exists():
        return target
    if kind == "edgelm":
        from edgelm.export.stages import export_model

        # int8-kv8: int8 weights and an int8 KV cache; int8-dynamic: that recipe, float32 cache
        weights, cache = (variant[: -len("-kv8")], "kv8") if variant.endswith("-kv8") else (variant, "")
        export_model(
            str(checkpoint),
            target,
            quantize={"fp32": "none"}.get(weights, weights),
            kv_cache="int8" if cache == "kv8" else "float32",
        )
    elif kind == "genai" and _model_type(checkpoint) != "gpt2":
        _prepare_genai_builder(checkpoint, target, variant)
    elif kind in ("optimum", "genai"):
        if variant not in ("fp32", "int8"):
            raise RuntimeError(f"{system} needs a Llama-family checkpoint: genai's model builder has no GPT-2")
        _prepare_onnx_peer(checkpoint, target, int8=variant == "int8")
    elif kind == "ct2":
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(checkpoint)).convert(str(target), quantization=variant)
    elif kind == "llama.cpp":
        _prepare_gguf(checkpoint, target, variant)
    return target


def _prepare_onnx_peer(checkpoint: Path, target: Path, int8: bool) -> None:
    base = target.parent / "optimum-fp32"
    if not base.exists():
        from optimum.exporters.onnx import main_export

        main_export(str(checkpoint), output=str(base), task="text-generation-with-past", no_post_process=True)
    if target == base:
        return
    shutil.copytree(base, target)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(base / "model.onnx"), str(target / "model.onnx"), weight_type=QuantType.QInt8)
    config = json.loads((checkpoint / "config.json").read_text())
    layers, heads, width = config["n_layer"], config["n_head"], config["n_embd"]
    # onnxruntime-genai has no GPT-2 type; "llama" is its plain decoder loop and runs optimum's graph as it is.
    (target / "genai_config.json").write_text(
        json.dumps(
            {
                "model": {
                    "type": "llama",
                    "context_length": config["n_positions"],
                    "vocab_size": config["vocab_size"],
                    "bos_token_id": config["bos_token_id"],
                    "eos_token_id": config["eos_token_id"],
                    "pad_token_id": config["eos_token_id"],
                    "decoder": {
                        "filename": "model.onnx",
                        "head_size": width // heads,
                        "hidden_size": width,
                        "num_attention_heads": heads,
                        "num_hidden_layers": layers,
                        "num_key_value_heads": heads,
                        "inputs": {
                            "input_ids": "input_ids",
                            "attention_mask": "attention_mask",
                            "position_ids": "position_ids",
                            "past_key_names": "past_key_values.%d.key",
                            "past_value_names": "past_key_values.%d.value",
                        },
                        "outputs": {
                            "logits": "logits",
                            "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value",
                        },
                    },
                },
                "search": {
                    "max_length": config["n_positions"],
                    "do_sample": False,
                    "num_beams": 1,
                    "past_present_share_buffer": False,
                },
            },
            indent=2,
        )
    )


def _prepare_gguf(checkpoint: Path, target: Path, variant: str) -> None:
    """convert_hf_to_gguf.py ships in llama-cpp-python's sdist; quantize with the bindings' own call."""
    f32 = target.parent / "llama.cpp-f32" / "model.gguf"
    if not f32.exists():
        source = OUT / "llama-cpp-src"
        if not source.exists():
            import tarfile

            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-d",
                    str(OUT / "sdist"),
                    "llama-cpp-python==0.3.36",
                ],
                check=True,
            )
            with tarfile.open(next((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))) as tar:
                tar.extractall(source)
        script = next(source.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
        if _model_type(checkpoint) != "gpt2":
            try:
                import sentencepiece  # noqa: F401
            except ImportError:
                raise RuntimeError(
                    "convert_hf_to_gguf.py imports sentencepiece for this architecture even with a BPE tokenizer: "
                    "pip install sentencepiece"
                ) from None
        f32.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")}
        subprocess.run(
            [sys.executable, str(script), str(checkpoint), "--outtype", "f32", "--outfile", str(f32)],
            check=True,
            env=env,
        )
    if variant == "f32":
        return
    import llama_cpp

    target.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[variant]
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(target / "model.gguf").encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize to {variant}")


def _prepare_genai_builder(checkpoint: Path, target: Path, precision: str) -> None:
    """genai's model builder: -p fp32 / int8 / int4, CPU; its temporary files go beside the target."""
    scratch = target.parent / "genai-builder-cache"
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(target)]
    command += ["-p", precision, "-e", "cpu", "-c", str(scratch)]
    if precision == "int8":
        # A tied head shares its quantized matrix with the token lookup, whose GatherBlockQuantized is 4-bit
        # only: at int8 the builder (0.15.2) writes a graph that reads a 4-bit weight it never wrote.
        command += ["--extra_options", "shared_embeddings=false"]
    subprocess.run(command, check=True)
    shutil.rmtree(scratch, ignore_errors=True)


def _model_type(checkpoint: Path) -> str:
    return json.loads((checkpoint / "config.json").read_text())["model_type"]
