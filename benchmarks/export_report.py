"""Export a distilgpt2-shaped checkpoint fp32 and int8 and report stage times, sizes and int8 quality.

    python benchmarks/export_report.py [CHECKPOINT]   (default: build one from ../shared)
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from distilgpt2_checkpoint import build  # noqa: E402

from edgelm.export.pipeline import export_model  # noqa: E402

OUT = Path(__file__).parent / "out"


def main():
    checkpoint = Path(sys.argv[1]) if len(sys.argv) > 1 else build(OUT / "distilgpt2-random")
    rows = {}
    for recipe in ("none", "int8", "int4"):
        started = time.perf_counter()
        result = export_model(str(checkpoint), OUT / f"pkg-{recipe}", quantize=recipe, force=True)
        m = result.manifest
        rows[recipe] = {
            "total_s": round(time.perf_counter() - started, 1),
            "stages_s": m["export_seconds"],
            "package_MB": round(sum(f["size"] for f in m["files"].values()) / 1e6, 1),
            "model_onnx_MB": round(m["files"]["model.onnx"]["size"] / 1e6, 1),
            "fp32_max_logits_rel_error": m["validation"]["fp32"]["max_logits_relative_error"],
            "quality": m["validation"].get(recipe),
        }
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
