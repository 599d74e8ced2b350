"""Every repository path a document names exists: README.md, docs/*.md, and the comments and docstrings of
runtime/ and export/.

What counts as a path: a name under one of the repository's folders (`runtime/engine/decode.py`, `docs/serve.md`,
`benchmarks/results/`, `tests/repository/test_layers.py`) that ends in a file extension or a slash, globs allowed
(`export/families/*/graph.py`), placeholders in capitals skipped (`export/families/NAME/`); and a bare module name
(`fast_path.py`), which must be the name of some file of the repository. Names wrapped across two lines are not
read. benchmarks/README.md indexes every script of benchmarks/ and names no other file.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
FOLDERS = ("runtime", "export", "docs", "benchmarks", "tests", "examples", "tools", "models")
EXTENSIONS = (".py", ".md", ".sh", ".json", ".txt", ".toml", ".yml", ".yaml", ".jsonl", ".onnx")
PATH = re.compile(r"(?<![\w./$~-])((?:" + "|".join(FOLDERS) + r")/[\w.*/-]*)")
BARE = re.compile(r"(?<![\w./*-])(\w+\.py)\b")


def notes(path: Path) -> list:
    """The comments and docstrings of a Python file."""
    source = path.read_text(encoding="utf-8")
    found = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(ast.get_docstring(node, clean=False) or "")
    return found


def documents(root: Path) -> list:
    """(file, text) for every document and every comment or docstring under runtime/ and export/."""
    found = [(md, md.read_text(encoding="utf-8")) for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]]
    for folder in ("runtime", "export"):
        found += [(py, text) for py in sorted((root / folder).rglob("*.py")) for text in notes(py)]
    return found


def paths_named(text: str) -> set:
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".-")
        if any(part.isupper() for part in path.split("/")):  # a placeholder: export/families/NAME/
            continue
        if path.startswith("models/") and not path.endswith((".md", ".py")):  # models/distilgpt2: a user's folder
            continue
        if path.endswith("/") or path.endswith(EXTENSIONS):
            found.add(path)
    return found


def exists(root: Path, path: str) -> bool:
    path = path.rstrip("/")
    return any(root.glob(path)) if "*" in path else (root / path).exists()


def missing_paths(root: Path) -> dict:
    """{document: sorted missing paths} over every document of the repository at `root`."""
    names = {p.name for folder in FOLDERS if (root / folder).is_dir() for p in (root / folder).rglob("*.py")}
    missing = {}
    for where, text in documents(root):
        gone = {path for path in paths_named(text) if not exists(root, path)}
        gone |= {name for name in BARE.findall(text) if name not in names} if where.suffix == ".py" else set()
        if gone:
            key = str(where.relative_to(root))
            missing[key] = sorted(set(missing.get(key, [])) | gone)
    return missing


def test_every_path_a_document_or_comment_names_exists():
    assert missing_paths(REPOSITORY) == {}


def test_the_check_finds_a_stale_path_in_a_document_a_docstring_and_a_comment(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "runtime" / "engine").mkdir(parents=True)
    (root / "export").mkdir()
    (root / "README.md").write_text("See [serving](docs/serve.md) and docs/gone.md; models/distilgpt2 is yours.\n")
    (root / "docs" / "serve.md").write_text("Built by runtime/engine/decode.py, under export/families/*/graph.py.\n")
    (root / "runtime" / "engine" / "decode.py").write_text(
        '"""The loop (see runtime/engine/old_loop.py and fast_path.py)."""\n\n'
        "x = 1  # the contract: models/README.md, tests/test_x.py, and export/families/NAME/\n"
    )
    (root / "runtime" / "engine" / "fast_path.py").write_text("")
    assert missing_paths(root) == {
        "README.md": ["docs/gone.md"],
        "docs/serve.md": ["export/families/*/graph.py"],
        "runtime/engine/decode.py": ["models/README.md", "runtime/engine/old_loop.py", "tests/test_x.py"],
    }
    (root / "runtime" / "engine" / "fast_path.py").unlink()
    assert "fast_path.py" in missing_paths(root)["runtime/engine/decode.py"]


SCRIPT_SUFFIXES = (".py", ".sh", ".c", ".mjs")
INDEX_ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)


def benchmark_index_gaps(benchmarks: Path) -> dict:
    """{"unlisted": scripts of `benchmarks` (and its clients/ and custom_op/) that its README.md's table leaves out,
    "gone": names the table lists that are not files there}."""
    scripts = {
        str(p.relative_to(benchmarks))
        for folder in (benchmarks, benchmarks / "clients", benchmarks / "custom_op")
        if folder.is_dir()
        for p in folder.iterdir()
        if p.is_file() and p.suffix in SCRIPT_SUFFIXES
    }
    readme = benchmarks / "README.md"
    listed = set(INDEX_ROW.findall(readme.read_text(encoding="utf-8"))) if readme.exists() else set()
    return {"unlisted": sorted(scripts - listed), "gone": sorted(listed - scripts)}


def test_the_benchmarks_index_lists_every_script_and_no_other():
    assert benchmark_index_gaps(REPOSITORY / "benchmarks") == {"unlisted": [], "gone": []}


def test_the_index_check_finds_an_unlisted_script_and_a_gone_one(tmp_path):
    (tmp_path / "clients").mkdir()
    for name in ("listed.py", "new.sh", "clients/client.mjs", "NOTES.md"):
        (tmp_path / name).write_text("")
    (tmp_path / "README.md").write_text(
        "| script | what | command |\n| --- | --- | --- |\n"
        "| `listed.py` | a | `python listed.py` |\n| `clients/client.mjs` | b | c |\n| `removed.py` | d | e |\n"
    )
    assert benchmark_index_gaps(tmp_path) == {"unlisted": ["new.sh"], "gone": ["removed.py"]}
