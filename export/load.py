"""Stage 1, load: a checkpoint (hub id or local folder) read by the family its config.json's model_type names
(export/families/), with the reading every family shares (export/checkpoint.py): never code the checkpoint ships.
"""

from pathlib import Path

from edgelm.runtime.package.format import Architecture

from .checkpoint import Checkpoint, read_config_json, resolve
from .families import family_for, family_of_config


def read_config(folder: Path) -> tuple[dict, Architecture]:
    """config.json and its Architecture, checked by its family to be a decoder this exporter reproduces exactly."""
    config = read_config_json(folder)
    return config, family_of_config(config, folder).read_config(config, folder)


def load_checkpoint(model: str, revision: str | None = None) -> Checkpoint:
    """The checkpoint's folder, config, Architecture and float32 weights (in the family's layout), checked."""
    folder, source = resolve(model, revision)
    config, arch = read_config(folder)
    weights, weight_file = family_for(arch.model_type).read_weights(folder, arch)
    return Checkpoint(folder=folder, config=config, arch=arch, weights=weights, source=source, weight_file=weight_file)
