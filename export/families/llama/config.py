"""The Llama family's config.json (LlamaForCausalLM: Llama, TinyLlama, SmolLM2; Qwen2ForCausalLM: Qwen2,
Qwen2.5, which is the Llama family with biases on Q, K and V): read into an Architecture, refusing settings the
graph does not reproduce."""

from pathlib import Path

from edgelm.runtime.package.format import Architecture, FormatError

from ...errors import ExportError
from .rope import ROPE_TYPES

# model_type -> transformers' own classes; any other name in `architectures` is code the checkpoint would ship
CLASSES = {
    "llama": {"LlamaForCausalLM", "LlamaModel"},
    "qwen2": {"Qwen2ForCausalLM", "Qwen2Model"},
}
REFERENCE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def read_config(config: dict, folder: Path) -> Architecture:
    """The Architecture of a Llama or Qwen2 config.json, or ExportError naming the setting edgelm cannot export."""
    where = folder / "config.json"
    model_type = config["model_type"]
    architectures = config.get("architectures") or []
    custom = [a for a in architectures if not isinstance(a, str) or a not in CLASSES[model_type]]
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
