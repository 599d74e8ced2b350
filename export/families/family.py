"""The one interface every architecture family gives the export stages (export/stages.py): the stages ask the
family, never the architecture's name, how to read, build, validate and calibrate. A family lives in its own
subpackage of export/families/, built from the shared checkpoint reading (export/checkpoint.py) and the graph
kit (export/graph/); no family imports another."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from edgelm.runtime.package.format import Architecture

from ..checkpoint import Checkpoint
from ..graph.contract import Decoder


@dataclass(frozen=True)
class Family:
    """One architecture family's export: each field is the function a stage calls (torch and transformers are
    imported inside the ones that need them)."""

    name: str  # its subpackage of export/families/
    reference_classes: dict[str, str]  # config.json's model_type -> the transformers class it is validated against
    described: str  # what it exports, for the message that refuses any other model_type
    # (config.json's settings, already parsed and free of auto_map; the checkpoint folder) -> Architecture, or
    # ExportError naming the setting the graph does not reproduce
    read_config: Callable[[dict, Path], Architecture]
    # (folder, arch) -> (float32 arrays under the family's Hugging Face names, checked; the file or index read)
    read_weights: Callable[[Path, Architecture], tuple[dict[str, np.ndarray], str]]
    # (arch, weights, recipe (export/quantize.py RECIPES) = "none", cache scales or None = None,
    #  int4=Int4Options or None (export/int4.py)) -> the decoder graph
    build_decoder: Callable[..., Decoder]
    # Checkpoint -> the same weights in transformers (a torch.nn.Module, float32, eager attention), not copied
    reference_model: Callable[[Checkpoint], Any]
    # (reference model, tokenizer, arch) -> layer -> (key scale, value scale), float32 [kv_heads, head_size] each
    kv_cache_scales: Callable[[Any, Any, Architecture], dict]

    def reference_class(self, model_type: str) -> str:
        """The transformers class the export of model_type's checkpoints is validated against."""
        return self.reference_classes[model_type]
