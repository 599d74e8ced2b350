"""edgelm's runtime: run an exported GPT-2-family package on onnxruntime, with no PyTorch installed.

    import edgelm.runtime as edgelm
    model = edgelm.load("models/distilgpt2")
    print(model.generate("The meaning of life is", max_new_tokens=30).text)
    for piece in model.stream("Once upon a time", max_new_tokens=40):
        print(piece, end="", flush=True)
"""

from .config import GenerationConfig
from .errors import DeviceError, EdgelmError, GenerationOptionError, PackageError, PromptError
from .generation import Completion
from .model import Model, Score, Stream, load, pipeline

__all__ = [
    "load", "pipeline", "Model", "Stream", "Score", "Completion", "GenerationConfig",
    "EdgelmError", "PackageError", "DeviceError", "GenerationOptionError", "PromptError",
]
