"""What the runtime must know about a model, read from the package (never hard-coded here)."""

from dataclasses import MISSING, asdict, dataclass


@dataclass(frozen=True)
class Architecture:
    """The shape of a GPT-2-family decoder, as written in the package manifest."""

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Architecture":
        fields = cls.__dataclass_fields__
        missing = [name for name, f in fields.items() if name not in data and f.default is MISSING]
        if missing:
            raise KeyError(", ".join(missing))
        return cls(**{k: data[k] for k in fields if k in data})

    @classmethod
    def from_hf_config(cls, config: dict) -> "Architecture":
        """Read a Hugging Face GPT-2 config.json (also used for optimum-exported folders)."""
        n_embd, n_head = int(config["n_embd"]), int(config["n_head"])
        return cls(
            n_layer=int(config["n_layer"]),
            n_head=n_head,
            head_size=n_embd // n_head,
            n_embd=n_embd,
            n_positions=int(config.get("n_positions") or config.get("n_ctx")),
            vocab_size=int(config["vocab_size"]),
            bos_token_id=config.get("bos_token_id"),
            eos_token_id=config.get("eos_token_id"),
            pad_token_id=config.get("pad_token_id"),
            layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
            model_type=config.get("model_type", "gpt2"),
        )
