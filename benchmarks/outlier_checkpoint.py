"""A GPT-2 checkpoint with outlier channels in its products' inputs, computing the same function.

    python benchmarks/outlier_checkpoint.py CHECKPOINT OUT [--channels 4] [--scale 20] [--seed 0]

Trained transformers carry a few input channels tens of times larger than the rest (the layer norm's weight
amplifies them); quantizing activations in blocks, a large channel sets its block's scale, and the block's other
inputs get fewer levels. Random and small trained checkpoints have no such channels. This multiplies the same
few channels of every layer's two layer norms (weight and bias) by --scale and divides the rows of the product
that reads them by it: in float arithmetic the model is unchanged, while every product's input has --channels
outliers --scale times its neighbours. Export the result and compare recipes with benchmarks/quant_quality.py
against its float32 export.
"""

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = GPT2LMHeadModel.from_pretrained(args.checkpoint, dtype=torch.float32)
    width = model.config.n_embd
    channels = np.random.default_rng(args.seed).choice(width, size=args.channels, replace=False).tolist()
    with torch.no_grad():
        for block in model.transformer.h:
            for norm, product in ((block.ln_1, block.attn.c_attn), (block.ln_2, block.mlp.c_fc)):
                norm.weight[channels] *= args.scale
                norm.bias[channels] *= args.scale
                product.weight[channels, :] /= args.scale  # Conv1D: [inputs, outputs]
    model.save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        if (args.checkpoint / name).exists():
            shutil.copy(args.checkpoint / name, args.out / name)
    print(f"{args.out}: channels {sorted(channels)} of {width} scaled by {args.scale:g} in every layer's inputs")


if __name__ == "__main__":
    main()
