"""Which onnxruntime runs a package, and which onnxruntime is installed.

The oldest onnxruntime a graph needs follows from the operators and attributes it uses. `OPERATOR_MINIMUM`
is measured, not read from release notes: tiny packages of every recipe, each loaded and run (greedy, sampled,
a padded batch, scoring) on every onnxruntime release from 1.20 to 1.32, against the newest release's tokens
(`tools/ci/onnxruntime_matrix.sh` repeats the check for the oldest and newest supported releases):

    recipe                  1.20-1.21  1.22     1.23-1.24  1.25-1.26        1.27              1.28-1.32
    float32, int8-dynamic   refused    runs     runs       runs             runs              runs
    int4 weights            refused    refused  runs       runs             runs              runs
    int8 KV cache           refused    refused  refused    fails at 1st run wrong for batch>1 runs

The int8 recipe (MatMulNBits with bits 8) needs nothing newer than its GroupQueryAttention's 1.22 on x86-64: it
was run on 1.22.0 and 1.32.0 only (`tools/ci/onnxruntime_matrix.sh oldest`: the runtime tests pass, its batch
equal to its prompts alone). On 64-bit ARM it needs 1.23 (`ARM64_MINIMUM`). int8-rows' integer products
(MatMulIntegerToFloat, QGemm) need 1.22 there too (`tools/ci/aarch64_emulated.sh` runs them on 1.22.0).

`edgelm export` writes the result into the manifest (graph.min_onnxruntime); the loader checks it before
creating a session, and works it out from the graph itself for a package whose manifest predates the field.

Standard library only, so `edgelm export` and the launcher can use it without loading onnxruntime; logging and
the installed distributions are read from their folders' names, not through importlib.metadata (the launcher
reads them before its restart, and every command pays for what it imports).
"""

import os
import re
import sys

from ..errors import DeviceError, PackageError

# (operator, attribute or None for the operator itself) -> (oldest onnxruntime, what needs it). 1.21's
# GroupQueryAttention takes 9 inputs at most; edgelm's passes its attention bias as the 11th.
OPERATOR_MINIMUM = {
    ("GroupQueryAttention", None): ("1.22", "GroupQueryAttention with an attention_bias input"),
    ("GatherBlockQuantized", "bits"): ("1.23", "the int4 token lookup (GatherBlockQuantized's bits attribute)"),
    ("GroupQueryAttention", "kv_cache_bit_width"): ("1.28", "the int8 KV cache"),  # 1.25-1.27: see the table above
}
# Where 64-bit ARM needs a newer release than OPERATOR_MINIMUM: onnxruntime 1.22's aarch64 build has no 8-bit
# MatMulNBits kernel, and the int8 recipe's first step fails in MatMulNBits<T1>::Compute (1.22.0 and 1.22.1 under
# qemu's cortex-a72 and cortex-a76, tools/ci/aarch64_emulated.sh 1.22.0 1.22.1; 1.23.0 runs it). The scan
# records integer attributes as "name=value" (package/graph_scan.py).
ARM64_MINIMUM = {
    ("MatMulNBits", "bits=8"): ("1.23", "8-bit MatMulNBits on 64-bit ARM (the int8 recipe)"),
}
ARM64 = ("aarch64", "arm64")
OLDEST_SUPPORTED = OPERATOR_MINIMUM[("GroupQueryAttention", None)][0]  # the float32 package's: pyproject's minimum
# Releases whose aarch64 wheel stops the process with "Illegal instruction" as it is imported, on a 64-bit ARM CPU
# without the dot-product instructions (Cortex-A72: Raspberry Pi 4, Cortex-A53: Pi 3 and Zero 2 W); reported by
# Pi 4 users (onnxruntime issues 23957, 24112, 24512) and reproduced under qemu's cortex-a72 model
# (tools/ci/aarch64_emulated.sh, which also runs pyproject's minimum and the newest release there).
NEEDS_DOT_PRODUCT = ("1.21.0",)
# Releases that import onnxruntime and run the tiny packages they are new enough for on qemu's cortex-a72 model,
# greedy tokens as x86-64's (quantized within their recorded agreement), refusing the others by name:
# `tools/ci/aarch64_emulated.sh --survey`, 2026-12-02 and 2026-12-05 (benchmarks/results/2026-12-0[25]-aarch64-
# survey.md; 1.22.x ran the int8 recipe of the time, DynamicQuantizeMatMul: today's is refused there, ARM64_MINIMUM).
# Those not listed have not been run there.
RUNS_WITHOUT_DOT_PRODUCT = (
    "1.22.0",
    "1.22.1",
    "1.23.0",
    "1.23.1",
    "1.23.2",
    "1.24.1",
    "1.24.2",
    "1.24.3",
    "1.24.4",
    "1.25.0",
    "1.25.1",
    "1.26.0",
    "1.27.0",
    "1.28.0",
    "1.29.0",
    "1.30.0",
    "1.31.0",
    "1.31.1",
    "1.32.0",
)
CPU_WHEEL, GPU_WHEEL = "onnxruntime", "onnxruntime-gpu"
# Distributions that all install the same `onnxruntime` import package: two of them overwrite each other's files.
DISTRIBUTIONS = (CPU_WHEEL, GPU_WHEEL, "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn")
REINSTALL_GPU = f"pip uninstall -y {CPU_WHEEL} {GPU_WHEEL} && pip install '{GPU_WHEEL}>={OLDEST_SUPPORTED}'"


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.22.1', '1.23.0.dev20250101', '1.22.0+cu124' -> (1, 22, 1) / (1, 23, 0) / (1, 22, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def this_machine() -> str:
    """The machine's architecture, lower case: os.uname()'s ('x86_64', 'aarch64', 'arm64'), on Windows the
    PROCESSOR_ARCHITECTURE it sets ('amd64', 'arm64'); '' where neither says."""
    return (os.uname().machine if hasattr(os, "uname") else os.environ.get("PROCESSOR_ARCHITECTURE", "")).lower()


