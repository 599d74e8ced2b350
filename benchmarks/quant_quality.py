"""Quality of packages against a reference package of the same checkpoint, on real text.

    python benchmarks/quant_quality.py REF_PKG PKG [PKG ...] [--text FILE] [--window 512] [--prompts 32]

REF_PKG is normally the float32 export. Each PKG is compared with it on the text (default: the export's
evaluation sample, export/data/): perplexity of each, the change, mean KL(reference || package), top-1
agreement over every position, and greedy agreement of --prompts continuations of 64 tokens. Also printed:
the bytes of each package's graph files, since a recipe is a trade between the two. One JSON line per package,
then a Markdown table.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parent / "export" / "data" / "persuasion-chapters-1-4.txt"


def graph_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model.onnx"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    from edgelm.runtime import load
    from edgelm.runtime.quality.measure import Plan, compare_engines

    reference = load(args.reference)
    ids = reference.encode(args.text.read_text(encoding="utf-8"), add_special_tokens=False)
    window = min(args.window, reference.arch.n_positions)
    plan = Plan(window, prompts=args.prompts, new_tokens=args.new_tokens)
    rows = []
    for path in args.packages:
        model = load(path)
        figures = compare_engines(reference.engine, model.engine, ids, plan)
        row = {"package": path, "graph_bytes": graph_bytes(Path(path))} | figures
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\ntext: {args.text.name}, {len(ids)} tokens, windows of {window}; reference {args.reference}")
    print("| package | graph MB | perplexity change | mean KL | top-1 | greedy identical | greedy prefix |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        g = r["greedy"]
        print(
            f"| {Path(r['package']).name} | {r['graph_bytes'] / 1e6:.1f} | {r['perplexity_change'] * 100:+.2f}% "
            f"| {r['mean_kl_divergence']:.4f} | {r['top1_agreement']:.4f} | {g['identical']}/{g['continuations']} "
            f"| {g['prefix_agreement']:.3f} |"
        )
    print(f"reference perplexity {rows[0]['perplexity_reference']:.2f}" if rows else "", file=sys.stderr)


if __name__ == "__main__":
    main()
