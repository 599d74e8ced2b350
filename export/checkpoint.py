"""Stage 1, load: what reading any family's checkpoint shares. Find it (hub id or local folder), read its
config.json (refusing one that needs the checkpoint's own code) and its tensors one at a time without running
pickled code, checked to be finite. The families (export/families/) read their own settings and weights with
these; export/load.py picks the family. Heavy imports live inside the functions that need them (CTranslate2's
converters do the same), so `edgelm export --help` stays fast.
"""

import json
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from edgelm.runtime.package.format import Architecture, FormatError, file_name

from .errors import ExportError

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
SHARD_INDEX = "model.safetensors.index.json"


@dataclass
class Checkpoint:
    """A loaded checkpoint: its folder, Hugging Face config, architecture and float32 weights."""

    folder: Path
    config: dict
    arch: Architecture
    weights: dict[str, np.ndarray]  # the family's Hugging Face names, float32 (families/*/weights.py)
    # {"hub_id", "revision", "commit"}, or {"local_folder"}: the folder's name only, never a path of the machine
    # that exported it (the manifest travels with the package)
    source: dict = field(default_factory=dict)
    weight_file: str = ""


def resolve(model: str, revision: str | None = None) -> tuple[Path, dict]:
    """A local folder as it is, or a hub id downloaded (or found in the hub cache)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve(), {"local_folder": path.resolve().name}
    if path.exists():
        raise ExportError(f"{model} is a file; pass the folder that holds config.json and the weights.")
    if model.startswith((".", "/", "~")) or os.sep in model.rstrip("/") and model.count("/") > 1:
        raise ExportError(f"no such folder: {model}. Pass a local checkpoint folder or a Hugging Face hub id.")
    return _download(model, revision)


def _download(repo_id: str, revision: str | None) -> tuple[Path, dict]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    patterns = ["config.json", "generation_config.json", *TOKENIZER_FILES]
    try:
        shards = ["model.safetensors.index.json", "model-*-of-*.safetensors"]  # larger Llama-family checkpoints
        folder = Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=patterns + ["model.safetensors", *shards])
        )
        if not (folder / "model.safetensors").exists() and not (folder / shards[0]).exists():
            folder = Path(
                snapshot_download(repo_id, revision=revision, allow_patterns=patterns + ["pytorch_model.bin"])
            )
    except HFValidationError:
        raise ExportError(f"'{repo_id}' is neither a local folder nor a valid Hugging Face hub id.") from None
    except GatedRepoError:
        raise ExportError(
            f"{repo_id} is gated on the Hugging Face hub: accept its terms and log in (huggingface-cli login)."
        ) from None
    except RepositoryNotFoundError:
        raise ExportError(
            f"unknown model id '{repo_id}': the Hugging Face hub has no such repository (or it is private)."
        ) from None
    except RevisionNotFoundError:
        raise ExportError(f"{repo_id} has no revision '{revision}'.") from None
    except (LocalEntryNotFoundError, EntryNotFoundError, OSError) as error:
        raise ExportError(offline_routes(repo_id, type(error).__name__)) from None
    commit = folder.name if len(folder.name) == 40 else None
    return folder, {"hub_id": repo_id, "revision": revision or "main", "commit": commit}


def offline_routes(repo_id: str, cause: str) -> str:
    """The error for a hub id that can be neither downloaded nor found in the cache, naming the ways to export
    without a network (docs/install.md, "Offline")."""
    return (
        f"could not download {repo_id}: the Hugging Face hub is unreachable from here and the model is not in the "
        f"local hub cache ({_hub_cache()}). Connect to the network, or export a local checkpoint folder instead: "
        f"edgelm export path/to/folder (one with config.json, the weights and the tokenizer files); a model "
        f"downloaded before is read from the hub cache without asking the hub by HF_HUB_OFFLINE=1 edgelm export "
        f"{repo_id}; to try edgelm with no model at all, edgelm export distilgpt2 --random-weights builds distilgpt2's "
        f"shape with random weights (its text is noise)  ({cause})"
    )


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def read_config_json(folder: Path) -> dict:
    """config.json as a dict of settings, refused (ExportError) when it is missing, not JSON, too deep, or needs
    Python code shipped with the checkpoint (auto_map). The family checks the settings themselves."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ExportError(f"{folder} has no config.json; a Hugging Face checkpoint folder needs one.")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ExportError(f"{config_path} is nested too deeply to be a checkpoint config.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as error:
        raise ExportError(f"{config_path} is not valid JSON ({error}).") from None
    if not isinstance(config, dict):
        raise ExportError(f"{config_path} holds a JSON {type(config).__name__}, not an object of settings.")
    refuse_remote_code(config, folder)
    return config


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def refuse_remote_code(config: dict, folder: Path, custom: tuple | list = ()) -> None:
    """A config that names Python classes of its own (auto_map, or `custom`: the entries of `architectures` its
    family's transformers classes do not include) needs code from the checkpoint to load; edgelm never imports or
    runs it."""
    custom = config.get("auto_map") or list(custom)
    if custom:
        if isinstance(custom, dict):
            custom = list(custom.values())
        named = ", ".join(map(str, custom if isinstance(custom, list) else [custom]))
        raise ExportError(
            f"{folder.name} needs Python code shipped with the checkpoint ({named}); edgelm never runs code shipped "
            f"with a checkpoint. Export a checkpoint whose architecture transformers itself defines (GPT2LMHeadModel, "
            f"LlamaForCausalLM or Qwen2ForCausalLM)."
        )


