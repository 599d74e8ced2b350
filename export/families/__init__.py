"""The architecture families edgelm exports, one subpackage each behind one interface (family.py), and the one
place a checkpoint's family is chosen: from its config.json's model_type.

    gpt2/   GPT-2 (model_type 'gpt2')
    llama/  Llama and Qwen2 (model_type 'llama', 'qwen2')
"""

from pathlib import Path

from ..errors import ExportError
from .family import Family
from .gpt2 import GPT2
from .llama import LLAMA

FAMILIES = (GPT2, LLAMA)
MODEL_TYPES = {model_type: family for family in FAMILIES for model_type in family.reference_classes}
SUPPORTED = ", ".join(family.described for family in FAMILIES)


def family_for(model_type: str) -> Family:
    """The family that exports model_type's checkpoints (an Architecture's model_type always has one)."""
    return MODEL_TYPES[model_type]


def family_of_config(config: dict, folder: Path) -> Family:
    """The family of a checkpoint's config.json, or ExportError naming what edgelm exports."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ExportError(
            f"{folder.name} is a '{model_type}' model ({', '.join(map(str, config.get('architectures') or []))}); edgelm exports {SUPPORTED}."
        )
    return MODEL_TYPES[model_type]


__all__ = ["FAMILIES", "Family", "SUPPORTED", "family_for", "family_of_config"]
