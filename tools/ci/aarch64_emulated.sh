#!/usr/bin/env bash
# The runtime on 64-bit ARM, emulated: packages exported on this (x86-64) machine, run by an aarch64 Python with
# aarch64 wheels under qemu-user, as a Raspberry Pi 4 (Cortex-A72: no dot-product instructions) and a Raspberry Pi
# 5 (Cortex-A76: dot product) would run them. Checks: float32 greedy tokens equal to this machine's, int8 and int4
# within the greedy agreement their export recorded, scores, batches and chat (tests/platforms/test_reference_tokens.py),
# and a release that is known to stop with "Illegal instruction" there is refused by name.
# Emulated speed says nothing of a board's: only --start-to-first-token times anything, to show which parts of a
# start dominate on an ARM core (the interpreter, the imports, edgelm generate: start_to_first_token.py's commands).
#
#   tools/ci/aarch64_emulated.sh                         # onnxruntime: pyproject's minimum (.0) and the newest
#   tools/ci/aarch64_emulated.sh 1.24.1                  # the releases given
#   tools/ci/aarch64_emulated.sh --survey [VERSION...]   # every release from pyproject's minimum to the newest
#                                                          # that has an aarch64 wheel (or those given), on
#                                                          # cortex-a72 only
#   tools/ci/aarch64_emulated.sh --start-to-first-token PKG [ROUNDS]
#                                                          # emulated seconds to edgelm generate's first token
#
# The survey (1 to 10 minutes a release on 2 shared cores; not in .ci/run) says per release whether it runs the
# packages on a Raspberry Pi 4's CPU, stops with "Illegal instruction", or has no aarch64 wheel for the emulated
# Python; its table is $ARM_WORK/survey.txt, and docs/install.md and runtime/package/onnxruntime_compat.py
# (NEEDS_DOT_PRODUCT, RUNS_WITHOUT_DOT_PRODUCT) hold its result. The runtime is copied when a run starts, but
# the tests are read from the checkout as each release's turn comes: leave them alone while it runs.
#
# Needs root (a mount namespace and apt-get), Debian's apt sources and PyPI. What it builds is kept under
# $ARM_WORK (default /tmp/edgelm-aarch64): a Debian bookworm arm64 root (debootstrap's first stage, unpacked
# without running anything in it: Python 3.11 and its libraries), one folder of wheels per onnxruntime release
# (pip --platform ... --target, run by this machine's pip), and the packages with their reference.json.
# onnxruntime reads the CPU's model from /proc/cpuinfo, which qemu-user passes through from the host (x86 text
# that its ARM code does not expect): each run is in its own mount namespace with an ARM cpuinfo bound over it.
# About 10 minutes on 2 cores, the first time (most of it downloads); .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
WORK=${ARM_WORK:-${TMPDIR:-/tmp}/edgelm-aarch64}
ROOT=$WORK/debian-arm64
PACKAGES=${EDGELM_ARM_PACKAGES:-$WORK/packages}
SUITE=bookworm  # Raspberry Pi OS 12 (bookworm) is Debian bookworm: its Python 3.11 and glibc 2.36
mkdir -p "$WORK"

