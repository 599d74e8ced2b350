"""The runtime works where PyTorch, transformers, optimum and onnx cannot be imported, and its source never
imports them (CONVENTIONS.md rule 1: the package folder is the only thing that crosses the border)."""

import ast
import json
from pathlib import Path

from torch_blocker import FORBIDDEN, run_blocked

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_library_runs_without_torch(tiny_package):
    done = run_blocked(
        """
        import json, sys
        import edgelm.runtime as rt

        model = rt.load(sys.argv[1])
        completion = model.generate("The quick brown fox", max_new_tokens=8, min_new_tokens=8)
        pieces = list(model.stream("Once upon a time", max_new_tokens=8, do_sample=True, seed=3))
        score = model.score("The quick brown fox")
        batch = model.generate(["Hi", "import numpy"], max_new_tokens=4)
        print(json.dumps({"token_ids": completion.token_ids, "stream": "".join(pieces), "logprobs": score.logprobs, "batch": len(batch)}))
    """,
        tiny_package,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)

    import edgelm.runtime as rt

    model = rt.load(tiny_package)
    assert result["token_ids"] == model.generate("The quick brown fox", max_new_tokens=8, min_new_tokens=8).token_ids
    assert result["stream"] == model.generate("Once upon a time", max_new_tokens=8, do_sample=True, seed=3).text
    assert result["logprobs"] == model.score("The quick brown fox").logprobs
    assert result["batch"] == 2


def test_cli_runs_without_torch(tiny_package):
    done = run_blocked(
        """
        import sys
        from edgelm.runtime.cli.main import main

        for args in (["generate", "-m", sys.argv[1], "The quick brown", "--max-new-tokens", "6"],
                     ["info", sys.argv[1]], ["verify", sys.argv[1]], ["--help"]):
            try:
                main(args, prog_name="edgelm")
            except SystemExit as exit:
                assert exit.code in (0, None), (args, exit.code)
    """,
        tiny_package,
    )
    assert done.returncode == 0, done.stderr

    import edgelm.runtime as rt

    text = rt.load(tiny_package).generate("The quick brown", max_new_tokens=6).text
    assert done.stdout.startswith(text + "\n")
    assert "2 layers" in done.stdout and "OK:" in done.stdout and "export" in done.stdout


def test_export_without_torch_says_what_to_install(tmp_path):
    """The one command that needs the heavy stack fails with an install hint, not a traceback."""
    done = run_blocked(
        """
        import sys
        from edgelm.runtime.cli.main import main

        try:
            main(["export", sys.argv[1], "-o", sys.argv[2]], prog_name="edgelm")
        except SystemExit as exit:
            assert exit.code == 1, exit.code
    """,
        tmp_path / "no-checkpoint-here",
        tmp_path / "out",
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'torch>=2.1'" in done.stderr and "edgelm[" not in done.stderr
    assert "Traceback" not in done.stderr


def imported_modules(tree):
    """Top-level package names of every import statement in a module, at any depth (functions, try blocks)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "__import__",
            "import_module",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.args[0].value.split(".")[0]


def test_runtime_source_never_imports_the_export_stack():
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) >= 8
    offenders = {}
    for path in files:
        found = set(imported_modules(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))) & FORBIDDEN
        if found:
            offenders[path.name] = sorted(found)
    assert offenders == {}


def test_the_static_check_would_catch_a_hidden_import():
    tree = ast.parse(
        "def f():\n    try:\n        import torch.nn\n    except ImportError:\n        from onnx import helper\n    __import__('transformers')\n"
    )
    assert set(imported_modules(tree)) == {"torch", "onnx", "transformers"}
    assert set(imported_modules(ast.parse("import onnxruntime as ort\nfrom onnxruntime import OrtValue"))) == {
        "onnxruntime"
    }
