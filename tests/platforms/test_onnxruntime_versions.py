"""The oldest onnxruntime a package needs is recorded at export and checked before a session is created; two
onnxruntime distributions installed together are named, and --device cuda without CUDA is one clear line.

tools/ci/onnxruntime_matrix.sh runs the runtime's tests under the oldest and newest supported releases."""

import json
import logging
import os
import re
import shutil
from importlib import metadata
from pathlib import Path

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime import DeviceError, PackageError
from edgelm.runtime.cli.main import main
from edgelm.runtime.engine import session
from edgelm.runtime.engine.session import CPU, CUDA
from edgelm.runtime.package import onnxruntime_compat
from edgelm.runtime.package.open import open_package

ROOT = Path(__file__).resolve().parents[2]
PREBUILT_NAMES = {
    "tiny_package": "tiny-fp32",
    "tiny_package_int8": "tiny-int8",
    "tiny_package_int8_rows": "tiny-int8-rows",
    "tiny_package_int8_dynamic": "tiny-int8-dynamic",
    "tiny_package_int4": "tiny-int4",
    "tiny_package_int8_kv8": "tiny-int8-kv8",
}


@pytest.mark.parametrize(
    "fixture, minimum",
    [
        ("tiny_package", "1.22"),
        ("tiny_package_int8", "1.22"),
        ("tiny_package_int8_rows", "1.22"),
        ("tiny_package_int8_dynamic", "1.22"),
        ("tiny_package_int4", "1.23"),
        ("tiny_package_int8_kv8", "1.28"),
    ],
)
def test_the_manifest_records_the_oldest_onnxruntime_that_runs_the_package(fixture, minimum, request, monkeypatch):
    monkeypatch.setattr(onnxruntime_compat, "this_machine", lambda: "x86_64")
    folder = request.getfixturevalue(fixture)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["graph"]["min_onnxruntime"] == minimum
    assert open_package(folder).min_onnxruntime == minimum
    assert f"onnxruntime   {minimum} or newer" in open_package(folder).describe()


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_64_bit_arm_needs_1_23_for_the_int8_recipe(machine, tiny_package_int8, tiny_package, monkeypatch):
    """onnxruntime 1.22's aarch64 build has no 8-bit MatMulNBits kernel: the int8 package it cannot run is refused by
    name there, while the manifest keeps the minimum of x86-64, where 1.22 runs it."""
    monkeypatch.setattr(onnxruntime_compat, "this_machine", lambda: machine)
    assert json.loads((tiny_package_int8 / "manifest.json").read_text())["graph"]["min_onnxruntime"] == "1.22"
    package = open_package(tiny_package_int8)
    assert ("MatMulNBits", "bits=8") in package.uses and package.min_onnxruntime == "1.23"
    assert f"onnxruntime   1.23 or newer on {machine}, 1.22 elsewhere" in package.describe()
    assert open_package(tiny_package).min_onnxruntime == "1.22"  # float32 has no MatMulNBits
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.22.1")
    _refuse_sessions(monkeypatch)
    with pytest.raises(PackageError) as caught:
        rt.load(tiny_package_int8)
    assert "needs onnxruntime 1.23 or newer for 8-bit MatMulNBits on 64-bit ARM (the int8 recipe);" in str(caught.value)
    monkeypatch.setattr(onnxruntime_compat, "this_machine", lambda: "x86_64")
    assert open_package(tiny_package_int8).min_onnxruntime == "1.22"


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_64_bit_arm_runs_the_int8_rows_recipe_on_1_22(machine, tiny_package_int8_rows, monkeypatch):
    """int8-rows' integer products (MatMulIntegerToFloat, QGemm) have 1.22 kernels on 64-bit ARM too."""
    monkeypatch.setattr(onnxruntime_compat, "this_machine", lambda: machine)
    package = open_package(tiny_package_int8_rows)
    assert ("MatMulIntegerToFloat", None) in package.uses and package.min_onnxruntime == "1.22"
    assert not any(op == "MatMulNBits" for op, _ in package.uses)


def test_an_int4_package_on_arm_is_refused_for_its_own_operator(tiny_package_int4, monkeypatch):
    """The reason named is that of an operator the graph uses, not of whichever table row shares the version."""
    monkeypatch.setattr(onnxruntime_compat, "this_machine", lambda: "aarch64")
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.22.0")
    _refuse_sessions(monkeypatch)
    with pytest.raises(PackageError, match=re.escape("for the int4 token lookup (GatherBlockQuantized's bits")):
        rt.load(tiny_package_int4)


