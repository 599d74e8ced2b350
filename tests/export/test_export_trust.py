"""What the export refuses to trust: non-finite weights and figures, code shipped with a checkpoint, malformed
configs, and a replacement (--force) that could lose the only complete package."""

import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from edgelm.export.errors import ExportError, ParityError
from edgelm.runtime.cli.main import main


def _copy(checkpoint: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    folder = tmp_path / name
    shutil.copytree(checkpoint, folder)
    return folder


def _edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    config = change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _cli_error(*args) -> str:
    """Run `edgelm export` through CliRunner; it must fail with one 'Error:' line and no traceback."""
    result = CliRunner().invoke(main, ["export", *args])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # a ClickException, not a crash
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _run_script(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


# --- non-finite numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_weight_is_refused_by_name(tiny_checkpoint, tmp_path, value):
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_checkpoint, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.h.1.mlp.c_fc.weight"][3, 5] = value
    save_file(tensors, folder / "model.safetensors")
    line = _cli_error(str(folder), "-o", str(tmp_path / "out"))
    assert "transformer.h.1.mlp.c_fc.weight holds 1 non-finite value" in line and "checkpoint" in line
    assert not (tmp_path / "out").exists()


def test_nan_parity_figure_fails_the_export(tiny_checkpoint, tmp_path, monkeypatch):
    """NaN > tolerance is False: a NaN error figure must fail the gate, not pass it."""
    from edgelm.export import validate
    from edgelm.export.stages import export_model

    monkeypatch.setattr(validate, "_relative_error", lambda *args: math.nan)
    with pytest.raises(ParityError, match="fp32 parity failed"):
        export_model(str(tiny_checkpoint), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_nan_quality_figure_fails_the_export(tiny_checkpoint, tmp_path, monkeypatch):
    import numpy as np
    from edgelm.export.stages import export_model
    from edgelm.runtime.quality import measure as quality

    monkeypatch.setattr(quality, "log_softmax", lambda logits: np.full_like(logits, np.nan, dtype=np.float32))
    with pytest.raises(ParityError, match="non-finite figures.*mean_kl_divergence=nan"):
        export_model(str(tiny_checkpoint), tmp_path / "out", quantize="int8")
    assert not (tmp_path / "out").exists()


def test_json_written_by_the_export_is_never_nan(tmp_path):
    from edgelm.export.writer import PackageWriter

    writer = PackageWriter(tmp_path / "out")
    with pytest.raises(ExportError, match="NaN or infinite number, which is not valid JSON"):
        writer.write_json("manifest.json", {"validation": {"error": math.nan}})
    with pytest.raises(ExportError, match="not valid JSON"):
        writer.write_json("manifest.json", {"validation": {"error": -math.inf}})
    writer.discard()


# --- code shipped with a checkpoint ------------------------------------------------------------------

# The marker's path is written in whole: transformers imports a checkpoint's module from a copy in its own modules
# cache, so a path relative to __file__ would land there, not in the checkpoint folder the tests look at.
EVIL_TOKENIZER = (
    "import pathlib\n"
    "pathlib.Path({marker!r}).touch()\n"
    "from transformers import GPT2TokenizerFast\n"
    "class EvilTokenizer(GPT2TokenizerFast):\n"
    "    pass\n"
)


def _with_tokenizer_code(checkpoint: Path, tmp_path: Path, keep_tokenizer_json: bool) -> Path:
    """A checkpoint whose tokenizer_config.json maps AutoTokenizer to a Python file it ships."""
    folder = _copy(checkpoint, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "EvilTokenizer"
    config["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", "evil_tok.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "evil_tok.py").write_text(EVIL_TOKENIZER.format(marker=str(folder / "RAN")))
    if not keep_tokenizer_json:
        (folder / "tokenizer.json").unlink()
    return folder


def _exported_without_its_code(tiny_checkpoint, folder, out):
    assert not (folder / "RAN").exists(), "the checkpoint's Python code ran"
    package_tokenizer = json.loads((out / "tokenizer.json").read_text())
    original = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    assert package_tokenizer["model"]["vocab"] == original["model"]["vocab"]
    assert package_tokenizer["model"]["merges"] == original["model"]["merges"]
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    assert not (out / "evil_tok.py").exists()


class _Terminal(io.StringIO):
    """A stdin that is a terminal, ready to answer 'y' to any question."""

    def isatty(self):
        return True


def test_tokenizer_code_is_never_run_nor_offered_at_a_terminal(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """vocab.json + merges.txt with an auto_map: exported as GPT-2 BPE, without a question and without running
    the shipped file, even when stdin is a terminal that would answer 'y' (transformers asks through input())."""
    folder = _with_tokenizer_code(tiny_checkpoint, tmp_path, keep_tokenizer_json=False)
    out = tmp_path / "out"
    terminal = _Terminal("y\n" * 8)
    monkeypatch.setattr(sys, "stdin", terminal)
    with pytest.raises(SystemExit) as done:
        main.main(["export", str(folder), "-o", str(out), "--no-validate"], prog_name="edgelm")
    captured = capsys.readouterr()
    assert done.value.code == 0 and "Traceback" not in captured.err, captured.err
    assert "custom code" not in captured.err + captured.out
    assert terminal.tell() == 0, "something read an answer from the terminal"
    _exported_without_its_code(tiny_checkpoint, folder, out)


def test_tokenizer_code_is_never_run_nor_offered_without_a_terminal(tiny_checkpoint, tmp_path):
    """The same in-process, where stdin is no terminal (pytest's)."""
    folder = _with_tokenizer_code(tiny_checkpoint, tmp_path, keep_tokenizer_json=False)
    result = CliRunner().invoke(main, ["export", str(folder), "-o", str(tmp_path / "out"), "--no-validate"])
    assert result.exit_code == 0 and "custom code" not in result.output, result.output
    _exported_without_its_code(tiny_checkpoint, folder, tmp_path / "out")


def test_tokenizer_auto_map_beside_tokenizer_json_exports(tiny_checkpoint, tmp_path):
    from edgelm.export.stages import export_model

    folder = _with_tokenizer_code(tiny_checkpoint, tmp_path, keep_tokenizer_json=True)
    result = export_model(str(folder), tmp_path / "out", validate=False)
    assert not (folder / "RAN").exists()
    assert (result.path / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert "auto_map" not in json.loads((result.path / "tokenizer_config.json").read_text())


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c | {"auto_map": {"AutoModelForCausalLM": "modeling_mine.MyGPT2"}},
        lambda c: c | {"architectures": ["MyGPT2ForCausalLM"]},
        lambda c: c | {"model_type": "mygpt", "auto_map": {"AutoConfig": "configuration_mine.MyConfig"}},
    ],
    ids=["auto_map", "architecture", "model_type"],
)
def test_config_that_needs_its_own_code_is_refused(tiny_checkpoint, tmp_path, change):
    folder = _copy(tiny_checkpoint, tmp_path)
    _edit_config(folder, change)
    line = _cli_error(str(folder), "-o", str(tmp_path / "out"))
    assert "edgelm never runs code shipped with a checkpoint" in line
    assert not (tmp_path / "out").exists()


# --- malformed configs and destinations -------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: [c], "holds a JSON list, not an object"),
        (lambda c: c | {"n_head": 0}, "n_head must be a positive whole number, not 0"),
        (lambda c: c | {"n_embd": 30}, "n_embd 30 is not divisible by n_head 4"),
        (lambda c: c | {"n_layer": -2}, "n_layer must be a positive whole number, not -2"),
        (lambda c: {k: v for k, v in c.items() if k != "n_embd"}, "has no n_embd"),
        (lambda c: c | {"n_head": "4"}, "n_head must be a positive whole number, not '4'"),
        (lambda c: c | {"n_layer": True}, "n_layer must be a positive whole number, not True"),
        (lambda c: c | {"eos_token_id": 10**6}, "eos_token_id must be a token id below vocab_size"),
        (lambda c: c | {"layer_norm_epsilon": "small"}, "layer_norm_epsilon must be a small positive number"),
        (lambda c: c | {"attn_pdrop": "x"}, "transformers cannot build GPT2LMHeadModel from"),
    ],
    ids=["array", "no-heads", "indivisible", "negative", "missing", "string", "bool", "eos", "epsilon", "dropout"],
)
def test_malformed_config_is_one_clear_error(tiny_checkpoint, tmp_path, change, message):
    folder = _copy(tiny_checkpoint, tmp_path)
    _edit_config(folder, change)
    assert message in _cli_error(str(folder), "-o", str(tmp_path / "out"))


def test_nan_in_config_is_refused(tiny_checkpoint, tmp_path):
    folder = _copy(tiny_checkpoint, tmp_path)
    text = (folder / "config.json").read_text().replace('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": NaN')
    (folder / "config.json").write_text(text)
    assert "NaN is not a JSON number" in _cli_error(str(folder), "-o", str(tmp_path / "out"))


def test_output_under_a_file_is_refused_before_loading(tiny_checkpoint, tmp_path, monkeypatch):
    from edgelm.export import stages

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the destination was checked")

    monkeypatch.setattr(stages, "load_checkpoint", never)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match=r"cannot create .*afile is a file\. Choose another output folder with -o"):
        stages.export_model(str(tiny_checkpoint), tmp_path / "afile" / "deeper" / "pkg")
    line = _cli_error(str(tiny_checkpoint), "-o", str(tmp_path / "afile" / "pkg"))
    assert "afile is a file" in line


# --- replacing a package (--force) ------------------------------------------------------------------


def _old_package(tiny_package: Path, out: Path) -> None:
    shutil.copytree(tiny_package, out)
    (out / "old.txt").write_text("the package that was there")


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_package_moved_aside_by_a_dead_export_is_restored(tiny_package, tmp_path):
    """Killed between the two renames: the old package is aside, the new one partial, nothing at the path."""
    from edgelm.export.stages import export_model

    out = tmp_path / "out"
    pid = _dead_pid()
    _old_package(tiny_package, tmp_path / f".out.replaced-{pid}")
    shutil.copytree(tiny_package, tmp_path / f".out.partial-{pid}")
    with pytest.raises(ExportError, match="already exists"):  # the old package is back, so --force is needed
        export_model(str(tmp_path / "no-checkpoint"), out)
    assert (out / "old.txt").exists() and (out / "manifest.json").exists()
    assert _hidden(tmp_path) == []


def test_package_moved_aside_is_swept_once_the_new_one_is_in_place(tiny_package, tmp_path):
    from edgelm.export.writer import sweep_partials

    out = tmp_path / "out"
    shutil.copytree(tiny_package, out)
    _old_package(tiny_package, tmp_path / f".out.replaced-{_dead_pid()}")
    alive = tmp_path / f".out.replaced-{os.getpid()}"  # an export still running: left alone
    alive.mkdir()
    sweep_partials(out)
    assert _hidden(tmp_path) == [alive.name] and not (out / "old.txt").exists()


KILL_DURING_PUBLISH = """
import json, os, signal
from pathlib import Path
from edgelm.export import writer
from edgelm.runtime.package.format import MANIFEST, Manifest

out, source = Path({out!r}), Path({package!r})
when = {when!r}
real_rename = os.rename

def moves_new_package(source, target):
    return Path(source).name.startswith(".out.partial-") and Path(target) == out

def rename(source, target):
    if when == "before" and moves_new_package(source, target):
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(source, target)
    if when == "after" and moves_new_package(source, target):
        os.kill(os.getpid(), signal.SIGKILL)

os.rename = rename
if hasattr(writer, "_exchange"):
    real_exchange = writer._exchange
    def exchange(a, b):
        if when == "before":
            return False  # as on a system without an atomic swap: two renames
        swapped = real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
        return swapped
    writer._exchange = exchange
# the export's last stage: the new package's files in the partial folder, then publish (manifest, move into place)
new = writer.PackageWriter(out)
for path in sorted(source.iterdir()):
    if path.name != MANIFEST:
        new.copy(path.name, path)
new.publish(Manifest.from_dict(json.loads((source / MANIFEST).read_text())))
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_killed_while_replacing_never_loses_the_package(tiny_package, tmp_path, when):
    """SIGKILL with the old package aside and the new one not yet in place ('before'), or just after the new
    one is in place ('after'): a complete package is at the path once the next export has swept."""
    from edgelm.export.writer import sweep_partials

    out = tmp_path / "out"
    _old_package(tiny_package, out)
    killed = _run_script(KILL_DURING_PUBLISH.format(out=str(out), when=when, package=str(tiny_package)))
    assert killed.returncode == -9, killed.stderr
    sweep_partials(out)
    assert _hidden(tmp_path) == []
    assert (out / "manifest.json").exists()
    assert (out / "old.txt").exists() == (when == "before")


INTERRUPT_DURING_PUBLISH = """
import os, signal, sys
from pathlib import Path
from edgelm.export import writer
from edgelm.runtime.cli.main import main

out = Path({out!r})
real_rename = os.rename

def rename(source, target):
    if Path(source).name.startswith(".out.partial-") and Path(target) == out:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C just as the new package moves into place
    real_rename(source, target)

os.rename = rename
if hasattr(writer, "_exchange"):
    real_exchange = writer._exchange
    def exchange(a, b):
        os.kill(os.getpid(), signal.SIGINT)
        return real_exchange(a, b)
    writer._exchange = exchange
main(["export", {checkpoint!r}, "-o", str(out), "--force", "--no-validate"])
"""


def test_interrupt_while_replacing_reports_what_is_on_disk(tiny_checkpoint, tiny_package, tmp_path):
    out = tmp_path / "out"
    _old_package(tiny_package, out)
    result = _run_script(INTERRUPT_DURING_PUBLISH.format(out=str(out), checkpoint=str(tiny_checkpoint)))
    if result.returncode == 0:  # reported as published: the new package is in place, the old one gone
        assert (out / "manifest.json").exists() and not (out / "old.txt").exists()
        assert str(out) in result.stdout
    else:  # reported as failed: the old package is still there
        assert (out / "old.txt").exists(), (result.returncode, result.stderr[-500:])
    assert _hidden(tmp_path) == []
