"""An onnxruntime release that stops a 64-bit ARM CPU without dot-product instructions (Raspberry Pi 4) with
"Illegal instruction" is refused by name before it is imported; other releases and CPUs are let through.
tools/ci/aarch64_emulated.sh runs this file on emulated Cortex-A72 and A76 CPUs too."""

import ctypes
import platform
from pathlib import Path

import pytest
from edgelm.runtime import DeviceError
from edgelm.runtime.package import onnxruntime_compat as compat

A72 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"
A76 = (
    "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 atomics cpuid asimdrdm lrcpc dcpop asimddp\nCPU part\t: 0xd0b\n"
)
X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512_vnni\n"


def test_dot_product_is_read_from_cpuinfo():
    assert compat.arm_dot_product("aarch64", A72) is False
    assert compat.arm_dot_product("aarch64", A76) is True
    assert compat.arm_dot_product("x86_64", X86) is None
    assert compat.arm_dot_product("aarch64", "") is None  # nothing to go by: not refused


@pytest.mark.parametrize("version", compat.NEEDS_DOT_PRODUCT)
def test_a_release_that_needs_dot_product_is_refused_on_a_pi_4(version):
    with pytest.raises(DeviceError) as caught:
        compat.check_cpu(version, "aarch64", A72)
    message = str(caught.value)
    assert f"onnxruntime {version} stops with 'Illegal instruction' on this ARM CPU" in message
    assert message.endswith(f"pip install -U 'onnxruntime>={compat.OLDEST_SUPPORTED}'") and "\n" not in message
    compat.check_cpu(version, "aarch64", A76)  # a Pi 5 runs it
    compat.check_cpu(version, "x86_64", X86)


@pytest.mark.parametrize("version", [f"{compat.OLDEST_SUPPORTED}.0", *compat.RUNS_WITHOUT_DOT_PRODUCT, None])
def test_releases_that_ran_on_the_emulated_pi_4_pass(version):
    """What `tools/ci/aarch64_emulated.sh --survey` found running there is never refused on a Pi 4."""
    assert version not in compat.NEEDS_DOT_PRODUCT
    compat.check_cpu(version, "aarch64", A72)


@pytest.mark.skipif(platform.machine() != "aarch64", reason="reads this CPU's own auxiliary vector: aarch64 only")
def test_cpuinfo_agrees_with_the_cpu_itself():
    """Under tools/ci/aarch64_emulated.sh: the cpuinfo bound over /proc/cpuinfo says what the emulated CPU
    does (HWCAP_ASIMDDP, bit 20 of AT_HWCAP), so the refusal above is decided on the CPU that runs."""
    getauxval = ctypes.CDLL(None).getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, (ctypes.c_ulong,)
    has_dot_product = bool(getauxval(16) & (1 << 20))
    assert compat.arm_dot_product("aarch64", Path("/proc/cpuinfo").read_text()) is has_dot_product


@pytest.mark.parametrize("installed, refused", [("1.21.0", True), ("1.22.0", False)])
def test_the_installed_release_is_checked_before_it_is_imported(monkeypatch, installed, refused):
    """check_cpu_before_import reads the release from pip's folders and the CPU from /proc/cpuinfo."""
    import io
    from types import SimpleNamespace

    monkeypatch.setattr(compat.os, "uname", lambda: SimpleNamespace(machine="aarch64"))
    monkeypatch.setattr(compat, "distribution_versions", lambda: {"onnxruntime": installed})
    monkeypatch.setattr(compat, "open", lambda path, *a, **k: io.StringIO(A72), raising=False)
    if refused:
        with pytest.raises(DeviceError, match=f"onnxruntime {installed} stops with 'Illegal instruction'"):
            compat.check_cpu_before_import()
    else:
        compat.check_cpu_before_import()
    monkeypatch.setattr(compat.os, "uname", lambda: SimpleNamespace(machine="x86_64"))
    monkeypatch.setattr(compat, "distribution_versions", lambda: pytest.fail("read on a machine it cannot concern"))
    compat.check_cpu_before_import()
