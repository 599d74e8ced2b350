"""Export a distilgpt2-shaped checkpoint fp32, int8, int4 and int8 with an int8 KV cache; report stage times,
sizes and quality.

    python benchmarks/export_report.py [CHECKPOINT]   (default: build one from ../shared)
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # tools/distilgpt2_checkpoint.py

from distilgpt2_checkpoint import build  # noqa: E402
from edgelm.export.stages import export_model  # noqa: E402

OUT = Path(__file__).parent / "out"


def main():
    checkpoint = Path(sys.argv[1]) if len(sys.argv) > 1 else build(OUT / "distilgpt2-random")
    rows = {}
    for name, recipe, kv_cache in (
        ("none", "none", "float32"),
        ("int8", "int8", "float32"),
        ("int4", "int4", "float32"),
        ("int8-kv8", "int8", "int8"),
    ):
        started = time.perf_counter()
        result = export_model(str(checkpoint), OUT / f"pkg-{name}", quantize=recipe, force=True, kv_cache=kv_cache)
        m = result.manifest
        rows[name] = {
            "total_s": round(time.perf_counter() - started, 1),
            "stages_s": m["export_seconds"],
            "package_MB": round(sum(f["size"] for f in m["files"].values()) / 1e6, 1),
            "weights_MB": round(m["files"]["model.onnx.data"]["size"] / 1e6, 1),
            "fp32_max_logits_rel_error": m["validation"]["fp32"]["max_logits_relative_error"],
            "quality": m["validation"].get(recipe),
        }
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(__doc__)
    main()
