"""CPU time of int4's rounding methods on distilgpt2-sized matrices: the export-time cost of each.

    python benchmarks/int4_quantize_time.py [--methods rtn,clip,kquant] [--block 32]

Random normal weights (std 0.02) of the token table's shape (50,257 x 768) and of one MLP matrix (3,072 x 768);
the time is the method's alone (export/int4.py quantize_blocks), one run each.
"""

import argparse
import time

import numpy as np
from edgelm.export.int4 import quantize_blocks

SHAPES = {"token table 50,257 x 768": (50_257, 768), "MLP matrix 3,072 x 768": (3_072, 768)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="rtn,clip,kquant")
    parser.add_argument("--block", type=int, default=32)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| matrix | method | CPU s | wall s |\n| --- | --- | ---: | ---: |")
    for name, shape in SHAPES.items():
        weight = rng.normal(0, 0.02, size=shape).astype(np.float32)
        for method in args.methods.split(","):
            cpu, wall = time.process_time(), time.perf_counter()
            quantize_blocks(weight, args.block, method)
            print(
                f"| {name} | {method} | {time.process_time() - cpu:.2f} | {time.perf_counter() - wall:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
