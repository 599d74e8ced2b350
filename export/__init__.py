"""edgelm.export: a Hugging Face checkpoint in, a validated, self-describing model package out (`edgelm export`).

    from edgelm.export import export_model
    export_model("distilgpt2", "models/distilgpt2-int8", quantize="int8")
    export_model("distilgpt2", "models/distilgpt2-int4", quantize="int4", int4=Int4Options(block_size=32))
    add_prompt_cache("models/distilgpt2-int8", system_prompt)  # a system prompt's start, prefilled, in the package

The stages (stages.py) read the checkpoint (checkpoint.py, load.py, checkpoint_files.py), ask its architecture
family (families/) to build the decoder from the graph kit (graph/), quantize (quantize.py, int4.py, gptq.py,
calibrate.py), validate against PyTorch (reference.py, validate.py) and write the package (weights_file.py,
manifest.py, writer.py). The names below are imported on first use, so
importing the package (or `edgelm export --help`) loads neither torch nor onnx.
"""

import importlib

_NAMES = {
    "export_model": "stages",
    "ExportResult": "stages",
    "ExportError": "errors",
    "ParityError": "errors",
    "Int4Options": "int4",
    "add_prompt_cache": "prompt_cache",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
