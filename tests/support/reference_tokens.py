"""What the exporting machine's runtime makes of each tiny package, written beside the packages, so that a
runtime elsewhere (the oldest onnxruntime edgelm supports, an emulated aarch64 CPU) is checked against it by
tests/platforms/test_reference_tokens.py.

    python tests/support/reference_tokens.py PACKAGES      # writes PACKAGES/reference.json

PACKAGES holds the folders tools/ci/onnxruntime_matrix.sh exports (tiny-fp32, tiny-int8, ...). Per package:
the greedy tokens of each prompt, and the score (per-token log-probabilities) of the first one."""

import json
import platform
import sys
from pathlib import Path

PROMPTS = ("Hello, my name is", "The quick brown fox", "Once upon a time")
NEW_TOKENS = 16
REFERENCE = "reference.json"


def greedy(model, prompts=PROMPTS) -> list[list[int]]:
    """Each prompt alone, NEW_TOKENS greedy tokens (no early stop: every position is compared)."""
    return [
        list(model.generate(p, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False).token_ids)
        for p in prompts
    ]


def write(packages: Path) -> Path:
    import edgelm.runtime as rt
    import onnxruntime

    found = {}
    for folder in sorted(p for p in packages.iterdir() if (p / "manifest.json").exists()):
        model = rt.load(folder, device="cpu")
        found[folder.name] = {
            "greedy": greedy(model),
            "score": [float(x) for x in model.score(PROMPTS[0]).logprobs[1:]],
        }
    record = {"onnxruntime": onnxruntime.__version__, "machine": platform.machine(), "prompts": PROMPTS}
    path = packages / REFERENCE
    path.write_text(json.dumps({**record, "packages": found}, indent=1))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PACKAGES")
    print(write(Path(sys.argv[1])))
