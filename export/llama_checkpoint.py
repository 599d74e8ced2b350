"""Stage 1 for the Llama family (LlamaForCausalLM: Llama, TinyLlama, SmolLM2; Qwen2ForCausalLM: Qwen2, Qwen2.5):
read config.json into an Architecture, refusing settings the graph does not reproduce, and read the weights
(one file, or shards listed by model.safetensors.index.json), checked against the config. Also the PyTorch
reference the export is validated against, and the int8 cache's calibration.
"""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from edgelm.runtime.package.format import Architecture, FormatError, file_name

from .checkpoint import _check_finite, tensors, transposed
from .errors import ExportError
from .llama_graph import PACKED, ROPE_TYPES

# model_type -> transformers' own classes; any other name in `architectures` is code the checkpoint would ship
FAMILIES = {
    "llama": {"LlamaForCausalLM", "LlamaModel"},
    "qwen2": {"Qwen2ForCausalLM", "Qwen2Model"},
}
REFERENCE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SHARD_INDEX = "model.safetensors.index.json"
CALIBRATION_POSITIONS = 1024  # rotary keys' size does not depend on the position: rows this long cover them


def read_config(config: dict, folder: Path) -> Architecture:
    """The Architecture of a Llama or Qwen2 config.json, or ExportError naming the setting edgelm cannot export."""
    where = folder / "config.json"
    model_type = config["model_type"]
    architectures = config.get("architectures") or []
    custom = [a for a in architectures if not isinstance(a, str) or a not in FAMILIES[model_type]]
    if not isinstance(architectures, list) or custom:
        raise ExportError(
            f"{folder.name} needs Python code shipped with the checkpoint ({', '.join(map(str, custom or [architectures]))}); "
            f"edgelm never runs code shipped with a checkpoint. Export a plain checkpoint (architectures: {REFERENCE[model_type]})."
        )
    sizes = {}
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
        "vocab_size",
    ):
        value = config.get(key)
        if type(value) is not int or value <= 0:
            raise ExportError(f"{where}: {key} must be a positive whole number, not {value!r}.")
        sizes[key] = value
    heads, width = sizes["num_attention_heads"], sizes["hidden_size"]
    kv_heads = config.get("num_key_value_heads") or heads
    if type(kv_heads) is not int or kv_heads <= 0 or heads % kv_heads:
        raise ExportError(
            f"{where}: num_key_value_heads must be a positive whole number dividing num_attention_heads ({heads}), not {kv_heads!r}."
        )
    if width % heads:
        raise ExportError(f"{where}: hidden_size {width} is not divisible by num_attention_heads {heads}.")
    head_size = width // heads
    if config.get("head_dim") not in (None, head_size):
        raise ExportError(
            f"{where} sets head_dim={config['head_dim']!r}; edgelm exports heads of hidden_size / num_attention_heads ({head_size}) only."
        )
    if head_size % 8:  # onnxruntime's GroupQueryAttention refuses others at run time
        raise ExportError(
            f"{where}: the head size (hidden_size / num_attention_heads) is {head_size}; edgelm's attention op needs a multiple of 8."
        )
    _refuse(where, config, "hidden_act", "silu", "silu")
    _refuse(where, config, "use_sliding_window", False, False)
    _refuse(where, config, "partial_rotary_factor", 1.0, 1.0)
    theta = config.get("rope_theta", 10000.0)
    if type(theta) not in (int, float) or not theta > 0:
        raise ExportError(f"{where}: rope_theta must be a positive number, not {theta!r}.")
    scaling = _rope_scaling(where, config.get("rope_scaling"))
    if model_type == "qwen2":
        biases = ("q_proj", "k_proj", "v_proj")
    else:
        biases = (("q_proj", "k_proj", "v_proj", "o_proj") if config.get("attention_bias") else ()) + (
            ("gate_proj", "up_proj", "down_proj") if config.get("mlp_bias") else ()
        )
    eos = config.get("eos_token_id")
    data = {
        "n_layer": sizes["num_hidden_layers"],
        "n_head": heads,
        "head_size": head_size,
        "n_embd": width,
        "n_positions": sizes["max_position_embeddings"],
        "vocab_size": sizes["vocab_size"],
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": eos[0] if isinstance(eos, list) and eos else eos,
        "pad_token_id": config.get("pad_token_id"),
        "layer_norm_epsilon": config.get("rms_norm_eps", 1e-6),
        "model_type": model_type,
        "n_kv_head": kv_heads,
        "n_inner": sizes["intermediate_size"],
        "norm": "rmsnorm",
        "activation_function": "silu",
        "positions": "rope",
        "rope_theta": float(theta),
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),  # both configs' default is False
        "biases": list(biases),
    }
    try:
        return Architecture.from_dict(data, str(where))
    except FormatError as error:
        raise ExportError(f"{error}.") from None


