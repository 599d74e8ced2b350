"""The GPT-2 family's config.json (model_type 'gpt2': gpt2, distilgpt2, gpt2-medium/large/xl and their
fine-tunes): checked to be a GPT-2 decoder this exporter reproduces exactly, with sane sizes."""

from pathlib import Path

from edgelm.runtime.package.format import Architecture, FormatError

from ...checkpoint import refuse_remote_code
from ...errors import ExportError
from .activations import check_activation

# transformers' own GPT-2 classes; any other name in `architectures` is code the checkpoint would have to ship
GPT2_CLASSES = {
    "GPT2LMHeadModel",
    "GPT2Model",
    "GPT2DoubleHeadsModel",
    "GPT2ForSequenceClassification",
    "GPT2ForTokenClassification",
    "GPT2ForQuestionAnswering",
}


def read_config(config: dict, folder: Path) -> Architecture:
    """The Architecture of a GPT-2 config.json, or ExportError naming the setting edgelm cannot export."""
    config_path = folder / "config.json"
    architectures = config.get("architectures") or []
    if isinstance(architectures, list):
        refuse_remote_code(
            config, folder, [a for a in architectures if not isinstance(a, str) or a not in GPT2_CLASSES]
        )
    _check_variant(config, config_path)
    _check_sizes(config, config_path)
    try:
        return Architecture.from_hf_config(config)
    except FormatError as error:  # a size past what a package may hold (vocab_size 2**40, n_positions 2**31)
        raise ExportError(f"{config_path}: {error}; edgelm cannot export a model of this size.") from None


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
