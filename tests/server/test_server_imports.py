"""The plain runtime install has no server extra: nothing outside runtime/server imports pydantic, Starlette or
uvicorn, the library and CLI work where they cannot be imported, and `edgelm serve` says what to install."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
SERVER_ONLY = {"pydantic", "pydantic_core", "starlette", "uvicorn", "h11"}

BLOCKER = textwrap.dedent(f"""
    import sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {SERVER_ONLY!r}:
                raise ImportError(f"{{name}} is blocked: the plain install has no server extra", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
""")


def imported(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_runtime_server_imports_the_server_extra():
    outside = [p for p in RUNTIME.rglob("*.py") if "server" not in p.relative_to(RUNTIME).parts]
    assert len(outside) >= 8
    assert {p.name: sorted(imported(p) & SERVER_ONLY) for p in outside if imported(p) & SERVER_ONLY} == {}
    assert "pydantic" in imported(RUNTIME / "server" / "api" / "requests.py")  # the check would see one


def test_the_runtime_works_without_the_server_extra(tiny_package):
    code = BLOCKER + textwrap.dedent("""
        from edgelm.runtime.cli.main import main
        import edgelm.runtime as rt

        print(rt.load(sys.argv[1]).generate("Hi", max_new_tokens=3).completion_tokens)
        for args in (["info", sys.argv[1]], ["serve", sys.argv[1]]):
            try:
                main(args, prog_name="edgelm")
            except SystemExit as exit:
                print("exit", exit.code)
        leaked = sorted({name.split(".")[0] for name in sys.modules} & SERVER_ONLY)
        print("leaked", leaked)
    """).replace("SERVER_ONLY", repr(SERVER_ONLY))
    done = subprocess.run([sys.executable, "-c", code, str(tiny_package)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "3" and "exit 1" in done.stdout and "leaked []" in done.stdout
    assert "pip install 'uvicorn>=0.30' 'starlette>=0.40' 'pydantic>=2'" in done.stderr and "Traceback" not in done.stderr
