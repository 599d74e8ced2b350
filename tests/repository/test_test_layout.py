"""The tests' own layout: a test module imports no other test module (shared helpers live in tests/support/),
and only the lab's tests (tests/benchmarks/) import modules of benchmarks/, so the product's tests do not depend
on the lab."""

import ast
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def imported_names(path: Path) -> set:
    """The top-level module names a Python file imports, function-level imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def layout_problems(root: Path) -> list:
    """'FILE imports NAME' for each test module that imports a test module or, outside tests/benchmarks/, a
    module of benchmarks/."""
    tests = root / "tests"
    lab = {p.stem for p in (root / "benchmarks").glob("*.py")}
    problems = []
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(tests)
        for name in sorted(imported_names(path)):
            in_lab_tests = where.parts[0] == "benchmarks"
            if name.startswith("test_") or name == "conftest" or (name in lab and not in_lab_tests):
                problems.append(f"tests/{where.as_posix()} imports {name}")
    return problems


def test_no_test_imports_another_test_module_or_the_lab_outside_its_own_tests():
    assert layout_problems(REPOSITORY) == []


def test_the_check_finds_a_test_module_import_and_a_lab_import(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "harness.py").write_text("")
    for folder in ("tests/engine", "tests/benchmarks", "tests/support"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tests/engine/test_a.py").write_text("import json\n\n\ndef test_a():\n    from harness import x\n")
    (tmp_path / "tests/engine/test_b.py").write_text("from test_a import helper\nfrom conftest import _once\n")
    (tmp_path / "tests/benchmarks/test_lab.py").write_text("import harness\n")
    (tmp_path / "tests/support/helpers.py").write_text("import json\n")
    assert layout_problems(tmp_path) == [
        "tests/engine/test_a.py imports harness",
        "tests/engine/test_b.py imports conftest",
        "tests/engine/test_b.py imports test_a",
    ]