def read_tensor_file(path: Path) -> dict:
    """name -> torch tensor from one safetensors file, or from a PyTorch .bin through torch's weights-only loader."""
    return dict(tensors(path))


def transposed(tensor) -> np.ndarray:
    """A [V, C] tensor as float32, held as the transposed view of a C-contiguous [C, V] array: the matrix an LM
    head multiplies by (x @ W^T), which the graph then stores without a copy of its own; a lookup of a row
    reads it strided."""
    import torch

    buffer = np.empty(tensor.shape[::-1], dtype=np.float32)
    torch.from_numpy(buffer).copy_(tensor.detach().T)  # converts and transposes in one pass
    return buffer.T


def tensors(path: Path):
    """(name, torch tensor) from one safetensors file or PyTorch .bin, read one at a time, so a reader that
    converts or places each one before the next never holds the file twice (a 1B model's float32 weights are
    5 GB). A safetensors file is checked by the safetensors library, then each tensor is read from the file into
    memory of its own: through a mapping of the file, every page read would stay counted in the process's
    memory until the end. A .bin goes through torch's weights-only loader, mapped where its format allows."""
    import torch

    try:
        if path.name.endswith(".safetensors"):
            yield from _safetensors(path)
            return
        with warnings.catch_warnings():  # torch warns about the pickle protocol before refusing a file
            warnings.simplefilter("ignore")
            try:
                state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:
                if "mmap" not in str(error):
                    raise
                state = torch.load(str(path), map_location="cpu", weights_only=True)  # the legacy format
        for name in list(state):
            yield name, state.pop(name)
    except pickle.UnpicklingError:  # torch's message suggests weights_only=False: exactly what must not be done
        raise ExportError(
            f"cannot read weights {path}: it holds pickled objects other than tensors, which could run code when "
            "loaded; edgelm loads only tensors. Get the checkpoint as model.safetensors from a source you trust."
        ) from None
    except ExportError:
        raise
    except Exception as error:  # safetensors and torch raise many types for a damaged file
        raise ExportError(
            f"cannot read weights {path}: the file is corrupt, truncated or unsafe to load ({type(error).__name__}: {str(error)[:200]})."
        ) from None


# safetensors' dtype names -> torch's; a tensor of another dtype is refused
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _safetensors(path: Path):
    """A safetensors file's tensors in file order. safe_open validates the header (dtypes, shapes, byte
    ranges inside the file and adding up); the ranges are then read from the header edgelm parses itself."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(length))
        for name, entry in sorted(
            ((n, e) for n, e in header.items() if n in names), key=lambda item: item[1]["data_offsets"][0]
        ):
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ExportError(
                    f"cannot read weights {path}: tensor {name} is stored as {entry['dtype']}, which edgelm does "
                    "not read; save the checkpoint in float32, float16 or bfloat16."
                )
            start, end = entry["data_offsets"]
            raw = torch.empty(end - start, dtype=torch.uint8)
            file.seek(8 + length + start)
            if file.readinto(raw.numpy()) != end - start:
                raise ExportError(f"cannot read weights {path}: the file is truncated; download it again.")
            yield name, raw.view(getattr(torch, dtype)).reshape(entry["shape"])


def check_finite(name: str, weight: np.ndarray, path: Path) -> None:
    """One NaN or Inf weight makes every output NaN, and NaN compares as 'no error' in parity checks."""
    finite = np.isfinite(weight)
    if not finite.all():
        count = int(weight.size - np.count_nonzero(finite))
        raise ExportError(
            f"{path}: tensor {name} holds {count} non-finite value{'s' if count > 1 else ''} (NaN or Inf); the "
            "checkpoint is damaged or was saved after training diverged. Export an earlier or re-downloaded checkpoint."
        )


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or every shard model.safetensors.index.json names, or pytorch_model.bin."""
    if (folder / "model.safetensors").exists():
        return [folder / "model.safetensors"]
    index = folder / SHARD_INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
            shards = [folder / file_name("a shard", name) for name in names]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError, FormatError) as error:
            raise ExportError(
                f"{index} is not a shard index edgelm reads ({type(error).__name__}: {str(error)[:120]}); download the checkpoint again."
            ) from None
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            raise ExportError(
                f"{index} names {len(missing)} shard{'s' if len(missing) > 1 else ''} that {folder} does not have "
                f"(first: {missing[0]}); the download is incomplete. Download the checkpoint again."
            )
        return shards
    if (folder / "pytorch_model.bin").exists():
        return [folder / "pytorch_model.bin"]
    raise ExportError(
        f"{folder} has no weights: expected model.safetensors, {SHARD_INDEX} with its shards, or pytorch_model.bin."
    )