def _tables(machine: str | None) -> list[dict]:
    return [ARM64_MINIMUM, OPERATOR_MINIMUM] if (machine or "").lower() in ARM64 else [OPERATOR_MINIMUM]


def graph_minimum(uses, machine: str | None = None) -> str | None:
    """The oldest onnxruntime that runs a graph using `uses`, (operator, attribute or None) pairs, on any machine
    (machine None: what a manifest records) or on `machine` (os.uname's name); None when the graph uses nothing
    in the tables."""
    needed = [table[use][0] for table in _tables(machine) for use in set(uses) if use in table]
    return max(needed, key=version_tuple) if needed else None


def minimum_here(recorded: str | None, uses) -> str | None:
    """The oldest onnxruntime that runs a package on this machine: the one its manifest records (or its graph
    needs anywhere), raised where this machine's architecture needs a newer one for an operator the graph uses."""
    found = [v for v in (recorded, graph_minimum(uses, this_machine())) if v]  # this machine's tables hold the rest
    return max(found, key=version_tuple) if found else None


def reason(minimum: str, uses=None) -> str:
    """Why a graph needs `minimum` on this machine: the tables' words for the operators in `uses` that need it, or
    for any that does where `uses` is None."""
    tables = _tables(this_machine())
    rows = [table[use] for table in tables for use in (table if uses is None else set(uses)) if use in table]
    return next((why for version, why in rows if version == minimum), "the operators it uses")


def installed_version() -> str:
    """The version of the onnxruntime Python imports (not of whichever distribution's metadata is found)."""
    import onnxruntime

    return onnxruntime.__version__


def installed_distributions() -> list[str]:
    """The onnxruntime distributions pip has installed; more than one means one shadows the other."""
    found = distribution_versions()
    return [name for name in DISTRIBUTIONS if name in found]


