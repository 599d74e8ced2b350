"""GPT-2's sizes with random weights: build a checkpoint of one size, then export it in a process of its own
(so `/usr/bin/time -v` measures the export's peak memory alone).

    python benchmarks/gpt2_sizes.py build gpt2-xl /tmp/gpt2-xl            # random weights, the real GPT-2 vocabulary
    /usr/bin/time -v python benchmarks/gpt2_sizes.py export /tmp/gpt2-xl /tmp/gpt2-xl-pkg [--validate] [--quantize int8]

The tokenizer is GPT-2's (../shared/gpt2-tokenizer beside the checkout, or --tokenizer). Weights are normal(0,
0.02) like GPT-2's initialization, written one tensor at a time to model.safetensors.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

SIZES = {  # n_embd, n_layer, n_head (head size 64); vocab 50257, 1024 positions
    "distilgpt2": (768, 6, 12),
    "gpt2": (768, 12, 12),
    "gpt2-medium": (1024, 24, 16),
    "gpt2-large": (1280, 36, 20),
    "gpt2-xl": (1600, 48, 25),
}
VOCAB, POSITIONS = 50257, 1024
SHARED_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "gpt2-tokenizer"


def build(size: str, folder: Path, tokenizer: Path, seed: int = 0) -> None:
    width, layers, heads = SIZES[size]
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": VOCAB,
        "n_positions": POSITIONS,
        "n_embd": width,
        "n_layer": layers,
        "n_head": heads,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    shapes = {"transformer.wte.weight": (VOCAB, width), "transformer.wpe.weight": (POSITIONS, width)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (width,)
        for name, shape in (
            ("attn.c_attn", (width, 3 * width)),
            ("attn.c_proj", (width, width)),
            ("mlp.c_fc", (width, 4 * width)),
            ("mlp.c_proj", (4 * width, width)),
        ):
            shapes[p + name + ".weight"], shapes[p + name + ".bias"] = shape, (shape[1],)
    shapes["transformer.ln_f.weight"] = shapes["transformer.ln_f.bias"] = (width,)

    def tensor(name, shape):
        if name.endswith((".ln_1.weight", ".ln_2.weight", "ln_f.weight")):
            return np.ones(shape, np.float32)
        if name.endswith((".ln_1.bias", ".ln_2.bias", "ln_f.bias")):
            return np.zeros(shape, np.float32)
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    _write_safetensors(folder / "model.safetensors", shapes, tensor)
    print(f"{size}: {sum(int(np.prod(s)) for s in shapes.values()) / 1e6:.0f} M parameters in {folder}")


def _write_safetensors(path: Path, shapes: dict, tensor) -> None:
    """A float32 safetensors file written one tensor at a time (the format: an 8-byte header length, a JSON
    header of dtype, shape and byte offsets, then the data), so building gpt2-xl holds one tensor, not 6 GB."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(len(text).to_bytes(8, "little") + text)
        for name, shape in shapes.items():
            handle.write(np.ascontiguousarray(tensor(name, shape), dtype="<f4").tobytes())


def export(folder: Path, output: Path, quantize: str, validate: bool) -> None:
    from edgelm.export.stages import export_model

    started = time.perf_counter()
    result = export_model(str(folder), output, quantize=quantize, force=True, validate=validate)
    figures = result.manifest["validation"].get("fp32", {})
    print(
        f"exported in {time.perf_counter() - started:.0f} s; stages {result.manifest['export_seconds']}; "
        f"fp32 max relative error {figures.get('max_logits_relative_error')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build")
    b.add_argument("size", choices=SIZES)
    b.add_argument("folder", type=Path)
    b.add_argument("--tokenizer", type=Path, default=SHARED_TOKENIZER)
    e = commands.add_parser("export")
    e.add_argument("folder", type=Path)
    e.add_argument("output", type=Path)
    e.add_argument("--quantize", default="none", choices=("none", "int8", "int4"))
    e.add_argument("--validate", action="store_true")
    args = parser.parse_args()
    if args.command == "build":
        if not (args.tokenizer / "tokenizer.json").exists():
            sys.exit(f"no GPT-2 tokenizer at {args.tokenizer}; pass --tokenizer FOLDER")
        build(args.size, args.folder, args.tokenizer)
    else:
        export(args.folder, args.output, args.quantize, args.validate)


if __name__ == "__main__":
    main()
