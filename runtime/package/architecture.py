"""The manifest's `architecture` section: the decoder's shape (GPT-2, Llama or Qwen2), checked as it is read
and written back, and built from a Hugging Face config for an optimum folder."""

import math
from dataclasses import asdict, dataclass

from .fields import FormatError, _bool, _choice, _get, _int, _list, _number, _object, _str


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder (GPT-2, Llama or Qwen2), as written in the package manifest."""

    n_layer: int  # decoder blocks
    n_head: int  # attention heads per block
    head_size: int  # width of one head; n_head * head_size == n_embd
    n_embd: int  # residual stream width
    n_positions: int  # context length: the largest past + new tokens the position table covers
    vocab_size: int  # rows of the (tied) embedding, columns of the logits
    bos_token_id: int | None  # token GPT-2 starts unconditional text from (end-of-text for GPT-2)
    eos_token_id: int | None  # generation stops here unless told to ignore it
    pad_token_id: int | None  # None for GPT-2: padding is carried by the attention mask alone
    layer_norm_epsilon: float = 1e-5
    model_type: str = "gpt2"
    # Under GPT2Config's names; the Llama family uses n_inner (its intermediate_size), activation_function
    # (silu: its SwiGLU MLP's) and tie_word_embeddings too. The graph computes them; the manifest says which.
    n_inner: int | None = None  # MLP width; None is 4 * n_embd
    activation_function: str = "gelu_new"  # the MLP's activation, a name in transformers' ACT2FN
    tie_word_embeddings: bool = True  # the LM head is the token embedding (stored once), else a matrix of its own
    scale_attn_weights: bool = True  # attention scores divided by sqrt(head_size) ...
    scale_attn_by_inverse_layer_idx: bool = False  # ... and by the layer's index + 1

    @property
    def mlp_width(self) -> int:
        return self.n_inner or 4 * self.n_embd

    def attention_scale(self, layer: int) -> float:
        """The factor on layer `layer`'s (0-based) query-key products: GPT-2's scale rule."""
        scale = 1 / math.sqrt(self.head_size) if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def attention_scale_rule(self) -> str:
        rule = "1/sqrt(head_size)" if self.scale_attn_weights else "1"
        return rule + (" / (layer + 1)" if self.scale_attn_by_inverse_layer_idx else "")

    # The Llama family (model_type "llama", "qwen2"; positions "rope"). GPT-2's values are the defaults, and a
    # GPT-2 manifest leaves these fields out.
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: one per attention head
    norm: str = "layernorm"  # "layernorm" (x - mean, scale, bias) or "rmsnorm" (x / rms(x), scale only)
    positions: str = "learned"  # "learned" (a position table) or "rope" (rotary; cos/sin tables baked at export)
    rope_theta: float | None = None  # the rotary base
    rope_scaling: dict | None = None  # Hugging Face's rope_scaling, e.g. {"rope_type": "llama3", "factor": 32.0, ...}
    biases: tuple | None = None  # the projections that have a bias (e.g. q_proj, k_proj, v_proj); None: GPT-2's, all

    @property
    def kv_heads(self) -> int:
        """Heads of the key/value cache: [batch, kv_heads, positions, head_size]."""
        return self.n_kv_head or self.n_head

    def to_dict(self) -> dict:
        data = asdict(self)
        if self.positions == "learned":  # GPT-2: the family fields are all at their defaults
            for key in FAMILY_FIELDS:
                data.pop(key)
        elif self.biases is not None:
            data["biases"] = list(self.biases)
        return data

    @classmethod
    def from_dict(cls, data, where: str = "architecture") -> "Architecture":
        data = _object(where, data)
        size = {k: _get(where, data, k, lambda w, v: _int(w, v, 1, 1 << 20)) for k in ("n_layer", "n_head")}
        size["head_size"] = _get(where, data, "head_size", lambda w, v: _int(w, v, 1, 1 << 16))
        size["n_embd"] = _get(where, data, "n_embd", lambda w, v: _int(w, v, 1, 1 << 20))
        if size["n_head"] * size["head_size"] != size["n_embd"]:
            raise FormatError(f"{where}: n_head x head_size must equal n_embd, got {size}")
        size["n_positions"] = _get(where, data, "n_positions", lambda w, v: _int(w, v, 1, 1 << 24))
        vocab = size["vocab_size"] = _get(where, data, "vocab_size", lambda w, v: _int(w, v, 1, 1 << 24))
        token = lambda w, v: None if v is None else _int(w, v, 0, vocab - 1)  # noqa: E731
        ids = {k: _get(where, data, k, token) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        epsilon = _get(where, data, "layer_norm_epsilon", lambda w, v: _number(w, v, 1e-30, 1.0), 1e-5)
        gpt2 = {
            "n_inner": _get(where, data, "n_inner", lambda w, v: None if v is None else _int(w, v, 1, 1 << 24), None),
            "activation_function": _get(where, data, "activation_function", _str, "gelu_new"),
            **{
                k: _get(where, data, k, _bool, default)
                for k, default in (
                    ("tie_word_embeddings", True),
                    ("scale_attn_weights", True),
                    ("scale_attn_by_inverse_layer_idx", False),
                )
            },
        }
        model_type = _get(where, data, "model_type", _str, "gpt2")
        return cls(
            **size,
            **ids,
            layer_norm_epsilon=epsilon,
            model_type=model_type,
            **gpt2,
            **_family_fields(where, data, size["n_head"]),
        )

    @classmethod
    def from_hf_config(cls, config, where: str = "config.json") -> "Architecture":
        """Read a Hugging Face GPT-2 config.json (also used for optimum-exported folders)."""
        config = _object(where, config)
        n_embd = _get(where, config, "n_embd", lambda w, v: _int(w, v, 1, 1 << 20))
        n_head = _get(where, config, "n_head", lambda w, v: _int(w, v, 1, 1 << 20))
        if n_embd % n_head:
            raise FormatError(f"{where}: n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        eos = config.get("eos_token_id")
        return cls.from_dict(
            {
                "n_layer": config.get("n_layer"),
                "n_head": n_head,
                "head_size": n_embd // n_head,
                "n_embd": n_embd,
                "n_positions": config.get("n_positions") or config.get("n_ctx"),
                "vocab_size": config.get("vocab_size"),
                "bos_token_id": config.get("bos_token_id"),
                "eos_token_id": eos[0] if isinstance(eos, list) and eos else eos,
                "pad_token_id": config.get("pad_token_id"),
                "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
                "model_type": config.get("model_type", "gpt2"),
                "n_inner": config.get("n_inner"),
                "activation_function": config.get("activation_function", "gelu_new"),
                "tie_word_embeddings": config.get("tie_word_embeddings", True),
                "scale_attn_weights": config.get("scale_attn_weights", True),
                "scale_attn_by_inverse_layer_idx": config.get("scale_attn_by_inverse_layer_idx", False),
            },
            where,
        )


FAMILY_FIELDS = (
    "n_kv_head",
    "norm",
    "positions",
    "rope_theta",
    "rope_scaling",
    "biases",
)


def _family_fields(where: str, data: dict, n_head: int) -> dict:
    """The Llama-family fields of architecture, each checked; absent ones keep GPT-2's defaults."""
    kv = _get(where, data, "n_kv_head", lambda w, v: None if v is None else _int(w, v, 1, n_head), None)
    if kv is not None and n_head % kv:
        raise FormatError(f"{where}.n_kv_head must divide n_head ({n_head}), got {kv}")
    biases = _get(where, data, "biases", lambda w, v: None if v is None else tuple(_list(w, v)), None)
    for k, name in enumerate(biases or ()):
        _str(f"{where}.biases[{k}]", name)
    return {
        "n_kv_head": kv,
        "norm": _get(where, data, "norm", _choice(("layernorm", "rmsnorm")), "layernorm"),
        "positions": _get(where, data, "positions", _choice(("learned", "rope")), "learned"),
        "rope_theta": _get(where, data, "rope_theta", lambda w, v: None if v is None else _number(w, v, 1e-6), None),
        "rope_scaling": _get(where, data, "rope_scaling", lambda w, v: None if v is None else _object(w, v), None),
        "biases": biases,
    }
