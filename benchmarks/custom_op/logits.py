"""Two graphs of one package decoded side by side: how far apart their logits go over a prompt and 16 steps.

    python benchmarks/custom_op/logits.py HEAD_VARIANT CUSTOM_VARIANT --library LIB   # MatMulNBits / Q8MatMul
    python benchmarks/custom_op/logits.py PKG PKG --perturb 1e-6    # the graph's own spread: inputs x (1 + 1e-6)

Each graph is fed the same random input rows (benchmarks/step_profile.py's feeds: a prompt of 8 positions, then
one position a step) and its own cache; --library registers LIB for the second graph only, --perturb scales the
second graph's input rows by (1 + PERTURB). Prints the largest logits difference over the largest logit and how
many positions pick the same top token. Random weights make a deep graph chaotic: a difference of one rounding
step in a block's activations grows layer by layer, which --perturb measures on the stock kernels.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import step_profile  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--library", help="a custom-op library the second graph needs")
    parser.add_argument("--perturb", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = [{}, {"custom_ops": args.library} if args.library else {}]
    folders = (args.first, args.second)
    sessions = [step_profile.make_session(p / "model.onnx", args.threads, o, None) for p, o in zip(folders, options)]
    if args.perturb and "inputs_embeds" not in {v.name for v in sessions[1].get_inputs()}:
        raise SystemExit("--perturb scales inputs_embeds, which this graph does not take")
    outputs = [o.name for o in sessions[0].get_outputs()]
    cache = [v for v in sessions[0].get_inputs() if v.name.startswith("past_key_values.")]
    empty = {v.name: np.zeros((1, v.shape[1], 0, v.shape[3]), np.float32) for v in cache}
    pasts, rng = [dict(empty), dict(empty)], np.random.default_rng(0)
    position, length, worst, same, total = 0, 8, 0.0, 0, 0
    for _ in range(17):
        feeds = step_profile.feeds_for(sessions[0], pasts[0], length, position, rng)
        logits = []
        for i, session in enumerate(sessions):
            mine = dict(feeds) | pasts[i]
            if i and args.perturb:
                mine["inputs_embeds"] = mine["inputs_embeds"] * np.float32(1 + args.perturb)
            named = dict(zip(outputs, session.run(outputs, mine)))
            logits.append(named["logits"])
            pasts[i] = {v.name: named["present." + v.name.removeprefix("past_key_values.")] for v in cache}
        worst = max(worst, float(np.abs(logits[0] - logits[1]).max() / np.abs(logits[0]).max()))
        same += int((logits[0].argmax(-1) == logits[1].argmax(-1)).sum())
        total += logits[0].shape[1]
        position, length = position + length, 1
    print(f"max |logits difference| / max |logits| {worst:.3g}; the same top token at {same} of {total} positions")


if __name__ == "__main__":
    main()
