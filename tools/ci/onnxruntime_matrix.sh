#!/usr/bin/env bash
# The runtime's tests under the oldest and the newest onnxruntime edgelm supports, each in a fresh venv that
# holds the runtime's dependencies only (no torch, transformers or optimum), as on a machine that runs packages
# but cannot export them. Outside the default test command: it downloads onnxruntime twice (~2 minutes).
#
#   tools/ci/onnxruntime_matrix.sh                  # pyproject's minimum (its .0 release) and the newest release
#   tools/ci/onnxruntime_matrix.sh 1.23.2 1.28.0    # the releases given
#   tools/ci/onnxruntime_matrix.sh oldest           # pyproject's minimum alone (.ci/run)
#   tools/ci/onnxruntime_matrix.sh --export-only DIR  # the packages and reference.json alone (aarch64_emulated.sh)
#
# The tiny packages are exported first by the checkout's .venv (the export extra; PYTHON=... to use another),
# then the tests read them through EDGELM_TEST_PACKAGES (tests/conftest.py). Work folder: $ORT_MATRIX_DIR.
# Tests whose package needs a newer onnxruntime than the one under test are skipped there, and
# tests/platforms/test_onnxruntime_versions.py checks that such a package is refused with the version to install.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
WORK=${ORT_MATRIX_DIR:-${TMPDIR:-/tmp}/edgelm-onnxruntime-matrix}
TESTS=(
    tests/platforms/test_onnxruntime_versions.py
    tests/engine/test_onnxruntime_errors.py
    tests/model/test_runtime_api.py
    tests/model/test_runtime_errors.py
    tests/model/test_load_verification.py
    tests/model/test_generation_options.py
    tests/package/test_package_trust.py
    tests/text/test_text_stream.py
    tests/engine/test_ort_fast_path.py
    tests/platforms/test_reference_tokens.py
    tests/sampling/test_sampling_outputs.py
    tests/sampling/test_sampling_paths.py
    tests/engine/test_float16_cache.py
    tests/engine/test_prefix_cache.py
    tests/engine/test_scheduler.py
)
RUNTIME_DEPENDENCIES=(numpy tokenizers click jinja2 huggingface_hub uvicorn starlette pydantic prometheus-client)  # + the server extra
TEST_DEPENDENCIES=(pytest pytest-xdist onnx)  # onnx builds the tests' own small graphs; the runtime never imports it

oldest=$(sed -n 's/^ *"onnxruntime>=\([0-9.]*\)".*/\1/p' pyproject.toml)
packages=$WORK/packages
export_only=
if [ "${1:-}" = --export-only ]; then export_only=1; packages=${2:?--export-only DIR}; shift 2; fi
if [ $# -gt 0 ]; then versions=("${@/#oldest/$oldest.0}"); else versions=("$oldest.0" newest); fi
mkdir -p "$WORK"

echo "== exporting the tiny packages into $packages (with $PYTHON)"
"$PYTHON" - "$packages" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "tests/support")
from checkpoints import build_checkpoint  # noqa: E402
from edgelm.export.stages import export_model  # noqa: E402

out = Path(sys.argv[1])
checkpoint = build_checkpoint(out / "checkpoint")  # conftest.py's tiny_checkpoint
recipes = {"tiny-fp32": {}, "tiny-int8": {"quantize": "int8"}, "tiny-int8-rows": {"quantize": "int8-rows"},
           "tiny-int8-dynamic": {"quantize": "int8-dynamic"}, "tiny-int4": {"quantize": "int4"},
           "tiny-int8-kv8": {"quantize": "int8", "kv_cache": "int8"}}
for name, options in recipes.items():  # the quantized ones validated: test_reference_tokens.py needs their agreement
    export_model(str(checkpoint), out / name, validate=name != "tiny-fp32", force=True, **options)
from llama_checkpoints import build_llama_checkpoint  # noqa: E402  conftest.py's llama_package, qwen2_package

for name, shape, seed in (("tiny-llama", "llama-gqa", 0), ("tiny-qwen2", "qwen2", 1)):
    export_model(str(build_llama_checkpoint(out / name, shape, seed=seed)), out / f"{name}-pkg", force=True)
tokenizer = Path("..") / "shared" / "gpt2-tokenizer"  # conftest.py's gpt2_vocab_package, where ../shared has it
if (tokenizer / "tokenizer.json").exists():
    vocab = build_checkpoint(out / "checkpoint-gpt2-vocab", n_positions=128, tokenizer_folder=tokenizer)
    export_model(str(vocab), out / "gpt2-vocab", validate=False, force=True)
PY
echo "== the exporting machine's tokens: $packages/reference.json"
"$PYTHON" tests/support/reference_tokens.py "$packages"
[ -z "$export_only" ] || exit 0

summary=$WORK/summary.txt
: >"$summary"
status=0
for version in "${versions[@]}"; do
    spec=onnxruntime; [ "$version" = newest ] || spec="onnxruntime==$version"
    venv=$WORK/venv-${version//\*/x}
    echo "== $spec in $venv"
    python3 -m venv --clear "$venv"
    "$venv/bin/pip" install -q "$spec" "${RUNTIME_DEPENDENCIES[@]}" "${TEST_DEPENDENCIES[@]}"
    "$venv/bin/pip" install -q --no-deps -e .
    installed=$("$venv/bin/python" -c "import onnxruntime; print(onnxruntime.__version__)")
    log=$WORK/onnxruntime-$installed.log
    if EDGELM_TEST_PACKAGES=$packages "$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto -rs "${TESTS[@]}" 2>&1 | tee "$log"; then
        result=passed
    else
        result=FAILED; status=1
    fi
    echo "onnxruntime $installed: $result: $(grep -E '^[0-9]+ (passed|failed)|^=+ .* in [0-9.]+s' "$log" | tail -1)" | tee -a "$summary"
done
echo "== summary ($summary)"
cat "$summary"
exit $status