def _refuse(where, config, key, wanted, default):
    if config.get(key, default) not in (wanted, None):
        raise ExportError(
            f"{where} sets {key}={config[key]!r}; edgelm's Llama-family graph supports only {key}={wanted!r}."
        )


def _rope_scaling(where, scaling):
    """None, or a rope_scaling edgelm bakes into its cos/sin tables (default or llama3, with its numbers checked)."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ExportError(f"{where}: rope_scaling must be an object or null, not {scaling!r}.")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ExportError(
            f"{where} sets rope_scaling type {kind!r}; edgelm exports rotary embeddings of type {' or '.join(ROPE_TYPES)}."
        )
    if kind == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            value = scaling.get(key)
            if type(value) not in (int, float) or not value > 0:
                raise ExportError(f"{where}: rope_scaling.{key} must be a positive number for llama3, not {value!r}.")
        if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ExportError(f"{where}: rope_scaling.high_freq_factor must be larger than low_freq_factor.")
    return scaling


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


def read_weights(folder: Path, arch: Architecture) -> tuple[dict[str, np.ndarray], str]:
    """The checkpoint's tensors as float32 NumPy arrays under LlamaForCausalLM's names, checked against arch.

    Read one tensor at a time, each straight into the layout the graph multiplies by (so the export holds the
    weights once, and the PyTorch reference reads the same memory): every projection into its column block of
    the packed [in, out] matrix (llama_graph.PACKED), kept here as a [out, in] view of it; the matrix the LM head
    multiplies by (the untied head, or the tied embedding) as the transposed view of a [C, V] array."""
    files = weight_files(folder)
    places = _places(arch)
    head = "model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"
    packed, weights = {}, {}
    for path in files:
        for key, tensor in tensors(path):
            if key.endswith("rotary_emb.inv_freq"):
                continue  # a buffer old checkpoints saved; the graph bakes its own tables
            key = key if key.startswith(("model.", "lm_head.")) else "model." + key
            if key == "lm_head.weight" and arch.tie_word_embeddings:
                continue  # transformers ties it to the embedding whatever the file holds
            if key in places and tuple(tensor.shape) == places[key][2]:
                weights[key] = _place(tensor, *places[key], packed)
            elif key == head and tensor.ndim == 2:
                weights[key] = transposed(tensor)
            else:
                weights[key] = _float32(tensor)
            del tensor  # before the next one is read
            _check_finite(key, weights[key], path)
    _check_weights(weights, arch, files[0] if len(files) == 1 else folder / SHARD_INDEX)
    return weights, files[0].name if len(files) == 1 else SHARD_INDEX


def _float32(tensor) -> np.ndarray:
    import torch

    return tensor.detach().to(torch.float32).numpy()


def _places(arch: Architecture) -> dict:
    """HF weight name -> (packed matrix name, its [in, out] shape, the part's [out, in] shape, first column)."""
    shapes = expected_shapes(arch)
    places = {}
    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        for name, parts in PACKED:
            shape = [shapes[p + part + ".weight"] for part in parts]
            whole = (shape[0][1], sum(out for out, _ in shape))
            column = 0
            for part, (out, width) in zip(parts, shape):
                places[p + part + ".weight"] = (p + name, whole, (out, width), column)
                column += out
    return places


def _place(tensor, name: str, whole: tuple, shape: tuple, column: int, packed: dict) -> np.ndarray:
    """Copy a [out, in] tensor (any float dtype) into its column block of packed[name]; returns the view of it."""
    import torch

    if name not in packed:
        packed[name] = np.empty(whole, dtype=np.float32)
    block = packed[name][:, column : column + shape[0]]
    torch.from_numpy(block).copy_(tensor.detach().T)  # converts and transposes in one pass
    return block.T


def expected_shapes(arch: Architecture) -> dict:
    """Every tensor the config promises, with its shape (torch Linear's [out, in])."""
    C, V, I = arch.n_embd, arch.vocab_size, arch.mlp_width
    q, kv = arch.n_head * arch.head_size, arch.kv_heads * arch.head_size
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    outputs = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": C, "gate_proj": I, "up_proj": I, "down_proj": C}
    inputs = {"o_proj": q, "down_proj": I}
    for i in range(arch.n_layer):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (C,)
        for name, out in outputs.items():
            part = p + ("self_attn." if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp.") + name
            shapes[part + ".weight"] = (out, inputs.get(name, C))
            if name in arch.biases:
                shapes[part + ".bias"] = (out,)
    return shapes


def _check_weights(weights: dict, arch: Architecture, path: Path) -> None:
    expected = expected_shapes(arch)
    missing = [k for k in expected if k not in weights]
    if missing:
        raise ExportError(
            f"{path} is missing {len(missing)} weight tensors the config promises (first: {missing[0]}); the checkpoint is incomplete or its config.json is not its own."
        )
    wrong = [
        f"{k} is {list(weights[k].shape)}, the config makes it {list(s)}"
        for k, s in expected.items()
        if weights[k].shape != s
    ]
    unexpected = [k for k in weights if k not in expected and k != "lm_head.weight"]
    if wrong or unexpected:
        problem = wrong[0] if wrong else f"it holds {unexpected[0]}, which the config does not describe"
        raise ExportError(
            f"{path} does not match its config.json: {problem}. Export the config saved with these weights."
        )


def reference_model(checkpoint):
    """The same weights in transformers' LlamaForCausalLM / Qwen2ForCausalLM (float32, eager attention). Built on
    the meta device and given the checkpoint's own arrays (no random initialization, no second copy of the
    weights: a 1B model's are 5 GB); only the rotary tables, computed at construction, are built for real."""
    import torch
    import transformers

    name = REFERENCE[checkpoint.arch.model_type]
    config_class = getattr(transformers, name.replace("ForCausalLM", "Config"))
    try:
        config = config_class.from_dict(checkpoint.config)
        config._attn_implementation = "eager"
        with torch.device("meta"):
            model = getattr(transformers, name)(config).eval()
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    except (TypeError, ValueError, AttributeError, KeyError) as error:  # a setting transformers cannot take
        raise ExportError(
            f"transformers cannot build {name} from {checkpoint.folder / 'config.json'} "
            f"({type(error).__name__}: {str(error)[:200]}); fix or remove that setting."
        ) from None
    state = {k: torch.from_numpy(v) for k, v in checkpoint.weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ExportError(f"the weights do not fit {name}: missing {missing[:3]}, unexpected {unexpected[:3]}.")
    if checkpoint.arch.tie_word_embeddings:
        model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ExportError(f"the weights do not fit {name}: {left[0]} was not given; the checkpoint is incomplete.")
    return model


def kv_cache_scales(model, tokenizer, arch: Architecture) -> dict:
    """layer -> (key scale, value scale), float32 [kv_heads, head_size] each, for an int8 cache.

    The cache holds keys after the rotation, which mixes channel j with channel j + D/2 at an angle that
    depends on the position: the key scale of both is the largest length of that pair seen (any rotation
    of the pair stays within it), so the scales hold at every position."""
    import torch

    from .calibrate import HEADROOM, calibration_rows

    KV, D = arch.kv_heads, arch.head_size
    absmax = [np.zeros((2, KV, D), dtype=np.float32) for _ in range(arch.n_layer)]

    def record(layer, kind):
        def hook(_module, _inputs, output):  # [B, T, KV * D]
            values = output[0].detach().float().reshape(-1, KV, D)
            if kind == 0:  # the pair's length, for both of its channels
                length = values[..., : D // 2].square().add(values[..., D // 2 :].square()).sqrt()
                values = torch.cat([length, length], dim=-1)
            np.maximum(absmax[layer][kind], values.abs().amax(dim=0).numpy(), out=absmax[layer][kind])

        return hook

    short = replace(arch, n_positions=min(arch.n_positions, CALIBRATION_POSITIONS))
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.k_proj.register_forward_hook(record(i, 0)))
        hooks.append(layer.self_attn.v_proj.register_forward_hook(record(i, 1)))
    try:
        with torch.no_grad():
            for row in calibration_rows(tokenizer, short):
                model(input_ids=torch.tensor([row]))
    finally:
        for h in hooks:
            h.remove()
    scale = lambda a: (np.maximum(a, 1e-6) * HEADROOM / 127).astype(np.float32)  # noqa: E731
    return {i: (scale(a[0]), scale(a[1])) for i, a in enumerate(absmax)}
