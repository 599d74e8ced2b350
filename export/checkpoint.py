"""Stage 1, load: find a GPT-2-family checkpoint (hub id or local folder) and read it without running
pickled code. Heavy imports live inside the functions that need them (CTranslate2's converters do the same),
so `edgelm export --help` stays fast.
"""

import json
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from edgelm.runtime.package.format import Architecture

from .activations import WEIGHTS as ACTIVATION_WEIGHTS
from .activations import check_activation
from .errors import ExportError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
# transformers' own GPT-2 classes; any other name in `architectures` is code the checkpoint would have to ship
GPT2_CLASSES = {
    "GPT2LMHeadModel",
    "GPT2Model",
    "GPT2DoubleHeadsModel",
    "GPT2ForSequenceClassification",
    "GPT2ForTokenClassification",
    "GPT2ForQuestionAnswering",
}
SUPPORTED = "GPT-2-family checkpoints (model_type 'gpt2': gpt2, distilgpt2, gpt2-medium/large/xl and their fine-tunes)"
SUPPORTED += ", Llama (model_type 'llama': LlamaForCausalLM, e.g. Llama 3.2, TinyLlama, SmolLM2) and Qwen2 (model_type 'qwen2': Qwen2ForCausalLM, e.g. Qwen2.5)"
ROPE_FAMILIES = ("llama", "qwen2")  # export/llama_checkpoint.py reads these


@dataclass
class Checkpoint:
    """A loaded checkpoint: its folder, Hugging Face config, architecture and float32 weights."""

    folder: Path
    config: dict
    arch: Architecture
    weights: dict[str, np.ndarray]  # HF GPT2LMHeadModel names, float32
    source: dict = field(default_factory=dict)  # {"hub_id", "revision"} or {"local_path"}
    weight_file: str = ""


def resolve(model: str, revision: str | None = None) -> tuple[Path, dict]:
    """A local folder as it is, or a hub id downloaded (or found in the hub cache)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve(), {"local_path": str(path.resolve())}
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
        raise ExportError(
            f"could not download {repo_id}: the Hugging Face hub is unreachable from here and the model is not in the "
            f"local hub cache ({_hub_cache()}). Connect to the network, or export a local checkpoint folder instead: "
            f"edgelm export path/to/folder  ({type(error).__name__})"
        ) from None
    commit = folder.name if len(folder.name) == 40 else None
    return folder, {"hub_id": repo_id, "revision": revision or "main", "commit": commit}


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def read_config(folder: Path) -> tuple[dict, Architecture]:
    """config.json, checked to be a GPT-2 decoder this exporter reproduces exactly, with sane sizes."""
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
    _refuse_remote_code(config, folder)
    model_type = config.get("model_type")
    if model_type in ROPE_FAMILIES:
        from .llama_checkpoint import read_config as read_llama_config

        return config, read_llama_config(config, folder)
    if model_type != "gpt2":
        raise ExportError(
            f"{folder.name} is a '{model_type}' model ({', '.join(map(str, config.get('architectures') or []))}); edgelm exports {SUPPORTED}."
        )
    _check_variant(config, config_path)
    _check_sizes(config, config_path)
    return config, Architecture.from_hf_config(config)


# GPT2LMHeadModel settings edgelm's graph does not run, each with why; the others it reproduces.
REFUSED = {
    "add_cross_attention": (
        lambda v: v is not False,
        "adds cross-attention over an encoder's states (the decoder of an EncoderDecoderModel); edgelm exports "
        "decoder-only GPT-2. Export a checkpoint trained without it",
    ),
    "pruned_heads": (
        lambda v: bool(v),
        "prunes attention heads, so layers differ in head count; edgelm's cache has one head count for every layer. "
        "Export the checkpoint before pruning",
    ),
}
FLAGS = ("tie_word_embeddings", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn")


def _check_variant(config: dict, config_path: Path) -> None:
    """The GPT-2 variations: every flag a true/false, the activation one transformers knows, and a clear line
    for each setting edgelm cannot run. reorder_and_upcast_attn only changes float16 arithmetic: float32 attention
    is the same, and the export's parity gate checks it."""
    for key in FLAGS:
        if key in config and not isinstance(config[key], bool):
            raise ExportError(f"{config_path}: {key} must be true or false, not {config[key]!r}.")
    check_activation(config.get("activation_function", "gelu_new"), str(config_path))
    for key, (refused, why) in REFUSED.items():
        if key in config and refused(config[key]):
            raise ExportError(f"{config_path} sets {key}={config[key]!r}: the model {why}.")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _refuse_remote_code(config: dict, folder: Path) -> None:
    """A config that names Python classes of its own (auto_map, or an architecture transformers does not
    ship) needs code from the checkpoint to load; edgelm never imports or runs it."""
    custom = config.get("auto_map")
    architectures = config.get("architectures") or []
    if config.get("model_type") == "gpt2" and isinstance(architectures, list):
        custom = custom or [a for a in architectures if not isinstance(a, str) or a not in GPT2_CLASSES]
    if custom:
        if isinstance(custom, dict):
            custom = list(custom.values())
        named = ", ".join(map(str, custom if isinstance(custom, list) else [custom]))
        raise ExportError(
            f"{folder.name} needs Python code shipped with the checkpoint ({named}); edgelm never runs code shipped "
            f"with a checkpoint. Export a plain GPT-2-family checkpoint (architectures: GPT2LMHeadModel)."
        )


