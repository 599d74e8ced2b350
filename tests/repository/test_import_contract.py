"""The import contract between edgelm's layers, as rules on import prefixes, read from the import statements
themselves (ast), and checked again in a fresh process where reading cannot see everything (imports by computed
names, lazy attributes):

- the runtime never imports the export stage: only the command line (edgelm.runtime.cli) names it, for
  `edgelm export`;
- only edgelm.runtime.cli imports click, and only edgelm.runtime.server imports starlette, uvicorn or pydantic;
- the engine and the samplers (edgelm.runtime.engine, edgelm.runtime.sampling, and every runtime module they
  import) never import tokenizers: they work on ids;
- in the export stage, no architecture family (a subpackage of edgelm.export.families) imports another family or
  the package that chooses among them, and what the families share (the graph kit, the common checkpoint
  reading) never imports a family.
"""

import ast
import functools
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
EXPORT = RUNTIME.parent / "export"
PACKAGE = "edgelm.runtime"
COMMAND_LINE = f"{PACKAGE}.cli"  # the only subpackage that may import click, and name the export stage
SERVER = f"{PACKAGE}.server"  # the only one that may import the server extra's libraries
SERVER_LIBRARIES = {"starlette", "uvicorn", "pydantic"}
ON_IDS = (f"{PACKAGE}.engine", f"{PACKAGE}.sampling")  # the layers below text: never tokenizers
ENGINE = f"{PACKAGE}.engine.decode"
EXPORT_NAME = re.compile(r"edgelm\.export(\.\w+)*(:\w+)?")
FAMILIES = "edgelm.export.families"  # one subpackage per architecture family
SHARED = ("edgelm.export.graph", "edgelm.export.checkpoint")  # what the families are built from


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules(root: Path, package: str = PACKAGE) -> dict:
    """Every module under root (the folder of `package`, edgelm.runtime by default) by its dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per version of the file (a planted import changes its size and time),
    so the checks share one parse of runtime/ in a session."""
    stat = path.stat()
    return _parse(str(path), (stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=None)
def _parse(path: str, version: tuple) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def imports(name: str, path: Path) -> set:
    """The absolute names a module imports at any depth (functions, try blocks, __import__ / import_module with a
    literal name); `from a import b` gives both a and a.b, since b may be a module."""
    stat = path.stat()
    return set(_imports(name, str(path), (stat.st_mtime_ns, stat.st_size)))


@functools.lru_cache(maxsize=None)
def _imports(name: str, file: str, version: tuple) -> frozenset:
    path = Path(file)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(part for part in (base, node.module) if part)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "__import__",
            "import_module",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return frozenset(found)


def top_level(names) -> set:
    return {name.split(".")[0] for name in names}


def closure(start: str, tree: dict) -> set:
    """start and every runtime module it imports, directly or not, with the packages that hold them."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in tree:
            continue
        seen.add(name)
        parents = [name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)]
        todo += [n for n in imports(name, tree[name]) if n.startswith(PACKAGE)] + parents
    return seen


def runtime_imports_of_export(root: Path) -> dict:
    """Modules that import edgelm.export, or name it outside the command line."""
    offenders = {}
    for name, path in modules(root).items():
        imported = {n for n in imports(name, path) if EXPORT_NAME.fullmatch(n)}
        named = {
            node.value
            for node in ast.walk(parsed(path))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and EXPORT_NAME.fullmatch(node.value)
        }
        if imported or (named and not within(name, COMMAND_LINE)):
            offenders[name] = sorted(imported | named)
    return offenders


def engine_imports_of_tokenizers(root: Path) -> dict:
    tree = modules(root)
    below_text = set().union(*(closure(name, tree) for name in tree if any(within(name, p) for p in ON_IDS)))
    return {name: "tokenizers" for name in below_text if "tokenizers" in top_level(imports(name, tree[name]))}


def imports_outside(root: Path, libraries: set, owner: str) -> dict:
    """Modules outside `owner` that import any of `libraries`."""
    return {
        name: sorted(found)
        for name, path in modules(root).items()
        if not within(name, owner) and (found := top_level(imports(name, path)) & libraries)
    }


def library_imports_of_click(root: Path) -> dict:
    return {name: "click" for name in imports_outside(root, {"click"}, COMMAND_LINE)}


def families_importing_each_other(root: Path) -> dict:
    """Modules of one family (edgelm.export.families.NAME, root being the folder of edgelm.export) that import
    another family, or edgelm.export.families itself (which imports every family), by name."""
    families = {f"{FAMILIES}.{d.name}" for d in (root / "families").iterdir() if (d / "__init__.py").is_file()}
    family = lambda name: next((f for f in families if within(name, f)), None)  # noqa: E731
    offenders = {}
    for name, path in modules(root, "edgelm.export").items():
        if (own := family(name)) is not None:
            crossed = {n for n in imports(name, path) if n == FAMILIES or family(n) not in (None, own)}
            if crossed:
                offenders[name] = sorted(crossed)
    return offenders


def shared_imports_of_families(root: Path) -> dict:
    """Modules of the graph kit or the common checkpoint reading that import edgelm.export.families."""
    return {
        name: sorted(found)
        for name, path in modules(root, "edgelm.export").items()
        if any(within(name, p) for p in SHARED) and (found := {n for n in imports(name, path) if within(n, FAMILIES)})
    }


def test_the_runtime_never_imports_the_export_stage():
    assert runtime_imports_of_export(RUNTIME) == {}


def test_the_engine_never_imports_tokenizers():
    tree = modules(RUNTIME)
    engine = closure(ENGINE, tree)
    assert {ENGINE, PACKAGE, "edgelm.runtime.engine.steps"} <= engine  # the walk follows relative imports
    assert "edgelm.runtime.model" not in engine and not any(within(n, f"{PACKAGE}.text") for n in engine)
    assert not any(within(n, f"{PACKAGE}.sampling") for n in engine)  # the pick is the caller's: no sampler below
    assert engine_imports_of_tokenizers(RUNTIME) == {}


def test_the_library_never_imports_click():
    assert "click" in top_level(imports(f"{COMMAND_LINE}.main", RUNTIME / "cli" / "main.py"))  # what it looks for
    assert library_imports_of_click(RUNTIME) == {}


def test_only_the_server_imports_the_server_libraries():
    assert {"starlette"} <= top_level(imports(f"{SERVER}.app", RUNTIME / "server" / "app.py"))
    assert imports_outside(RUNTIME, SERVER_LIBRARIES, SERVER) == {}


def test_each_check_finds_a_forbidden_import_added_anywhere(tmp_path):
    """A copy of runtime/ with one forbidden import hidden in a function of each kind of module fails each check."""
    root = shutil.copytree(RUNTIME, tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "sampling" / "chain.py", "a") as sampling:  # imported by the engine
        sampling.write("\n\ndef _hidden():\n    from tokenizers import Tokenizer\n")
    with open(root / "model" / "__init__.py", "a") as model:
        model.write("\n\ndef _hidden():\n    import click.testing\n    from ...export import stages\n")
    with open(root / "engine" / "session.py", "a") as session:
        session.write("\n\ndef _hidden():\n    __import__('edgelm.export.stages')\n")
    assert engine_imports_of_tokenizers(root) == {"edgelm.runtime.sampling.chain": "tokenizers"}
    with open(root / "batching" / "scheduler.py", "a") as scheduler:
        scheduler.write("\n\ndef _hidden():\n    import starlette.responses\n")
    assert library_imports_of_click(root) == {"edgelm.runtime.model": "click"}
    assert imports_outside(root, SERVER_LIBRARIES, SERVER) == {"edgelm.runtime.batching.scheduler": ["starlette"]}
    assert runtime_imports_of_export(root) == {
        "edgelm.runtime.model": ["edgelm.export", "edgelm.export.stages"],
        "edgelm.runtime.engine.session": ["edgelm.export.stages"],
    }


# Run in a fresh process, after the code under test: the top-level packages it loaded, as JSON.
LOADED = "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | set(sys.modules))))\n"


def loaded_by(code: str, *args) -> set:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + LOADED, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_using_the_library_loads_neither_the_export_stage_nor_click(tiny_package):
    """Every library module imported, a package loaded and run: what lazy attributes and computed imports pull in."""
    library = sorted(
        n for n in modules(RUNTIME) if not any(within(n, p) for p in (COMMAND_LINE, SERVER, f"{PACKAGE}._pyinstaller"))
    )
    loaded = loaded_by(
        f"""
        import importlib, sys
        import edgelm.runtime as rt

        for name in {library!r}:
            importlib.import_module(name)
        model = rt.load(sys.argv[1])
        model.generate(["The quick", "Once"], max_new_tokens=4)
        "".join(model.stream("Hello", max_new_tokens=4, do_sample=True, seed=1))
        model.score("The quick brown fox")
        """,
        tiny_package,
    )
    assert {"edgelm.runtime.model", "onnxruntime", "tokenizers"} <= loaded  # it did run
    assert "click" not in loaded and not any(name.startswith("edgelm.export") for name in loaded)


def test_the_engine_loads_without_tokenizers():
    loaded = loaded_by(f"import {ENGINE}")
    assert ENGINE in loaded and "onnxruntime" in loaded and "tokenizers" not in loaded


def test_the_runtime_commands_load_the_export_stage_only_for_edgelm_export(tiny_package):
    loaded = loaded_by(
        """
        import sys
        from edgelm.runtime.cli.main import main

        for args in (["generate", "-m", sys.argv[1], "Hi", "--max-new-tokens", "3"], ["info", sys.argv[1]],
                     ["verify", sys.argv[1]]):
            try:
                main(args, prog_name="edgelm")
            except SystemExit as exit:
                assert exit.code in (0, None), (args, exit.code)
        """,
        tiny_package,
    )
    assert "click" in loaded and not any(name.startswith("edgelm.export") for name in loaded)


def test_no_family_imports_another_and_what_they_share_imports_none():
    families = modules(EXPORT / "families", FAMILIES)
    assert {f"{FAMILIES}.gpt2.graph", f"{FAMILIES}.llama.graph"} <= set(families)  # where the check looks
    assert "edgelm.export.graph.attention" in imports(f"{FAMILIES}.llama.graph", families[f"{FAMILIES}.llama.graph"])
    assert families_importing_each_other(EXPORT) == {}
    assert shared_imports_of_families(EXPORT) == {}


def test_the_family_checks_find_a_crossing_import_added_anywhere(tmp_path):
    """A copy of export/ with a family importing another (relative, absolute, computed name, the package that
    holds them all) and the graph kit importing a family fails the checks, naming each one."""
    root = shutil.copytree(EXPORT, tmp_path / "export", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "families" / "gpt2" / "graph.py", "a") as graph:
        graph.write("\n\ndef _hidden():\n    from ..llama.rope import rope_tables\n")
    with open(root / "families" / "llama" / "config.py", "a") as config:
        config.write(
            "\n\ndef _hidden():\n    __import__('edgelm.export.families.gpt2.config')\n    from .. import family_for\n"
        )
    with open(root / "graph" / "norms.py", "a") as norms:
        norms.write("\n\ndef _hidden():\n    import edgelm.export.families.gpt2\n")
    assert families_importing_each_other(root) == {
        f"{FAMILIES}.gpt2.graph": [f"{FAMILIES}.llama.rope", f"{FAMILIES}.llama.rope.rope_tables"],
        f"{FAMILIES}.llama.config": [FAMILIES, f"{FAMILIES}.gpt2.config"],
    }
    assert shared_imports_of_families(root) == {"edgelm.export.graph.norms": [f"{FAMILIES}.gpt2"]}


def test_the_export_package_offers_its_names_without_loading_torch_or_onnx():
    """`from edgelm.export import export_model` works; importing the package alone loads no heavy library."""
    loaded = loaded_by(
        """
        import edgelm.export

        names = ["ExportError", "ExportResult", "Int4Options", "ParityError", "add_prompt_cache", "export_model"]
        assert sorted(edgelm.export.__all__) == names
        heavy = {"torch", "transformers", "onnx"} & {m.split(".")[0] for m in __import__("sys").modules}
        assert not heavy, heavy
        from edgelm.export import ExportError, export_model
        from edgelm.export.stages import export_model as staged
        assert export_model is staged and issubclass(ExportError, Exception)
        try:
            edgelm.export.no_such_name
        except AttributeError:
            pass
        else:
            raise AssertionError("edgelm.export.no_such_name did not raise AttributeError")
        """
    )
    assert "edgelm.export.stages" in loaded
