"""The export as named stages (export/stages.py): each reports its progress, the long ones within themselves too;
a failure a stage did not foresee reaches the user of `edgelm export` as one line naming the stage and what to
do, never a traceback, and leaves no package."""

from dataclasses import replace

import pytest
from click.testing import CliRunner
from edgelm.export import stages, validate
from edgelm.export.errors import StageError
from edgelm.runtime.cli.main import main


def _onnxruntime_failure(*args, **kwargs):
    """What onnxruntime raises for a graph it cannot run: its own exception type, a message over several lines."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    raise Fail("[ONNXRuntimeError] : 1 : FAIL : graph.cc:4336 ReplaceInitializedTensorImpl Failed\n  to find an initializer")


def _family_failing(recipes):
    family_for = stages.family_for

    def build_decoder(arch, weights, recipe="none", *args, **kwargs):
        if recipe in recipes:
            raise ValueError(f"no decoder for {recipe}\nat line 2")
        return family_for(arch.model_type).build_decoder(arch, weights, recipe, *args, **kwargs)

    return lambda model_type: replace(family_for(model_type), build_decoder=build_decoder)


# stage -> (what to break, the export's options): each fails inside that stage and nowhere before it
INJECTED = {
    "load": (lambda mp: mp.setattr(stages, "load_checkpoint", lambda *a: {}["config"]), ["--no-validate"]),
    "export": (lambda mp: mp.setattr(stages, "family_for", _family_failing({"none"})), ["--no-validate"]),
    "optimize": (lambda mp: mp.setattr(stages, "_optimize", lambda model: 1 / 0), ["--no-validate"]),
    "quantize": (
        lambda mp: mp.setattr(stages, "family_for", _family_failing({"int8"})),
        ["--quantize", "int8", "--no-validate"],
    ),
    "validate": (lambda mp: mp.setattr(validate, "check_fp32", _onnxruntime_failure), []),
    "save": (lambda mp: mp.setattr(stages, "graph_section", _onnxruntime_failure), ["--no-validate"]),
}


@pytest.mark.parametrize("stage", stages.STAGES)
def test_a_stage_that_fails_unforeseen_is_one_line_naming_it_and_what_to_do(tiny_checkpoint, tmp_path, monkeypatch,
                                                                             stage):  # fmt: skip
    breaks, options = INJECTED[stage]
    breaks(monkeypatch)
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out"), *options])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    assert errors[0].startswith(f"Error: the {stage} stage failed (") and errors[0].endswith(
        stages.ADVICE[stage] + "."
    ), errors[0]
    assert not (tmp_path / "out").exists()


def test_the_library_raises_a_stage_error_with_its_cause(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "check_fp32", _onnxruntime_failure)
    with pytest.raises(StageError) as raised:
        stages.export_model(str(tiny_checkpoint), tmp_path / "out")
    assert raised.value.stage == "validate" and "\n" not in str(raised.value)
    assert "Fail: [ONNXRuntimeError] : 1 : FAIL" in str(raised.value)
    assert type(raised.value.__cause__).__name__ == "Fail"


def test_validation_reports_its_progress_within_the_stage(tiny_checkpoint, tmp_path):
    """Each fp32 case, then each part of the quality report, as "step" events between the stage's start and done."""
    events = []
    stages.export_model(
        str(tiny_checkpoint), tmp_path / "out", quantize="int8", eval_tokens=2048,
        progress=lambda stage, event, detail: events.append((stage, event, detail)),
    )  # fmt: skip
    validating = [(event, detail) for stage, event, detail in events if stage == "validate"]
    assert validating[0][0] == "start" and validating[-1][0] == "done"
    steps = [detail for event, detail in validating[1:-1]]
    assert all(event == "step" for event, _ in validating[1:-1])
    cases = [d for d in steps if d.startswith("fp32 parity, case ")]
    n = len(validate.PROMPTS) + 3  # one token, each prompt, near the position limit, a padded batch
    assert cases[0] == f"fp32 parity, case 1 of {n} (one_token)"
    assert cases[-1] == f"fp32 parity, case {n} of {n} (padded_batch)"
    quality = [d for d in steps if d.startswith("int8 quality: ")]
    assert [d.split(": ", 1)[1].split()[0] for d in quality][:1] == ["windows"]
    assert any("through the cache" in d for d in quality) and quality[-1].endswith("greedy continuations of 32 prompts")
    assert [stage for stage, event, _ in events if event == "start"] == list(stages.STAGES)


def test_the_command_prints_validation_progress(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert any(line.startswith("validate  fp32 parity, case 3 of 7 (text_1)") for line in lines), result.stderr


def test_verify_quality_prints_its_progress_on_stderr(tiny_package, validated_package_int8):
    result = CliRunner().invoke(
        main, ["verify", str(validated_package_int8), "--quality", "--reference", str(tiny_package), "--json"]
    )
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("measuring: ")]
    assert progress[0].startswith("measuring: windows 0 of ")
    assert progress[-1] == "measuring: greedy continuations of 32 prompts"
    assert "measuring" not in result.stdout


def test_a_graph_that_stores_a_weight_no_operator_reads_is_refused_at_once():
    """Such a weight passes onnx's checker, and onnxruntime drops it; handed in from memory at validation, it is
    then refused by name (an untied int4 token table once stored zero points its lookup never read)."""
    import numpy as np
    from edgelm.export.errors import ExportError
    from edgelm.export.graph.builder import FLOAT, GraphBuilder

    g = GraphBuilder("probe", "model.onnx.data")
    x = g.input("x", FLOAT, [2])
    g.weight("unread_zero_point", np.zeros(4, np.uint8))
    g.op("Identity", [x], outputs=["y"])
    g.output("y", FLOAT, [2])
    with pytest.raises(ExportError, match=r"stores a weight no operator reads \(unread_zero_point\)"):
        stages._optimize(g.model(17, ""))


def test_a_library_missing_at_a_stage_names_it_and_the_extra(tiny_checkpoint, tmp_path, monkeypatch):
    def no_torch(*args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(stages, "load_checkpoint", no_torch)
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines()[-1].startswith(
        "Error: the load stage needs torch, which cannot be imported (No module named 'torch'): install the export "
        "extra, pip install 'torch>=2.1' "
    )


def _export_imports() -> dict:
    """edgelm.export's modules -> the edgelm.export modules each imports, lazy imports (inside functions) included."""
    import ast
    from pathlib import Path

    import edgelm.export

    root = Path(edgelm.export.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = ("edgelm", "export", *path.relative_to(root).with_suffix("").parts)
        package = parts[:-1]  # what a relative import counts from
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join((*base, *(node.module.split(".") if node.module else ())))
                below = [f"{target}.{alias.name}" for alias in node.names]
                found |= {m for m in below if m in modules} or ({target} if target in modules else set())
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found |= {n for n in names if n in modules}
        graph[name] = found - {name}
    return graph


def test_the_stages_and_validation_import_each_other_in_one_direction():
    """stages imports validate (lazily); validate never imports stages, nor anything that does."""
    graph = _export_imports()
    assert "edgelm.export.validate" in graph["edgelm.export.stages"]

    def reaches(start, goal, seen=()):
        return any(m == goal or (m not in seen and reaches(m, goal, (*seen, m))) for m in graph[start])

    assert not reaches("edgelm.export.validate", "edgelm.export.stages")
    for family in ("gpt2", "llama"):  # each family's reference and calibration: the shared modules, written once
        assert {"edgelm.export.reference", "edgelm.export.calibrate"} <= graph[
            f"edgelm.export.families.{family}.reference"
        ]
