"""Which onnxruntime runs a package, and which onnxruntime is installed.

The oldest onnxruntime a graph needs follows from the operators and attributes it uses. `OPERATOR_MINIMUM`
is measured, not read from release notes: tiny packages of every recipe, each loaded and run (greedy, sampled,
a padded batch, scoring) on every onnxruntime release from 1.20 to 1.32, against the newest release's tokens
(`benchmarks/onnxruntime_matrix.sh` repeats the check for the oldest and newest supported releases):

    recipe                  1.20-1.21  1.22     1.23-1.24  1.25-1.26        1.27              1.28-1.32
    float32, int8-dynamic   refused    runs     runs       runs             runs              runs
    int4 weights            refused    refused  runs       runs             runs              runs
    int8 KV cache           refused    refused  refused    fails at 1st run wrong for batch>1 runs

The int8 recipe (MatMulNBits with bits 8) needs nothing newer than its GroupQueryAttention's 1.22: it was run
on 1.22.0 and 1.32.0 only (`benchmarks/onnxruntime_matrix.sh oldest`: the runtime tests pass, its batch equal
to its prompts alone).

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
OLDEST_SUPPORTED = OPERATOR_MINIMUM[("GroupQueryAttention", None)][0]  # the float32 package's: pyproject's minimum
# Releases whose aarch64 wheel stops the process with "Illegal instruction" as it is imported, on a 64-bit ARM CPU
# without the dot-product instructions (Cortex-A72: Raspberry Pi 4, Cortex-A53: Pi 3 and Zero 2 W); reported by
# Pi 4 users (onnxruntime issues 23957, 24112, 24512) and reproduced under qemu's cortex-a72 model
# (benchmarks/aarch64_emulated.sh, which also runs pyproject's minimum and the newest release there).
NEEDS_DOT_PRODUCT = ("1.21.0",)
# Releases that import and run tiny float32 and int8 packages on qemu's cortex-a72 model, greedy tokens as x86-64's
# (int8 within its recorded agreement): `benchmarks/aarch64_emulated.sh --survey`, 2026-12-02 and 2026-12-05
# (benchmarks/results/2026-12-02-aarch64-survey.md, 2026-12-05-aarch64-survey.md). Those not listed have not been run there.
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


def graph_minimum(uses) -> str | None:
    """The oldest onnxruntime that runs a graph using `uses`, (operator, attribute or None) pairs; None when
    the graph uses nothing in the table."""
    needed = [OPERATOR_MINIMUM[use][0] for use in set(uses) if use in OPERATOR_MINIMUM]
    return max(needed, key=version_tuple) if needed else None


def reason(minimum: str) -> str:
    """Why a graph needs `minimum`: the table's words for that version."""
    return next((why for version, why in OPERATOR_MINIMUM.values() if version == minimum), "the operators it uses")


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


def check_installed(minimum: str | None, what) -> None:
    """Refuse, before any session is created, an onnxruntime older than the package needs."""
    if minimum is None:
        return
    installed = installed_version()
    if version_tuple(installed) >= version_tuple(minimum):
        return
    raise PackageError(
        f"{what} needs onnxruntime {minimum} or newer for {reason(minimum)}; this is onnxruntime {installed}. "
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
    if machine.lower() not in ("aarch64", "arm64") or not cpuinfo:
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
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if machine.lower() not in ("aarch64", "arm64"):  # Windows on ARM has no /proc/cpuinfo to go by either
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
