#!/usr/bin/env bash
# The int4 recipe's options measured on one checkpoint: a float32 export, one int4 export per recipe given
# (BLOCK:METHOD:HEAD_BITS, as edgelm export's --int4-block / --int4-method / --int4-head), then
# benchmarks/quant_quality.py compares every int4 package with the float32 one on the export's evaluation text.
#
#   benchmarks/int4_methods.sh CHECKPOINT WORKDIR 16:rtn:4 32:rtn:4 32:clip:4 32:gptq:4 32:clip:8 ...
#
# Prints each export's time (gptq and hqq cost more), then quant_quality.py's JSON lines and Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
checkpoint=${1:?CHECKPOINT}
work=${2:?WORKDIR}
shift 2
mkdir -p "$work"
"$PYTHON" -m edgelm.runtime.cli export "$checkpoint" -o "$work/float32" --no-validate --force >/dev/null
packages=()
for recipe in "$@"; do
    IFS=: read -r block method head <<<"$recipe"
    out="$work/int4-$block-$method-head$head"
    started=$(date +%s.%N)
    "$PYTHON" -m edgelm.runtime.cli export "$checkpoint" -o "$out" --quantize int4 --int4-block "$block" \
        --int4-method "$method" --int4-head "$head" --no-validate --force >/dev/null
    echo "export $recipe: $(echo "$(date +%s.%N) - $started" | bc) s"
    packages+=("$out")
done
"$PYTHON" benchmarks/quant_quality.py "$work/float32" "${packages[@]}"
