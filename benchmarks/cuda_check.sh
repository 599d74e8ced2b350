#!/usr/bin/env bash
# The CUDA checks in one go, for a machine with an NVIDIA GPU and onnxruntime-gpu installed alone:
#   1. the onnxruntime Python imports has the CUDA provider (else the runtime's own one-line reason, exit 1);
#   2. the CUDA tests (tests/platforms/test_devices_and_peers.py -k cuda: CUDA generation equals CPU, provider choice);
#   3. `edgelm bench --device cuda`, and `--device cpu` beside it, as JSON under $CUDA_CHECK_OUT;
#   4. benchmarks/cuda_parity.py on the package: CUDA against the CPU, log-probs, greedy tokens, a batch.
#
#   benchmarks/cuda_check.sh [PACKAGE]    # default: models/distilgpt2 where it exists, else a tiny package
#
# Set up the GPU wheel first (the CPU wheel that `pip install edgelm` brings would shadow it):
#   pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu>=1.22'
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${CUDA_CHECK_OUT:-benchmarks/out/cuda}
mkdir -p "$OUT"

echo "== 1/4 onnxruntime and its CUDA provider"
"$PYTHON" - <<'PY'
import sys

import onnxruntime

from edgelm.runtime.errors import DeviceError
from edgelm.runtime.package.onnxruntime_compat import installed_distributions
from edgelm.runtime.session import choose_providers

print(f"onnxruntime {onnxruntime.__version__} ({', '.join(installed_distributions()) or 'no distribution metadata'}),",
      "providers:", ", ".join(onnxruntime.get_available_providers()))
try:
    choose_providers("cuda")
except DeviceError as error:
    sys.exit(f"Error: {error}")
PY

echo "== 2/4 the CUDA tests"
"$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/platforms/test_devices_and_peers.py -k cuda 2>&1 | tee "$OUT/tests.log"
if grep -q "SKIPPED" "$OUT/tests.log"; then
    echo "Error: a CUDA test was skipped; with a GPU and onnxruntime-gpu none should be." >&2
    exit 1
fi

package=${1:-}
if [ -z "$package" ]; then
    if [ -f models/distilgpt2/manifest.json ]; then
        package=models/distilgpt2
    else
        package=$OUT/tiny-fp32
        "$PYTHON" - "$package" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "tests/support")
from checkpoints import build_checkpoint  # noqa: E402
from edgelm.export.stages import export_model  # noqa: E402

out = Path(sys.argv[1])
export_model(str(build_checkpoint(out.parent / "tiny-checkpoint")), out, validate=False, force=True)
PY
    fi
fi

echo "== 3/4 edgelm bench $package --device cuda (and cpu)"
for device in cuda cpu; do
    "$PYTHON" -m edgelm.runtime.cli bench "$package" --device "$device" --json >"$OUT/bench-$device.json"
    "$PYTHON" -c "import json, sys; from edgelm.runtime.apps.bench import format_table; print(format_table(json.load(open(sys.argv[1]))))" "$OUT/bench-$device.json"
done
echo "== 4/4 CUDA against the CPU on $package"
"$PYTHON" benchmarks/cuda_parity.py "$package" | tee "$OUT/parity.jsonl"
echo "== figures in $OUT"
