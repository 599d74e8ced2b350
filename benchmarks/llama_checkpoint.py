"""Build a Llama-family checkpoint of a published shape (benchmarks/configs/NAME.json) with random weights, no hub
needed: the same size and speed as the real model, not its text.

    python benchmarks/llama_checkpoint.py smollm2-135m OUT
    edgelm export OUT --quantize int8 -o models/smollm2-135m-random-int8 && edgelm bench -m models/smollm2-135m-random-int8

The tokenizer is ../shared's GPT-2 tokenizer where its ids fit the vocabulary, else the tests' tiny byte-level BPE
(tests/checkpoints.py): benchmarks feed random token ids, and either keeps every id inside the vocabulary.
"""

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"


def build(name: str, out: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    out = Path(out)
    config = json.loads((HERE / "configs" / f"{name}.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    gpt2 = SHARED / "gpt2-tokenizer"
    if (gpt2 / "tokenizer.json").exists() and config["vocab_size"] >= 50257:
        for f in gpt2.iterdir():
            if f.is_file() and not f.name.startswith("LICENSE"):
                shutil.copy(f, out / f.name)
    else:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from checkpoints import build_tokenizer

        build_tokenizer(out)
    family = {"llama": "Llama", "qwen2": "Qwen2"}[config["model_type"]]
    torch.manual_seed(seed)
    model = getattr(transformers, family + "ForCausalLM")(getattr(transformers, family + "Config")(**config)).eval()
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: python {sys.argv[0]} CONFIG_NAME OUT   (CONFIG_NAME: a file of benchmarks/configs)")
    print(build(sys.argv[1], Path(sys.argv[2])))
