"""Tokenizers laid out as real families publish theirs, on small vocabularies (export side only: tokenizers and
transformers build them).

Each layout copies its family's published tokenizer.json and tokenizer_config.json in everything but the size
of the vocabulary: the normalizer, the pre-tokenizer (its split regex), the decoder, the post-processor, the
added tokens (their order, their text and which of them are special), the end-of-text tokens and the chat
template. The merges are trained on the tests' small corpus.

    qwen2.5    Qwen/Qwen2.5-*-Instruct: NFC, Qwen's split regex + byte-level; 22 added tokens after the
               vocabulary, of which `<tool_call>`, `</tool_call>`, the `<|fim_*|>` tokens, `<|repo_name|>` and
               `<|file_sep|>` are text ("special": false); eos `<|im_end|>`; the logits padded past the tokenizer
               (151,936 rows for 151,665 tokens), here to a multiple of 64
    llama3.2   meta-llama/Llama-3.2-*-Instruct: Llama 3's split regex + byte-level, merges over whole words
               (ignore_merges); 256 special tokens after the vocabulary (`<|begin_of_text|>`, `<|eot_id|>`,
               `<|python_tag|>`, `<|reserved_special_token_N|>`, ...), `<|begin_of_text|>` added in front of
               every text; eos `<|eot_id|>` (and `<|end_of_text|>`, `<|eom_id|>`)
    smollm2    HuggingFaceTB/SmolLM2-*-Instruct: single digits + byte-level (GPT-2's regex); 17 special tokens
               at ids 0-16 inside the vocabulary (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<repo_name>`,
               ...); eos `<|im_end|>`
    tinyllama  TinyLlama-1.1B-Chat (Llama 2's SentencePiece as a tokenizer.json): `▁` for a space, byte
               fallback (`<0x0A>`), `<unk>`, `<s>`, `</s>`; eos `</s>`
"""

import json
from pathlib import Path

from chat_templates import LLAMA32, QWEN25, SMOLLM2
from checkpoints import CORPUS

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# (text, special) in id order, as the published tokenizer.json lists them
QWEN25_ADDED = [
    *((t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>")),
    *((t, True) for t in ("<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>")),
    *((t, True) for t in ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")),
    ("<tool_call>", False),
    ("</tool_call>", False),
    *((t, False) for t in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>")),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
LLAMA32_ADDED = [
    (t, True)
    for t in (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
        *(f"<|reserved_special_token_{i}|>" for i in range(3, 248)),
    )
]
SMOLLM2_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
]
# name -> (chat template, tokenizer_config's special tokens, the text of each end-of-text token)
LAYOUTS = {
    "qwen2.5": (QWEN25, dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"), ("<|im_end|>", "<|endoftext|>")),
    "llama3.2": (
        LLAMA32,
        dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
        ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    ),
    "smollm2": (
        SMOLLM2,
        dict(bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>"),
        ("<|im_end|>",),
    ),
    "tinyllama": (None, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"), ("</s>",)),
}


def _byte_level(split: str | None, normalizer=None, digits: bool = False, size: int = 400):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(ignore_merges=split == LLAMA3_SPLIT))
    tokenizer.normalizer = normalizer
    if split is not None:
        steps = [pre_tokenizers.Split(Regex(split), behavior="isolated")]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    else:
        steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    special = SMOLLM2_SPECIAL if digits else []
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def _sentencepiece(size: int = 400):
    """Llama 2's layout: `▁` for spaces (prepended to the text), BPE over characters, byte fallback."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    # as Llama 2's file: ids 0-2 the specials, 3-258 the bytes <0x00>..<0xFF> (vocabulary, not added tokens), then
    # the merges' tokens
    data = json.loads(tokenizer.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda item: item[1])[3:]
    vocab = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *(t for t, _ in trained)]
    data["model"]["vocab"] = {t: i for i, t in enumerate(vocab)}
    for entry in data["added_tokens"]:
        entry["id"] = data["model"]["vocab"][entry["content"]]
    return Tokenizer.from_str(json.dumps(data))


def build_layout(folder, name: str) -> Path:
    """A tokenizer folder (tokenizer.json, tokenizer_config.json with the family's chat template) laid out as
    `name`'s (LAYOUTS)."""
    from tokenizers import AddedToken, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if name == "qwen2.5":
        tokenizer = _byte_level(QWEN_SPLIT, normalizers.NFC())
        added = QWEN25_ADDED
    elif name == "llama3.2":
        tokenizer = _byte_level(LLAMA3_SPLIT)
        added = LLAMA32_ADDED
    elif name == "smollm2":
        tokenizer = _byte_level(None, digits=True)
        added = []  # trained in as ids 0-16, each an added special token too
    else:
        tokenizer = _sentencepiece()
        added = []
    for text, special in added:  # one at a time, so that ids follow the published order
        token = AddedToken(text, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    if name == "llama3.2":
        bos = tokenizer.token_to_id("<|begin_of_text|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
    elif name == "tinyllama":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    template, tokens, _ = LAYOUTS[name]
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens)
    fast.save_pretrained(folder)
    if template is not None:
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"chat_template": template}, indent=2))
    return folder


def layout_text(folder) -> str:
    return (Path(folder) / "tokenizer.json").read_text(encoding="utf-8")


def token_count(folder) -> int:
    """Ids the tokenizer uses: its vocabulary and its added tokens."""
    data = json.loads(layout_text(folder))
    return 1 + max([*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])])


def logits_size(folder, name: str) -> int:
    """The model's vocabulary size for the layout: Qwen2.5's logits are padded past its tokenizer."""
    count = token_count(folder)
    return -(-count // 64) * 64 + 64 if name == "qwen2.5" else count


def eos_ids(folder, name: str) -> tuple:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(layout_text(folder))
    return tuple(tokenizer.token_to_id(t) for t in LAYOUTS[name][2])