def test_the_graph_scan_reads_integer_attributes_with_their_values(tiny_package_int4, tiny_package_int8_dynamic):
    assert ("MatMulNBits", "bits=4") in open_package(tiny_package_int4).uses
    assert not any(op == "MatMulNBits" for op, _ in open_package(tiny_package_int8_dynamic).uses)
    assert onnxruntime_compat.graph_minimum({("MatMulNBits", "bits=8")}) is None  # on any machine: nothing needed
    assert onnxruntime_compat.graph_minimum({("MatMulNBits", "bits=8")}, "aarch64") == "1.23"
    assert onnxruntime_compat.graph_minimum({("MatMulNBits", "bits=4")}, "aarch64") is None


def test_pyproject_requires_what_the_float32_package_needs():
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert f'"onnxruntime>={onnxruntime_compat.OLDEST_SUPPORTED}"' in dependencies.group(1)


def _refuse_sessions(monkeypatch):
    def no_session(*args, **kwargs):
        raise AssertionError("a session was created for a package this onnxruntime cannot run")

    monkeypatch.setattr(session.ort, "InferenceSession", no_session)


def test_an_older_onnxruntime_is_refused_before_a_session_is_created(tiny_package_int8_kv8, monkeypatch):
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.26.0")
    _refuse_sessions(monkeypatch)
    with pytest.raises(PackageError) as caught:
        rt.load(tiny_package_int8_kv8)
    message = str(caught.value)
    assert (
        "needs onnxruntime 1.28 or newer for the int8 KV cache;" in message and "this is onnxruntime 1.26.0" in message
    )
    assert message.endswith("pip install -U 'onnxruntime>=1.28'") and "\n" not in message


def test_the_float32_package_is_refused_by_onnxruntime_1_21(tiny_package, monkeypatch):
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.21.1")
    _refuse_sessions(monkeypatch)
    with pytest.raises(PackageError, match=re.escape("pip install -U 'onnxruntime>=1.22'")):
        rt.load(tiny_package)


def test_the_upgrade_advice_names_the_gpu_wheel_where_that_is_installed(tiny_package_int4, monkeypatch):
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.22.1")
    _pretend_installed(monkeypatch, ["onnxruntime-gpu"])
    _refuse_sessions(monkeypatch)
    with pytest.raises(PackageError, match=re.escape("pip install -U 'onnxruntime-gpu>=1.23'")):
        rt.load(tiny_package_int4)


def test_a_development_build_of_the_needed_release_is_accepted(monkeypatch):
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.23.0.dev20250101+cu124")
    onnxruntime_compat.check_installed("1.23", "the package")
    with pytest.raises(PackageError):
        onnxruntime_compat.check_installed("1.28", "the package")


def _rewrite_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_manifest_from_before_the_field_is_checked_from_its_graph(tiny_package_int8_kv8, tmp_path, monkeypatch):
    folder = shutil.copytree(tiny_package_int8_kv8, tmp_path / "older")
    _rewrite_manifest(folder, lambda m: m["graph"].pop("min_onnxruntime"))
    assert open_package(folder).manifest.graph.min_onnxruntime is None
    assert open_package(folder).min_onnxruntime == "1.28"  # read from the operators model.onnx uses
    assert "elsewhere" not in open_package(folder).describe()  # no recorded minimum for this machine to raise
    monkeypatch.setattr(onnxruntime_compat, "installed_version", lambda: "1.27.0")
    with pytest.raises(PackageError, match="needs onnxruntime 1.28"):
        rt.load(folder)


@pytest.mark.parametrize(
    "fixture",
    ["tiny_package", "tiny_package_int8", "tiny_package_int8_dynamic", "tiny_package_int4", "tiny_package_int8_kv8"],
)
def test_the_installed_onnxruntime_runs_the_package_or_refuses_it_by_name(fixture, request):
    """Against the real onnxruntime: under tools/ci/onnxruntime_matrix.sh's oldest release this is the
    refusal, under a current one the run."""
    prebuilt = os.environ.get("EDGELM_TEST_PACKAGES")  # there the fixtures skip what this onnxruntime cannot run
    folder = Path(prebuilt) / PREBUILT_NAMES[fixture] if prebuilt else request.getfixturevalue(fixture)
    needed = open_package(folder).min_onnxruntime
    installed = onnxruntime_compat.installed_version()
    if onnxruntime_compat.version_tuple(installed) >= onnxruntime_compat.version_tuple(needed):
        batch = rt.load(folder).generate(["Hi there", "Hi there"], max_new_tokens=6, min_new_tokens=6)
        assert batch[0].token_ids == batch[1].token_ids  # onnxruntime 1.27's int8 cache broke exactly this
    else:
        with pytest.raises(PackageError, match=re.escape(f"this is onnxruntime {installed}. Install a newer one")):
            rt.load(folder)


@pytest.mark.parametrize("value", ["latest", 1.22, "1.22; rm -rf", ""])
def test_a_malformed_minimum_is_a_format_error(tiny_package, tmp_path, value):
    folder = shutil.copytree(tiny_package, tmp_path / "bad")
    _rewrite_manifest(folder, lambda m: m["graph"].__setitem__("min_onnxruntime", value))
    with pytest.raises(PackageError, match="graph.min_onnxruntime must be a version"):
        open_package(folder)