oldest=$(sed -n 's/^ *"onnxruntime>=\([0-9.]*\)".*/\1/p' pyproject.toml)
cpus=(cortex-a72 cortex-a76)
survey= selected=()
if [ "${1:-}" = --survey ]; then
    survey=1 cpus=(cortex-a72) selected=(-k "greedy or refused or cpuinfo")  # greedy tokens of every package; the CPU check
    # every release PyPI lists from the minimum on: the newest patch of each minor release first, oldest minor
    # first, then the other patches, so a survey cut short has still seen every minor release; one without an
    # aarch64 wheel is reported as such
    versions=($("$PYTHON" -m pip index versions onnxruntime 2>/dev/null | sed -n 's/^Available versions: //p' |
        tr ',' '\n' | tr -d ' ' | "$PYTHON" -c "
import sys
def key(v): return tuple(int(p) for p in v.split('.'))
found = sorted((v for v in sys.stdin.read().split() if v.replace('.', '').isdigit()), key=key)
found = [v for v in found if key(v) >= key('$oldest.0')]
newest = [v for i, v in enumerate(found) if i + 1 == len(found) or key(found[i + 1])[:2] != key(v)[:2]]
print(' '.join(newest + [v for v in found if v not in newest]))"))
    [ ${#versions[@]} -gt 0 ] || { echo "pip index versions onnxruntime listed nothing" >&2; exit 2; }
    [ $# -lt 2 ] || versions=("${@:2}")
elif [ "${1:-}" = --start-to-first-token ]; then
    start_package=$(realpath "${2:?--start-to-first-token needs a package folder}") rounds=${3:-3} versions=(newest)
elif [ $# -gt 0 ]; then versions=("$@"); else versions=("$oldest.0" newest); fi

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

# The packages are kept between runs while the code that exports them is unchanged: the stamp is the checkout's
# blob ids of that code (export/, the export script, the tests' checkpoint builders and the reference recorder).
stamp=$(git ls-files -s export tools/ci/onnxruntime_matrix.sh tests/support | sha256sum | cut -d' ' -f1)
# (EDGELM_ARM_PACKAGES: packages given by the caller, used as they are.)
stale=no
[ -n "${EDGELM_ARM_PACKAGES:-}" ] || [ "$(cat "$PACKAGES/.export-stamp" 2>/dev/null)" = "$stamp" ] || stale=yes
if [ ! -f "$PACKAGES/reference.json" ] || [ "$stale" = yes ]; then
    echo "== exporting the tiny packages into $PACKAGES (with $PYTHON) and recording this machine's tokens"
    [ -n "${EDGELM_ARM_PACKAGES:-}" ] || rm -rf "$PACKAGES"
    ORT_MATRIX_DIR=$WORK/export-only PYTHON=$PYTHON bash tools/ci/onnxruntime_matrix.sh --export-only "$PACKAGES"
    echo "$stamp" >"$PACKAGES/.export-stamp"
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
summary=$WORK/summary.txt; [ -z "$survey" ] || summary=$WORK/survey.txt
: >"$summary"
status=0
aarch64_wheels() {  # aarch64_wheels FOLDER PIP_ARGS...: this machine's pip fetching wheels for the emulated Python
    local folder=$1
    shift
    "$PYTHON" -m pip install -q --disable-pip-version-check --target "$folder" --only-binary=:all: \
        --implementation cp --python-version 3.11 --platform manylinux2014_aarch64 \
        --platform manylinux_2_27_aarch64 --platform manylinux_2_28_aarch64 "$@"
}
if [ -n "$survey" ] && [ ! -d "$WORK/site-deps/numpy" ]; then
    # the survey's releases share one folder of everything else (onnxruntime's own dependencies included, as the
    # newest release names them), so each release adds one wheel, not a 260 MB folder
    echo "== the other aarch64 wheels into $WORK/site-deps"
    rm -rf "$WORK/site-deps" "$WORK/site-deps.tmp"
    aarch64_wheels "$WORK/site-deps.tmp" onnxruntime "${pinned[@]}"
    rm -rf "$WORK/site-deps.tmp"/onnxruntime "$WORK/site-deps.tmp"/onnxruntime-*.dist-info
    mv "$WORK/site-deps.tmp" "$WORK/site-deps"
fi
for version in "${versions[@]}"; do
    spec=onnxruntime; [ "$version" = newest ] || spec="onnxruntime==$version"
    site=$WORK/site-${version}
    wheels=("$spec" "${pinned[@]}")
    if [ -n "$survey" ]; then site=$WORK/survey-$version wheels=(--no-deps "$spec"); fi
    if [ ! -d "$site/onnxruntime" ]; then
        echo "== aarch64 wheels of $spec into $site"
        if ! aarch64_wheels "$site" "${wheels[@]}" >"$WORK/pip-$version.log" 2>&1; then
            rm -rf "$site"
            echo "$spec: no aarch64 wheel for Python 3.11 ($WORK/pip-$version.log)" | tee -a "$summary"
            [ -n "$survey" ] || status=1
            continue
        fi
    fi
    [ -z "$survey" ] || site=$site:$WORK/site-deps
    if [ -n "${start_package:-}" ]; then  # rounds of three commands in turn, the first round a warm-up
        times=$WORK/start-to-first-token.txt
        : >"$times"
        for round in $(seq 0 "$rounds"); do
            for name in "python -c pass" "+ numpy, onnxruntime, tokenizers" "edgelm generate"; do
                case $name in
                    python*) command=(-c pass) ;;
                    +*) command=(-c "import numpy, onnxruntime, tokenizers") ;;
                    *) command=(-m edgelm.runtime.cli generate -m "$start_package" Hello --max-new-tokens 1) ;;
                esac
                started=$EPOCHREALTIME
                EDGELM_CACHE=$WORK/cache emulated cortex-a72 "$site" "${command[@]}" >/dev/null
                [ "$round" = 0 ] || printf '%s\t%s\t%s\n' "$name" "$started" "$EPOCHREALTIME" >>"$times"
            done
        done
        "$PYTHON" - "$times" <<'PY'
import statistics, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
for name in dict.fromkeys(name for name, _, _ in rows):
    seconds = [float(end) - float(start) for n, start, end in rows if n == name]
    print(f"cortex-a72 (emulated) {name:34} median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max {max(seconds):.2f})")
PY
        exit 0
    fi
    for cpu in "${cpus[@]}"; do
        log=$WORK/$cpu-$version.log
        echo "== $spec on $cpu"
        code=0  # onnxruntime imported bare first: an illegal instruction shows as itself, not as a refusal
        emulated "$cpu" "$site" -c "import onnxruntime" >"$log" 2>&1 || code=$?
        [ $code != 0 ] || emulated "$cpu" "$site" -m pytest -q -p no:cacheprovider -rs "${selected[@]}" \
            tests/platforms/test_reference_tokens.py tests/platforms/test_aarch64_cpu.py >>"$log" 2>&1 || code=$?
        if [ $code = 0 ]; then
            result=passed
        elif [ $code = 132 ] || grep -q "Illegal instruction" "$log"; then
            result="FAILED: Illegal instruction"; status=1  # SIGILL: 128 + 4
        else
            result=FAILED; status=1
        fi
        echo "$spec on $cpu: $result: $(grep -E '^[0-9]+ (passed|failed)|^=+ .* in [0-9.]+s' "$log" | tail -1)" | tee -a "$summary"
    done
done
echo "== summary ($summary)"
cat "$summary"
exit $status
