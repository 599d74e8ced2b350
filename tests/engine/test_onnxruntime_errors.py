"""No onnxruntime error reaches the user as a traceback: a graph onnxruntime cannot load is a PackageError, a run
that fails is an InferenceError, each one line that names the graph and says what to do."""

import json
import shutil
import subprocess
import sys

import edgelm.runtime as rt
import numpy as np
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import InferenceError, PackageError
from edgelm.runtime.package.open import file_record


def record_files(folder, *names) -> None:
    """Update the manifest's size and sha256 of `names`, as if the package had been exported that way: the
    checksum check passes and onnxruntime is the first to see the damage."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in names:
        manifest["files"][name] = file_record(folder / name)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture
def unloadable(tiny_package, tmp_path):
    """model.onnx with its first bytes flipped: no longer a protobuf onnxruntime can parse."""
    folder = shutil.copytree(tiny_package, tmp_path / "unloadable")
    graph = bytearray((folder / "model.onnx").read_bytes())
    graph[:64] = bytes(b ^ 0xFF for b in graph[:64])
    (folder / "model.onnx").write_bytes(graph)
    record_files(folder, "model.onnx")
    return folder


@pytest.fixture
def fails_when_run(tiny_package, tmp_path):
    """A graph that loads but fails in its first run: the token lookup reads a copy of the embedding that keeps
    only 2 of its columns, so any token id from 2 up is out of range for the Gather that reads it."""
    import onnx
    from onnx import numpy_helper

    folder = shutil.copytree(tiny_package, tmp_path / "fails-when-run")
    model = onnx.load(str(folder / "model.onnx"))
    (lookup,) = [n for n in model.graph.node if n.op_type == "Gather" and "input_ids" in n.input]
    table = next(t for t in model.graph.initializer if t.name == lookup.input[0])
    short = numpy_helper.from_array(numpy_helper.to_array(table)[:, :2].copy(), "token_table_short")
    model.graph.initializer.append(short)
    lookup.input[0] = "token_table_short"
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    record_files(folder, "model.onnx", "model.onnx.data")
    return folder


def one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_a_damaged_graph_is_a_package_error_that_names_it(unloadable):
    with pytest.raises(PackageError) as failed:
        rt.load(unloadable)  # the checksums match: the load itself must refuse it
    message = one_line(str(failed.value))
    assert f"onnxruntime cannot load the graph {unloadable / 'model.onnx'}: " in message
    assert "export the package again" in message and "newer onnxruntime" in message
    with pytest.raises(PackageError, match="cannot load the graph"):
        rt.load(unloadable, verify=False)


def test_a_run_that_fails_is_an_inference_error(fails_when_run, tiny_package):
    model = rt.load(fails_when_run)
    assert model.generate([[0, 1]], max_new_tokens=1, do_sample=False)[0].token_ids  # positions 0 and 1 exist
    for call in (
        lambda: model.generate("a prompt of several tokens", max_new_tokens=3),
        lambda: list(model.stream("a prompt of several tokens", max_new_tokens=3)),
        lambda: model.score("a prompt of several tokens"),
        lambda: model.engine.forward(*[np.array([[1, 2, 3]])] * 2, np.array([[0, 1, 2]]), model.engine.empty_past(1)),
    ):
        with pytest.raises(InferenceError) as failed:
            call()
        message = one_line(str(failed.value))
        assert message.startswith(f"onnxruntime failed while running {fails_when_run / 'model.onnx'}: ")
        assert "Gather" in message and "edgelm verify" in message


def test_the_command_prints_one_line_for_a_graph_that_cannot_load(unloadable):
    result = CliRunner().invoke(main, ["generate", "hello", "-m", str(unloadable)])
    assert result.exit_code == 1
    assert one_line(result.output.strip()).startswith("Error: onnxruntime cannot load the graph")


def test_the_command_prints_one_line_for_a_run_that_fails(fails_when_run):
    """In a real process, so that anything onnxruntime writes to stderr itself would show."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgelm.runtime.cli",
            "generate",
            "several tokens",
            "-m",
            fails_when_run,
            "--max-new-tokens",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr  # the error line, and nothing from onnxruntime beside it
    assert done.stderr.startswith("Error: onnxruntime failed while running") and "Gather" in done.stderr
