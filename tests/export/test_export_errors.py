"""Bad input to the export stage: each gets one clear message, a non-zero exit, and no package on disk."""

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgelm.export.errors import ExportError
from edgelm.runtime.cli.main import main

HERE = Path(__file__).parent


def _export(*args, **kwargs):
    from edgelm.export.stages import export_model

    return export_model(*args, **kwargs)


def _cli(*args, env=None, cwd=None):
    """Run the real `edgelm` command in a subprocess (the hub reads its settings at import time)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "edgelm.runtime.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def _no_package_left(parent: Path):
    return [p.name for p in parent.iterdir()] if parent.exists() else []


def test_refuses_to_overwrite_without_force(tiny_checkpoint, tmp_path):
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(out)])
    assert result.exit_code == 1 and "already exists" in result.output and "--force" in result.output
    assert (out / "keep.txt").read_text() == "mine"
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(out), "--force", "--no-validate"])
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists() and (out / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no partial or replaced folder left behind


def test_no_validate_skips_the_comparison_and_says_so(tiny_checkpoint, tmp_path, monkeypatch):
    """--no-validate: no PyTorch reference is built, and the package, the command and edgelm info say so."""
    from dataclasses import replace

    from edgelm.export import stages

    def never(*args, **kwargs):
        raise AssertionError("the PyTorch reference was built for an export without validation")

    family_for = stages.family_for
    monkeypatch.setattr(stages, "family_for", lambda model_type: replace(family_for(model_type), reference_model=never))
    out = tmp_path / "pkg"
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    assert "validate  skipped (--no-validate)" in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"] == {"skipped": stages.NOT_VALIDATED}
    assert set(manifest["export_seconds"]) == {"load", "export", "optimize"}
    info = CliRunner().invoke(main, ["info", str(out)])
    assert "not validated against PyTorch: exported with --no-validate" in info.output


def test_unsupported_architecture(tmp_path):
    folder = tmp_path / "mistral"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(
        ExportError, match=r"'mistral' model \(MistralForCausalLM\); edgelm exports GPT-2-family"
    ) as error:
        _export(str(folder), tmp_path / "out")
    assert "Llama (model_type 'llama'" in str(error.value) and "Qwen2 (model_type 'qwen2'" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_missing_weights(tiny_checkpoint, tmp_path):
    folder = tmp_path / "noweights"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ExportError, match="has no weights: expected one of model.safetensors, pytorch_model.bin"):
        _export(str(folder), tmp_path / "out")


def test_corrupt_weights(tiny_checkpoint, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_checkpoint, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "corrupt, truncated or unsafe" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_weights_missing_tensors(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "partial"
    shutil.copytree(tiny_checkpoint, folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ExportError, match="missing 1 weight tensors.*transformer.h.1.mlp.c_fc.weight"):
        _export(str(folder), tmp_path / "out")


def test_pytorch_bin_loads_weights_only(tiny_checkpoint, tmp_path, reference_model, tiny_package):
    """A .bin checkpoint goes through torch's weights-only loader and exports the same graph, byte for byte, as
    the same weights from model.safetensors."""
    import torch

    folder = tmp_path / "bin"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    torch.save(reference_model.state_dict(), folder / "pytorch_model.bin")
    result = _export(str(folder), tmp_path / "out", validate=False)
    assert result.manifest["source"]["weights_file"] == "pytorch_model.bin"
    for name in ("model.onnx", "model.onnx.data"):
        assert (result.path / name).read_bytes() == (Path(tiny_package) / name).read_bytes()


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {_Payload.marker}",))


def test_malicious_pickle_is_refused(tiny_checkpoint, tmp_path):
    import torch

    folder = tmp_path / "evil"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    _Payload.marker = tmp_path / "pwned"
    torch.save({"transformer.wte.weight": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ExportError, match="pickled objects other than tensors, which could run code"):
        _export(str(folder), tmp_path / "out")
    assert not _Payload.marker.exists()


def test_missing_local_folder_and_file_paths(tmp_path):
    with pytest.raises(ExportError, match="no such folder"):
        _export(str(tmp_path / "nope"), tmp_path / "out")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ExportError, match="is a file"):
        _export(str(tmp_path / "file.bin"), tmp_path / "out")


def test_unwritable_output(tiny_checkpoint, tmp_path):
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "afile" / "pkg")])
    assert result.exit_code == 1 and "cannot create" in result.output and "-o" in result.output


def test_disk_too_small_is_refused_before_writing(tiny_checkpoint, tmp_path, monkeypatch):
    import shutil as shutil_module

    from edgelm.export import writer

    monkeypatch.setattr(writer.shutil, "disk_usage", lambda path: shutil_module._ntuple_diskusage(10, 10, 1000))
    with pytest.raises(ExportError, match="not enough disk space"):
        _export(str(tiny_checkpoint), tmp_path / "out")
    assert _no_package_left(tmp_path) == []


def test_disk_full_while_writing_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    import errno

    real_write_bytes = Path.write_bytes

    def fill_up(path, data):
        if path.name == "tokenizer.json":  # model.onnx went through, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", fill_up)
    with pytest.raises(ExportError, match="disk filled up while writing tokenizer.json"):
        _export(str(tiny_checkpoint), tmp_path / "out", validate=False)
    assert _no_package_left(tmp_path) == []


def test_failure_mid_export_leaves_no_package(tiny_checkpoint, tmp_path, monkeypatch):
    from edgelm.export import validate

    def broken(*args, **kwargs):
        raise validate.ParityError("fp32 parity failed on case 'x' (simulated)")

    monkeypatch.setattr(validate, "check_fp32", broken)
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "fp32 parity failed" in result.output
    assert _no_package_left(tmp_path) == []


def test_killed_export_leaves_no_package_and_is_swept(tiny_checkpoint, tiny_package, tmp_path):
    """SIGKILL at the last moment (the package's files written, before publish checksums them and renames the
    folder): only a hidden partial folder remains, and the next export to the same place removes it."""
    script = (
        "import os, signal\n"
        "from pathlib import Path\n"
        "from edgelm.export.writer import PackageWriter\n"
        f"new = PackageWriter(Path({str(tmp_path / 'out')!r}))\n"
        f"for path in sorted(Path({str(tiny_package)!r}).iterdir()):\n"
        "    new.copy(path.name, path)\n"
        "os.kill(os.getpid(), signal.SIGKILL)  # where publish would begin\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert killed.returncode == -9
    left = _no_package_left(tmp_path)
    assert "out" not in left and len(left) == 1 and left[0].startswith(".out.partial-")
    _export(str(tiny_checkpoint), tmp_path / "out", validate=False)
    assert _no_package_left(tmp_path) == ["out"]


# --- the hub -----------------------------------------------------------------------------------------


@pytest.fixture
def hub_settings(monkeypatch):
    """Sets in this process what HF_HOME, HF_HUB_OFFLINE and HF_ENDPOINT set at huggingface_hub's import; its
    HTTP sessions, which remember offline mode, are dropped after each setting and after the test."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    def apply(cache: Path, offline: bool, endpoint: str | None = None) -> None:
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        if endpoint is not None:
            monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        reset_sessions()

    yield apply
    reset_sessions()