def _check_sizes(config: dict, config_path: Path) -> None:
    """Sizes are positive whole numbers, the heads split the width evenly, token ids are in the vocabulary."""
    if "n_positions" not in config and "n_ctx" in config:
        config = config | {"n_positions": config["n_ctx"]}
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        value = config.get(key)
        if value is None:
            raise ExportError(
                f"{config_path} has no {key}; a GPT-2 config.json sets n_layer, n_head, n_embd, n_positions and vocab_size."
            )
        if type(value) is not int or value <= 0:
            raise ExportError(f"{config_path}: {key} must be a positive whole number, not {value!r}.")
    n_inner = config.get("n_inner")
    if n_inner is not None and (type(n_inner) is not int or n_inner <= 0):
        raise ExportError(f"{config_path}: n_inner must be a positive whole number or null, not {n_inner!r}.")
    if config["n_embd"] % config["n_head"]:
        raise ExportError(
            f"{config_path}: n_embd {config['n_embd']} is not divisible by n_head {config['n_head']}; "
            "each attention head takes an equal share of the width."
        )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(key)
        if value is not None and (type(value) is not int or not 0 <= value < config["vocab_size"]):
            raise ExportError(
                f"{config_path}: {key} must be a token id below vocab_size {config['vocab_size']} or null, not {value!r}."
            )
    epsilon = config.get("layer_norm_epsilon", 1e-5)
    if type(epsilon) not in (int, float) or not 0 < epsilon < 1:
        raise ExportError(f"{config_path}: layer_norm_epsilon must be a small positive number, not {epsilon!r}.")


def read_weights(folder: Path, arch: Architecture) -> tuple[dict[str, np.ndarray], str]:
    """Safetensors first; a PyTorch .bin only through torch's weights-only loader (never arbitrary unpickling)."""
    import torch

    for name in WEIGHT_FILES:
        path = folder / name
        if path.exists():
            break
    else:
        raise ExportError(f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)}.")
    weights = {}
    for key, tensor in tensors(path):  # converted one by one: a float16 checkpoint is never held twice
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old checkpoints, not weights
        key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
        if key == "transformer.wte.weight" and arch.tie_word_embeddings and tensor.ndim == 2:
            weights[key] = transposed(tensor)  # the LM head multiplies by its transpose: stored that way, once
        else:
            weights[key] = tensor.detach().to(torch.float32).numpy()
        _check_finite(key, weights[key], path)
    _check_weights(weights, arch, path)
    if arch.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # the same matrix as the embedding (checked): not held twice
    return weights, name


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


def _check_finite(name: str, weight: np.ndarray, path: Path) -> None:
    """One NaN or Inf weight makes every output NaN, and NaN compares as 'no error' in parity checks."""
    finite = np.isfinite(weight)
    if not finite.all():
        count = int(weight.size - np.count_nonzero(finite))
        raise ExportError(
            f"{path}: tensor {name} holds {count} non-finite value{'s' if count > 1 else ''} (NaN or Inf); the "
            "checkpoint is damaged or was saved after training diverged. Export an earlier or re-downloaded checkpoint."
        )


def _check_weights(weights: dict, arch: Architecture, path: Path) -> None:
    """Every tensor the graph reads, in the shape the config promises (GPT-2's Conv1D weights are [in, out])."""
    C, V, inner = arch.n_embd, arch.vocab_size, arch.mlp_width
    expected = {
        "transformer.wte.weight": (V, C),
        "transformer.wpe.weight": (arch.n_positions, C),
        "transformer.ln_f.weight": (C,),
        "transformer.ln_f.bias": (C,),
    }
    if not arch.tie_word_embeddings:
        expected["lm_head.weight"] = (V, C)
    act = ACTIVATION_WEIGHTS.get(arch.activation_function, ())
    for i in range(arch.n_layer):
        p = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            expected |= {f"{p}{norm}.weight": (C,), f"{p}{norm}.bias": (C,)}
        expected |= {p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,)}
        expected |= {p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,)}
        expected |= {p + "mlp.c_fc.weight": (C, inner), p + "mlp.c_fc.bias": (inner,)}
        expected |= {p + "mlp.c_proj.weight": (inner, C), p + "mlp.c_proj.bias": (C,)}
        expected |= {f"{p}mlp.act.{name}": None for name in act}  # prelu / xielu's own parameters
    missing = [k for k in expected if k not in weights]
    if missing:
        untied = "lm_head.weight" in missing
        raise ExportError(
            f"{path} is missing {len(missing)} weight tensors the config promises (first: "
            f"{'lm_head.weight, which tie_word_embeddings false needs' if untied else missing[0]}); the checkpoint is incomplete."
        )
    wrong = [f"{k} {weights[k].shape} != {s}" for k, s in expected.items() if s and weights[k].shape != s]
    if wrong:
        raise ExportError(f"{path} does not match its config.json: {wrong[0]}.")
    head = weights.get("lm_head.weight")
    if arch.tie_word_embeddings and head is not None and not np.array_equal(head, weights["transformer.wte.weight"]):
        raise ExportError(
            f"{path} holds an lm_head.weight that differs from the token embedding, but its config.json ties them "
            "(tie_word_embeddings is true or unset), so transformers would ignore that head. Set "
            '"tie_word_embeddings": false in config.json to export the separate head.'
        )


def load_checkpoint(model: str, revision: str | None = None) -> Checkpoint:
    folder, source = resolve(model, revision)
    config, arch = read_config(folder)
    if arch.model_type in ROPE_FAMILIES:
        from .llama_checkpoint import read_weights as read_llama_weights

        weights, weight_file = read_llama_weights(folder, arch)
    else:
        weights, weight_file = read_weights(folder, arch)
    return Checkpoint(folder=folder, config=config, arch=arch, weights=weights, source=source, weight_file=weight_file)
