#!/usr/bin/env bash
# The runtime on 64-bit ARM, emulated: packages exported on this (x86-64) machine, run by an aarch64 Python with
# aarch64 wheels under qemu-user, as a Raspberry Pi 4 (Cortex-A72: no dot-product instructions) and a Raspberry Pi
# 5 (Cortex-A76: dot product) would run them. Checks: float32 greedy tokens equal to this machine's, int8 and int4
# within the greedy agreement their export recorded, scores, batches and chat (tests/test_reference_tokens.py),
# and a release that is known to stop with "Illegal instruction" there is refused by name.
# Emulated speed means nothing: nothing here is timed.
#
#   benchmarks/aarch64_emulated.sh                         # onnxruntime: pyproject's minimum (.0) and the newest
#   benchmarks/aarch64_emulated.sh 1.24.1                  # the releases given
#
# Needs root (a mount namespace and apt-get), Debian's apt sources and PyPI. What it builds is kept under
# $ARM_WORK (default /tmp/edgelm-aarch64): a Debian bookworm arm64 root (debootstrap's first stage, unpacked
# without running anything in it: Python 3.11 and its libraries), one folder of wheels per onnxruntime release
# (pip --platform ... --target, run by this machine's pip), and the packages with their reference.json.
# onnxruntime reads the CPU's model from /proc/cpuinfo, which qemu-user passes through from the host (x86 text
# that its ARM code does not expect): each run is in its own mount namespace with an ARM cpuinfo bound over it.
# About 10 minutes on 2 cores, the first time (most of it downloads); .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
WORK=${ARM_WORK:-${TMPDIR:-/tmp}/edgelm-aarch64}
ROOT=$WORK/debian-arm64
PACKAGES=${EDGELM_ARM_PACKAGES:-$WORK/packages}
SUITE=bookworm  # Raspberry Pi OS 12 (bookworm) is Debian bookworm: its Python 3.11 and glibc 2.36
mkdir -p "$WORK"

oldest=$(sed -n 's/^ *"onnxruntime>=\([0-9.]*\)".*/\1/p' pyproject.toml)
if [ $# -gt 0 ]; then versions=("$@"); else versions=("$oldest.0" newest); fi

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    echo "== installing qemu-user-static and debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap >/dev/null
fi
if [ ! -x "$ROOT/usr/bin/python3.11" ]; then
    echo "== Debian $SUITE arm64 with Python 3.11 in $ROOT"
    rm -rf "$ROOT"
    debootstrap --foreign --arch=arm64 --variant=minbase \
        --include=python3.11-minimal,libpython3.11-stdlib,libstdc++6,libgcc-s1 "$SUITE" "$ROOT" \
        http://deb.debian.org/debian >"$WORK/debootstrap.log"
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg -x "$deb" "$ROOT"; done  # no second stage to run
fi

cpuinfo() {  # cpuinfo NAME FEATURES PART VARIANT REVISION: four cores of a Cortex-A7x, as Linux shows them
    for i in 0 1 2 3; do
        printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\n' "$i" "$2"
        printf 'CPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' "$4" "$3" "$5"
    done >"$WORK/cpuinfo-$1"
}
cpuinfo cortex-a72 "fp asimd evtstrm crc32 cpuid" 0xd08 0x0 3  # Raspberry Pi 4: ARMv8.0, no asimddp
cpuinfo cortex-a76 "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp" 0xd0b 0x4 1

if [ ! -f "$PACKAGES/reference.json" ]; then
    echo "== exporting the tiny packages into $PACKAGES (with $PYTHON) and recording this machine's tokens"
    ORT_MATRIX_DIR=$WORK/export-only PYTHON=$PYTHON bash benchmarks/onnxruntime_matrix.sh --export-only "$PACKAGES"
fi

emulated() {  # emulated CPU SITE ARGS...: the aarch64 Python with SITE and the checkout's runtime on its path
    local cpu=$1 site=$2
    shift 2
    unshare -m sh -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$WORK/cpuinfo-$cpu" \
        env PYTHONPATH="$site:$WORK/checkout" EDGELM_TEST_PACKAGES="$PACKAGES" EDGELM_HOME="$WORK/store" \
        qemu-aarch64-static -cpu "$cpu" -L "$ROOT" "$ROOT/usr/bin/python3.11" "$@"
}

# the runtime's other dependencies at the versions the exporting Python has (pip resolves nothing for them)
pinned=($("$PYTHON" - <<'PY'
from importlib import metadata
for name in ("numpy", "tokenizers", "click", "jinja2", "huggingface_hub", "tqdm", "pytest", "filelock"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
PY
))
rm -rf "$WORK/checkout" && mkdir -p "$WORK/checkout/edgelm"  # the runtime as this checkout has it
cp -r runtime "$WORK/checkout/edgelm/runtime"
summary=$WORK/summary.txt
: >"$summary"
status=0
for version in "${versions[@]}"; do
    spec=onnxruntime; [ "$version" = newest ] || spec="onnxruntime==$version"
    site=$WORK/site-${version}
    if [ ! -d "$site/onnxruntime" ]; then
        echo "== aarch64 wheels of $spec into $site"
        "$PYTHON" -m pip install -q --disable-pip-version-check --target "$site" --only-binary=:all: \
            --implementation cp --python-version 3.11 --platform manylinux2014_aarch64 \
            --platform manylinux_2_27_aarch64 --platform manylinux_2_28_aarch64 \
            "$spec" "${pinned[@]}"
    fi
    for cpu in cortex-a72 cortex-a76; do
        log=$WORK/$cpu-$version.log
        echo "== $spec on $cpu"
        if emulated "$cpu" "$site" -m pytest -q -p no:cacheprovider -rs \
            tests/test_reference_tokens.py tests/test_aarch64_cpu.py >"$log" 2>&1; then
            result=passed
        else
            result=FAILED; status=1
        fi
        echo "$spec on $cpu: $result: $(grep -E '^[0-9]+ (passed|failed)|^=+ .* in [0-9.]+s' "$log" | tail -1)" | tee -a "$summary"
    done
done
echo "== summary ($summary)"
cat "$summary"
exit $status
