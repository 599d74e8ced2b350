"""One command per figure of several tokens per pass (docs/performance.md): it builds what the figure needs under
benchmarks/out/ (once; a folder that exists is reused), then runs benchmarks/speculative.py on it, which prints the
CPU, the load average and its command line before its figures.

    python benchmarks/speculative_figures.py forced   # distilgpt2's shape, int8: the mostly-forced schema (fixed
                                                      # keys, enum values, a 40-item enum array), auto vs off
    python benchmarks/speculative_figures.py lookup   # prompt lookup, ngram vs off, on quote / extract / open:
                                                      # the trained GPT-2 (gpt2-target) and distilgpt2's shape, int8
    python benchmarks/speculative_figures.py draft    # the trained pair, gpt2-draft drafting gpt2-target (int8):
                                                      # acceptance and speed-up, draft vs off, on the same tasks
Both then run the open task again under each of VARIED's settings, with which a small model that loops under plain
greedy writes varied text: the off-switches at work (the target: >= 0.97x off).
    python benchmarks/speculative_figures.py cost     # the draft's step over the target's at real shapes (random
                                                      # weights, int8): distilgpt2 / gpt2-large, SmolLM2-135M /
                                                      # 1.7B, Qwen2.5-0.5B / 1.5B, and the speed-ups they allow
    python benchmarks/speculative_figures.py server   # 1 and 16 streaming clients of `edgelm serve` at
                                                      # distilgpt2's shape, int8: --speculative off, then ngram
                                                      # (benchmarks/server_load.py; the target: >= 0.95x at 16)
    ... --quick   the smallest setting (5 training steps, 16 tokens, one round, a 5-item array; cost: the trained
                  pair only): proves the command runs; its figures mean nothing

The trained checkpoints come from benchmarks/train_small.py: on Austen's novels when benchmarks/out/austen holds
them (benchmarks/austen_text.sh), else on Python's own documentation (--text python-docs), which every Python has
offline; the figure's lines say which (the checkpoint folder's name ends in the text's name).
"""

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
VARIED = ["repetition_penalty=1.3", "no_repeat_ngram_size=3"]  # greedy settings that stop a small model's loops
REAL_PAIRS = [("distilgpt2", "gpt2-large"), ("smollm2-135m", "smollm2-1.7b"), ("qwen2.5-0.5b", "qwen2.5-1.5b")]


def python(*args) -> None:
    """Run a script of benchmarks/ (or a module with -m) in this Python; stop on its failure."""
    command = [sys.executable, *map(str, args)]
    print("$ " + " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)


def exported(checkpoint: Path, quantize: str) -> Path:
    """The edgelm package of `checkpoint` with this recipe, exported once."""
    package = checkpoint.parent / f"{checkpoint.name}-{quantize}-pkg"
    if not (package / "manifest.json").exists():
        from edgelm.export.stages import export_model

        export_model(str(checkpoint), package, quantize=quantize, validate=False, force=True)
    return package


def trained(shape: str, steps: int) -> Path:
    """benchmarks/train_small.py's checkpoint of `shape`, trained once (--steps) on Austen or Python's docs."""
    text = "austen" if len(list((OUT / "austen").glob("*.txt"))) >= 6 else "python-docs"
    folder = OUT / f"{shape}-{text}-{steps}"
    if not (folder / "model.safetensors").exists():
        python(HERE / "train_small.py", shape, "--text", text, "--steps", steps, "--out", folder)
    return folder


def random_shape(name: str) -> Path:
    """A random-weight checkpoint of a published shape: GPT-2's sizes (gpt2_sizes.py), others (random_checkpoint.py)."""
    folder = OUT / f"{name}-random"
    if not (folder / "model.safetensors").exists():
        sys.path.insert(0, str(HERE))
        if name.startswith(("distilgpt2", "gpt2")):
            from gpt2_sizes import SHARED_TOKENIZER, build

            build(name, folder, SHARED_TOKENIZER)
        else:
            from random_checkpoint import build

            build(name, folder)
    return folder


def distilgpt2_int8() -> Path:
    sys.path.insert(0, str(HERE.parent / "tools"))  # tools/distilgpt2_checkpoint.py
    from distilgpt2_checkpoint import build

    return exported(build(OUT / "distilgpt2-random"), "int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["forced", "lookup", "draft", "cost", "server"])
    parser.add_argument("--quick", action="store_true", help="the smallest setting: proves the command runs")
    parser.add_argument("--steps", type=int, default=600, help="training steps of the trained checkpoints")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from speculative import header

    header()
    steps, rounds = (5, 1) if args.quick else (args.steps, args.rounds)
    common = ["--rounds", rounds] + (["--tokens", 16, "--items", 5] if args.quick else [])
    bench = HERE / "speculative.py"
    if args.figure == "forced":
        python(bench, distilgpt2_int8(), "--tasks", "schema", "--modes", "off,auto", *common)
    elif args.figure == "lookup":
        for package in (exported(trained("gpt2-target", steps), "int8"), distilgpt2_int8()):
            python(bench, package, "--tasks", "quote,extract,open", "--modes", "off,ngram", *common)
        for option in VARIED:
            python(bench, exported(trained("gpt2-target", steps), "int8"), "--tasks", "open", "--modes", "off,ngram",
                   "--option", option, *common)  # fmt: skip
    elif args.figure == "draft":
        target, draft = (exported(trained(shape, steps), "int8") for shape in ("gpt2-target", "gpt2-draft"))
        python(bench, target, "--draft", draft, "--tasks", "quote,extract,open", "--modes", "off,draft", *common)
        for option in VARIED:
            python(bench, target, "--draft", draft, "--tasks", "open", "--modes", "off,draft", "--option", option,
                   *common)  # fmt: skip
    elif args.figure == "server":
        package, clients = distilgpt2_int8(), "1,2" if args.quick else "1,16"
        tokens = ["--max-tokens", 8] if args.quick else []
        for mode in ("off", "ngram"):
            python(HERE / "server_load.py", package, "--clients", clients, "--rounds", rounds, *tokens, "--",
                   "--speculative", mode)  # fmt: skip
    else:
        pairs = [("gpt2-draft", "gpt2-target")] if args.quick else REAL_PAIRS
        for small, large in pairs:
            if args.quick:
                draft, target = (exported(trained(shape, steps), "int8") for shape in (small, large))
            else:
                draft, target = (exported(random_shape(name), "int8") for name in (small, large))
            python(bench, target, "--draft", draft, "--cost-ratio", "--rounds", rounds)


if __name__ == "__main__":
    main()
