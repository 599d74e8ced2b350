#!/bin/sh
# Build libedgelm_q8.so for the CPU that runs this (-march=native) against onnxruntime's C API header.
#   benchmarks/custom_op/build.sh ORT_INCLUDE_DIR [OUT_DIR]     (or ORT_INCLUDE=DIR in the environment)
# ORT_INCLUDE_DIR holds onnxruntime_c_api.h and the headers it includes (the onnxruntime release's
# include/onnxruntime/core/session/; the Python wheel ships none); OUT_DIR defaults to benchmarks/out/custom_op.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
include=${1:-${ORT_INCLUDE:-}}
out=${2:-$here/../out/custom_op}
if [ -z "$include" ] || [ ! -f "$include/onnxruntime_c_api.h" ]; then
  echo "usage: $0 ORT_INCLUDE_DIR [OUT_DIR]: a folder with onnxruntime_c_api.h" >&2
  exit 2
fi
mkdir -p "$out"
${CC:-cc} -O3 -march=native -shared -fPIC -Wall -Wextra -I"$include" "$here/q8_matmul.c" -o "$out/libedgelm_q8.so"
echo "$out/libedgelm_q8.so"
