"""The folders stack: every import in runtime/ follows the layer order written once in tools/layers.py (LAYERS),
lazy (function-level) imports and imports by a literal name included, and no two modules import each other.

runtime/ is parsed once for the whole session; the test that plants bad imports parses its own copy.
"""

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
RUNTIME = REPOSITORY / "runtime"
EXPORT = REPOSITORY / "export"


def _load_layers():
    spec = importlib.util.spec_from_file_location("edgelm_layers", REPOSITORY / "tools" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layers = _load_layers()


@functools.cache
def runtime_imports():
    return layers.Imports(RUNTIME, layers.RUNTIME_PACKAGE)


def test_every_runtime_folder_and_root_module_has_a_layer():
    found = runtime_imports()
    assert {"model", "engine", "sampling", "apps", "server", "cli", layers.ROOT} <= {
        layers.unit_of(m, found.package) for m in found.modules
    }  # where the check looks
    assert found.unplaced() == []


def test_no_import_runs_against_the_layer_order():
    found = runtime_imports()
    # what it reads: top-level, relative, lazy and by literal name
    assert "edgelm.runtime.engine.decode" in found.modules["edgelm.runtime.model.loaded"]
    assert "edgelm.runtime.package.onnxruntime_compat" in found.modules["edgelm.runtime.engine"]
    assert "edgelm.runtime.apps.bench" in found.modules["edgelm.runtime.cli.main"]  # inside a function
    assert "edgelm.runtime.apps.pipeline" in found.modules["edgelm.runtime"]  # the public names' _LAZY table
    assert found.against_the_order() == {}


def test_no_two_runtime_modules_or_folders_import_each_other():
    found = runtime_imports()
    assert found.module_cycles() == [] and found.unit_cycles() == []


def test_gptq_and_the_int4_methods_import_one_way():
    export = layers.Imports(EXPORT, layers.EXPORT_PACKAGE)
    assert ("int4", "gptq") in export.units and ("gptq", "int4") not in export.units


def test_no_export_module_imports_itself_back():
    assert layers.Imports(EXPORT, layers.EXPORT_PACKAGE).module_cycles() == []


def test_the_checks_find_each_kind_of_bad_import_planted(tmp_path):
    """A copy of runtime/ with an import up the order hidden in a function, one by a literal name, one in the
    public names' table, one between two units of the same layer, a folder with no layer and a lazy module cycle:
    each is named."""
    root = shutil.copytree(RUNTIME, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "engine" / "decode.py", "a") as decode:
        decode.write("\n\ndef _hidden():\n    from ..model import load\n")
    with open(root / "sampling" / "filters.py", "a") as filters:
        filters.write("\n\ndef _hidden():\n    __import__('edgelm.runtime.server.app')\n")
    with open(root / "text" / "chat_messages.py", "a") as messages:
        messages.write("\n\ndef _hidden():\n    from ..sampling.draw import pick\n")
    with open(root / "text" / "tokenizer.py", "a") as tokenizer:
        tokenizer.write("\n\ndef _hidden():\n    from . import stream\n")  # stream.py imports tokenizer.py
    init = (root / "__init__.py").read_text()
    (root / "__init__.py").write_text(init.replace('_LAZY = {', '_LAZY = {\n    "create_app": "server.app",', 1))
    (root / "newthing").mkdir()
    (root / "newthing" / "__init__.py").write_text("from ..errors import EdgelmError\n")
    found = layers.Imports(root, layers.RUNTIME_PACKAGE)
    assert found.against_the_order() == {
        "(root) -> server": ["edgelm.runtime -> edgelm.runtime.server.app"],
        "engine -> model": ["edgelm.runtime.engine.decode -> edgelm.runtime.model"],
        "sampling -> server": ["edgelm.runtime.sampling.filters -> edgelm.runtime.server.app"],
        "text -> sampling": ["edgelm.runtime.text.chat_messages -> edgelm.runtime.sampling.draw"],
    }
    assert found.unplaced() == ["newthing"]
    cycles = found.module_cycles()
    assert {
        "edgelm.runtime.text.stream -> edgelm.runtime.text.tokenizer",
        "edgelm.runtime.text.tokenizer -> edgelm.runtime.text.stream",
    } <= set(cycles)
    assert not any("store" in edge or "chat_template" in edge for edge in cycles)  # no cycle through them
    assert ("engine", "model") in found.unit_cycles()  # model imports the engine: the planted import closes a loop


def test_the_graph_command_marks_cycles_and_imports_against_the_order(tmp_path):
    root = shutil.copytree(RUNTIME, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "package" / "open.py", "a") as opened:
        opened.write("\n\ndef _hidden():\n    from ..engine import decode\n")
    report = layers.Imports(root, layers.RUNTIME_PACKAGE).report()
    assert "  package -> " in report and "engine!*" in report.split("  package -> ")[1].splitlines()[0]
    assert "against the layer order:\n  package -> engine\n" in report
    assert "cycles: none" in runtime_imports().report() and "against the layer order: none" in runtime_imports().report()


def test_the_command_prints_both_graphs():
    done = subprocess.run(
        [sys.executable, str(REPOSITORY / "tools" / "layers.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "edgelm.runtime (runtime/)\n" in done.stdout and "\nedgelm.export (export/)\n" in done.stdout
    assert "  model -> " in done.stdout and "layers, bottom-up: errors < " in done.stdout


def test_every_subpackage_is_in_the_wheel():
    """pyproject.toml lists the packages a wheel holds: a folder moved or added under runtime/ or export/ is there."""
    listed = re.search(r"^packages = \[(.*?)\]", (REPOSITORY / "pyproject.toml").read_text(), re.M | re.S).group(1)
    folders = {
        ".".join(("edgelm", *init.parent.relative_to(REPOSITORY).parts))
        for tree in (RUNTIME, EXPORT)
        for init in tree.rglob("__init__.py")
    }
    assert "edgelm.runtime.apps" in folders and set(re.findall(r'"([\w.]+)"', listed)) == folders
