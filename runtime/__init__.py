"""edgelm's runtime: run an exported GPT-2, Llama or Qwen2 package on onnxruntime, with no PyTorch installed.

    import edgelm.runtime as edgelm
    model = edgelm.load("models/distilgpt2")
    print(model.generate("The meaning of life is", max_new_tokens=30).text)
    for piece in model.stream("Once upon a time", max_new_tokens=40):
        print(piece, end="", flush=True)

The other names are imported on first use, so that the `edgelm` command can decide to restart itself with
huge pages (cli/launch.py) before it pays for NumPy, onnxruntime and tokenizers.

The subpackages stack in one order, written once as LAYERS in tools/layers.py: `python tools/layers.py` prints
the import graph, and tests/repository/test_layers.py fails on any import against the order.
"""

from .errors import (
    ChatError,
    DeadlineError,
    DeviceError,
    EdgelmError,
    GenerationOptionError,
    InferenceError,
    PackageError,
    PromptError,
    PromptFileError,
    QualityError,
    SessionError,
    StoreError,
)
from .lazy import lazy_getattr as _lazy_getattr

_LAZY = {
    "ChatTemplate": "text.chat_template",
    "Completion": "batching.rows",
    "GenerationConfig": "generation_config",
    "Model": "model",
    "SavedSession": "model",
    "Score": "model",
    "Stream": "model",
    "load": "model",
    "pipeline": "apps.pipeline",
    "PromptFile": "apps.prompt_file",
    "ToolCall": "text.tools",
    "tool_format": "text.tools",
}

__all__ = [
    "load",
    "pipeline",
    "Model",
    "Stream",
    "Score",
    "SavedSession",
    "Completion",
    "ChatTemplate",
    "GenerationConfig",
    "PromptFile",
    "ToolCall",
    "tool_format",
    "EdgelmError",
    "PackageError",
    "DeviceError",
    "GenerationOptionError",
    "PromptError",
    "PromptFileError",
    "ChatError",
    "InferenceError",
    "SessionError",
    "StoreError",
    "QualityError",
    "DeadlineError",
]


__getattr__ = _lazy_getattr(__name__, _LAZY, globals())


def __dir__():
    return sorted({*globals(), *_LAZY})