def _hub_cache(home: Path, repo: str, checkpoint: Path, commit: str = "0" * 39 + "1") -> Path:
    """Lay a checkpoint out exactly as huggingface_hub caches a download."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for f in checkpoint.iterdir():
        shutil.copy(f, snapshot / f.name)
    return snapshot


def test_export_distilgpt2_from_the_hub_cache_as_a_user_types_it(tiny_checkpoint, tmp_path, monkeypatch, hub_settings):
    """In-process, with the cache folder and offline mode set where huggingface_hub reads them when it is
    called (HF_HOME and HF_HUB_OFFLINE become these constants at its import); without validation, which
    test_a_quantized_export_prints_its_quality_figures covers from the command."""
    home = tmp_path / "hf"
    _hub_cache(home, "distilgpt2", tiny_checkpoint)
    work = tmp_path / "work"
    work.mkdir()
    hub_settings(home / "hub", offline=True)
    monkeypatch.chdir(work)
    result = CliRunner().invoke(main, ["export", "distilgpt2", "--no-validate"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((work / "models" / "distilgpt2" / "manifest.json").read_text())
    assert manifest["source"] == {
        "hub_id": "distilgpt2",
        "revision": "main",
        "commit": "0" * 39 + "1",
        "weights_file": "model.safetensors",
    }
    for stage in ("load", "export", "optimize", "save"):
        assert stage in result.stderr
    generated = CliRunner().invoke(main, ["generate", "Hello", "--max-new-tokens", "5"])
    assert generated.exit_code == 0 and generated.stdout.strip(), generated.output


def test_hub_unreachable_says_so(tmp_path, hub_settings):
    hub_settings(tmp_path / "hf" / "hub", offline=True)
    result = CliRunner().invoke(main, ["export", "distilgpt2", "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output  # no traceback
    assert "unreachable" in result.stderr and "export a local checkpoint folder instead" in result.stderr
    # the other offline routes: the hub cache without asking the hub, and a random-weight checkpoint
    assert "HF_HUB_OFFLINE=1 edgelm export distilgpt2" in result.stderr
    assert "edgelm export distilgpt2 --random-weights" in result.stderr and "its text is noise" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


class _NotFoundHub(BaseHTTPRequestHandler):
    """A stand-in hub on loopback that knows no repository, as the real one answers for an unknown id."""

    def _answer(self):
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b'{"error": "Repository not found"}')

    do_GET = do_HEAD = _answer

    def log_message(self, *args):
        pass


def test_unknown_model_id(tmp_path, hub_settings):
    server = HTTPServer(("127.0.0.1", 0), _NotFoundHub)
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    hub_settings(tmp_path / "hf" / "hub", offline=False, endpoint=f"http://127.0.0.1:{server.server_port}")
    try:
        result = CliRunner().invoke(main, ["export", "someone/no-such-model", "-o", str(tmp_path / "out")])
    finally:
        server.shutdown()
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output  # no traceback
    assert "unknown model id 'someone/no-such-model'" in result.stderr


def test_export_without_the_export_extra_says_how_to_install(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nclass B:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers', 'optimum', 'rich'):\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, B())\n"
    )
    result = _cli("export", "distilgpt2", env={"PYTHONPATH": str(blocker)})
    assert result.returncode == 1 and "pip install 'torch>=2.1' 'transformers<4.58,>=4.45'" in result.stderr and "edgelm[" not in result.stderr


def test_optimum_loads_the_package(tiny_package):
    """The package is also a valid optimum ORTModelForCausalLM folder, with the same greedy tokens."""
    import warnings

    import edgelm.runtime as edgelm
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ORTModelForCausalLM.from_pretrained(tiny_package)
        tokenizer = AutoTokenizer.from_pretrained(tiny_package)
        encoded = tokenizer("Once upon a time", return_tensors="pt")
        out = model.generate(**encoded, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    ours = edgelm.load(tiny_package).generate("Once upon a time", max_new_tokens=12, min_new_tokens=12)
    assert out[0, encoded.input_ids.shape[1] :].tolist() == ours.token_ids


@pytest.mark.parametrize("key, value", [("vocab_size", 2**40), ("n_positions", 2**31), ("n_embd", 2**40)])
def test_a_size_past_what_a_package_holds_is_an_export_error(tiny_checkpoint, tmp_path, key, value):
    from edgelm.export.load import read_config

    folder = shutil.copytree(tiny_checkpoint, tmp_path / "huge")
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    if key == "n_embd":
        config["n_head"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="config.json: .*cannot export a model of this size") as raised:
        read_config(folder)
    assert "\n" not in str(raised.value)
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output and "cannot export" in result.output