def distribution_versions() -> dict[str, str]:
    """name -> version of the onnxruntime distributions on sys.path, the first found of each as importlib.metadata
    finds it, read from the names of the *.dist-info and *.egg-info folders themselves: importlib.metadata's own
    import (email, zipfile, csv...) costs ~0.07 s of every command's start."""
    found = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except (OSError, TypeError, ValueError):  # a zip, a path hook, a folder gone
            continue
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if suffix in ("dist-info", "egg-info") and name.lower().startswith("onnxruntime"):
                project, _, version = stem.partition("-")
                found.setdefault(re.sub(r"[-_.]+", "-", project).lower(), version.partition("-")[0])
    return {name: version for name, version in found.items() if name in DISTRIBUTIONS}


def installed_wheel() -> str:
    """The distribution to upgrade: the one installed, or the CPU wheel when there are none or several."""
    found = installed_distributions()
    return found[0] if len(found) == 1 else CPU_WHEEL


def check_installed(minimum: str | None, what, uses=None) -> None:
    """Refuse, before any session is created, an onnxruntime older than the package needs (for the operators in
    `uses`, where given: the reason named)."""
    if minimum is None:
        return
    installed = installed_version()
    if version_tuple(installed) >= version_tuple(minimum):
        return
    raise PackageError(
        f"{what} needs onnxruntime {minimum} or newer for {reason(minimum, uses)}; this is onnxruntime {installed}. "
        f"Install a newer one: pip install -U '{installed_wheel()}>={minimum}'"
    )


def shadowing_message() -> str | None:
    """What to say when two onnxruntime distributions share one import package, else None."""
    found = installed_distributions()
    if len(found) < 2:
        return None
    return (
        f"{' and '.join(found)} are both installed; they write the same `onnxruntime` folder, so which one "
        f"Python imports depends on install order. Keep one. For CUDA: {REINSTALL_GPU}"
    )


_warned = False


def warn_if_shadowed() -> None:
    """Log the clash once per process (through `logging`: the library never prints)."""
    global _warned
    message = shadowing_message()
    if message and not _warned:
        import logging

        _warned = True
        logging.getLogger("edgelm").warning(message)


def cuda_missing_error() -> DeviceError:
    """The error for --device cuda where the imported onnxruntime has no CUDA provider, naming the cause."""
    clash = shadowing_message()
    if clash is not None:
        return DeviceError(
            f"device 'cuda' was asked for, but the onnxruntime Python imports has no CUDA provider: {clash}"
        )
    return DeviceError(
        "device 'cuda' was asked for, but this onnxruntime has no CUDA provider. On a machine with an NVIDIA GPU, "
        f"replace the CPU wheel with the GPU one ({REINSTALL_GPU}), or use --device cpu."
    )


def arm_dot_product(machine: str, cpuinfo: str | None) -> bool | None:
    """Whether a 64-bit ARM CPU has the dot-product instructions (asimddp in /proc/cpuinfo's Features); None for
    another machine, or where /proc/cpuinfo says nothing (not Linux)."""
    if machine.lower() not in ARM64 or not cpuinfo:
        return None
    features = [line.partition(":")[2].split() for line in cpuinfo.splitlines() if line.startswith("Features")]
    return bool(features) and all("asimddp" in row for row in features)


def check_cpu(version: str | None, machine: str, cpuinfo: str | None) -> None:
    """Refuse, before it is imported, an onnxruntime release that stops this CPU with an illegal instruction."""
    if version is None or arm_dot_product(machine, cpuinfo) is not False:
        return
    if ".".join(map(str, version_tuple(version)[:3])) in NEEDS_DOT_PRODUCT:
        raise DeviceError(
            f"onnxruntime {version} stops with 'Illegal instruction' on this ARM CPU, which has no dot-product "
            f"instructions (a Raspberry Pi 4 or 3, say). Install another release: pip install -U "
            f"'{installed_wheel()}>={OLDEST_SUPPORTED}'"
        )


def check_cpu_before_import() -> None:
    """check_cpu for this machine and the onnxruntime pip installed, read without importing it."""
    machine = this_machine()
    if machine not in ARM64:  # Windows on ARM has no /proc/cpuinfo to go by either
        return
    found = distribution_versions()
    if not found:
        return
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpuinfo = f.read(1 << 20)
    except OSError:
        return
    check_cpu(found[installed_distributions()[0]], machine, cpuinfo)