def _pretend_installed(monkeypatch, names):
    monkeypatch.setattr(onnxruntime_compat, "distribution_versions", lambda: {name: "1.32.0" for name in names})


def test_installed_distributions_are_read_from_their_folders(tmp_path, monkeypatch):
    """The names and versions importlib.metadata would give, from the *.dist-info and *.egg-info folder names
    on sys.path (first found wins, as there), without importing importlib.metadata."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in ("onnxruntime_gpu-1.24.1.dist-info", "numpy-2.4.6.dist-info", "onnxruntime_tools-1.7.0.dist-info"):
        (first / folder).mkdir(parents=True)
    for folder in ("onnxruntime-1.22.0-py3.11.egg-info", "onnxruntime_gpu-1.22.0.dist-info"):
        (second / folder).mkdir(parents=True)
    (second / "onnxruntime.dist-info.txt").write_text("not a distribution")
    monkeypatch.setattr("sys.path", [str(first), "__editable__.finder.__path_hook__", str(second)])
    assert onnxruntime_compat.distribution_versions() == {"onnxruntime-gpu": "1.24.1", "onnxruntime": "1.22.0"}
    assert onnxruntime_compat.installed_distributions() == ["onnxruntime", "onnxruntime-gpu"]
    assert "both installed" in onnxruntime_compat.shadowing_message()


def test_the_installed_distribution_matches_what_pip_recorded():
    found = onnxruntime_compat.distribution_versions()
    assert found == {name: metadata.version(name) for name in onnxruntime_compat.installed_distributions()}
    assert found.get("onnxruntime") == onnxruntime_compat.installed_version()


class _FakeSession:
    def get_providers(self):
        return [CPU]


def test_both_distributions_installed_is_logged_once(monkeypatch, caplog):
    _pretend_installed(monkeypatch, ["onnxruntime", "onnxruntime-gpu"])
    monkeypatch.setattr(onnxruntime_compat, "_warned", False)
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CPU])
    monkeypatch.setattr(session.ort, "InferenceSession", lambda *a, **k: _FakeSession())
    with caplog.at_level(logging.WARNING, logger="edgelm"):
        session.create_session("model.onnx", "cpu")
        session.create_session("model.onnx", "auto")
    warnings = [r.getMessage() for r in caplog.records if r.name == "edgelm"]
    assert len(warnings) == 1
    assert "onnxruntime and onnxruntime-gpu are both installed" in warnings[0]
    assert onnxruntime_compat.REINSTALL_GPU in warnings[0]


def test_cuda_asked_for_while_the_cpu_wheel_shadows_the_gpu_one(monkeypatch):
    _pretend_installed(monkeypatch, ["onnxruntime", "onnxruntime-gpu"])
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CPU])
    with pytest.raises(DeviceError) as caught:
        session.choose_providers("cuda")
    message = str(caught.value)
    assert "has no CUDA provider: onnxruntime and onnxruntime-gpu are both installed" in message
    assert message.endswith("pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu>=1.22'")


def test_one_distribution_logs_nothing(monkeypatch, caplog):
    _pretend_installed(monkeypatch, ["onnxruntime-gpu"])
    monkeypatch.setattr(onnxruntime_compat, "_warned", False)
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(session.ort, "InferenceSession", lambda *a, **k: _FakeSession())
    with caplog.at_level(logging.WARNING, logger="edgelm"):
        session.create_session("model.onnx", "auto")
    assert not [r for r in caplog.records if r.name == "edgelm"]


def test_device_cuda_without_cuda_is_one_clear_line_on_the_command_line(tiny_package, monkeypatch):
    _pretend_installed(monkeypatch, ["onnxruntime"])
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CPU])
    result = CliRunner().invoke(main, ["bench", str(tiny_package), "--device", "cuda", "--runs", "1"])
    assert result.exit_code == 1
    assert "this onnxruntime has no CUDA provider" in result.output and "Traceback" not in result.output
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu>=1.22'" in result.output


def test_auto_quiets_onnxruntimes_own_cuda_errors_and_cuda_keeps_them(monkeypatch):
    """onnxruntime-gpu without CUDA libraries logs its own error lines; "auto" falls back to the CPU silently,
    while --device cuda keeps the line that names the missing library."""
    severities = []
    monkeypatch.setattr(session.ort, "set_default_logger_severity", severities.append)
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(session.ort, "InferenceSession", lambda *a, **k: _FakeSession())
    assert session.create_session("model.onnx", "auto")[1] == "cpu" and severities == [4]
    with pytest.raises(DeviceError, match="could not start CUDA here"):
        session.create_session("model.onnx", "cuda")
    assert severities == [4]
