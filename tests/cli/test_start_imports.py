"""`import edgelm.runtime`, `edgelm.load(PKG)` with a first generation, `edgelm generate` and the server's first
completion import what the first token needs and nothing more: each unneeded import is paid by every start
(benchmarks/start_stages.py measures each stage, benchmarks/start_to_first_token.py the command)."""

import subprocess
import sys
import textwrap

# Imported by other commands, other options or by nothing on these paths. importlib.metadata (email, zipfile,
# csv: ~0.07 s) was once imported to read the onnxruntime distributions, which their folders' names give; the
# standard library's logging, tempfile (with shutil, bz2 and lzma) and concurrent.futures are imported where a line
# is logged, a file written or a constraint's masks computed.
NOT_NEEDED = (
    "importlib.metadata",
    "email",
    "jinja2",
    "tqdm",
    "huggingface_hub",
    "starlette",
    "uvicorn",
    "pydantic",
    "onnxruntime.transformers",
    "onnxruntime.tools",
    "edgelm.export",
    "edgelm.runtime.server",
    "edgelm.runtime.store.hub",
    "edgelm.runtime.cli.serve",
    "edgelm.runtime.cli.chat",
    "edgelm.runtime.cli.bundle",
    "edgelm.runtime.apps.bench",
    "torch",
    "transformers",
    "llguidance",
    "logging",
    "tempfile",
    "shutil",
    "bz2",
    "lzma",
    "concurrent.futures",
)
# `import edgelm.runtime` gives the error types at once and the rest on first use (runtime/__init__.py), so that
# the command can restart with huge pages before it pays for these (cli/launch.py).
NOT_AT_IMPORT = ("numpy", "onnxruntime", "tokenizers", "click", "edgelm.runtime.model")

REPORT = "print('imported', sorted(m for m in NAMES if m in sys.modules), flush=True)"


def checked_once(package) -> str:
    """The package's folder, loaded once already: a load whose files match the record of the last full check
    writes nothing (package/verified.py), the first one writes the record."""
    import edgelm.runtime

    edgelm.runtime.load(package)
    return str(package)


def imported_after(code: str, names: tuple, *args) -> list:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code).replace("REPORT", REPORT.replace("NAMES", repr(names))), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("imported "), done.stdout
    return eval(last.removeprefix("imported "))


def test_import_edgelm_runtime_imports_none_of_the_engine():
    assert imported_after("import sys\nimport edgelm.runtime\nREPORT", NOT_AT_IMPORT + NOT_NEEDED) == []


def test_the_api_loads_and_generates_without_what_its_first_token_does_not_need(tiny_package):
    code = """
        import sys
        import edgelm.runtime as edgelm
        print(edgelm.load(sys.argv[1]).generate("Hello", max_new_tokens=1).completion_tokens)
        REPORT
    """
    assert imported_after(code, NOT_NEEDED + ("click",), checked_once(tiny_package)) == []


def test_generate_imports_nothing_its_first_token_does_not_need(tiny_package):
    # reported at exit: the command ends the process itself (cli/launch.py), after the atexit functions
    code = """
        import atexit, sys
        from edgelm.runtime.cli.launch import command
        sys.argv = ["edgelm", "generate", "-m", sys.argv[1], "Hello", "--max-new-tokens", "1"]
        atexit.register(lambda: REPORT)
        command()
    """
    assert imported_after(code, NOT_NEEDED, checked_once(tiny_package)) == []


def test_the_check_sees_a_planted_import(tiny_package):
    code = """
        import sys
        import edgelm.runtime as edgelm
        import logging, concurrent.futures
        print(edgelm.load(sys.argv[1]).generate("Hello", max_new_tokens=1).completion_tokens)
        REPORT
    """
    assert imported_after(code, NOT_NEEDED, checked_once(tiny_package)) == ["concurrent.futures", "logging"]


# The server's own stack (Starlette, pydantic, anyio, uvicorn) imports logging, tempfile, email, importlib.metadata
# and concurrent.futures itself; what it must not pull in before a chat or a constrained request is the rest.
SERVE_NOT_NEEDED = (
    "jinja2",
    "tqdm",
    "huggingface_hub",
    "onnxruntime.transformers",
    "onnxruntime.tools",
    "edgelm.export",
    "edgelm.runtime.store.hub",
    "edgelm.runtime.cli",
    "torch",
    "transformers",
    "llguidance",
)


def test_the_server_answers_its_first_completion_without_what_it_does_not_need(tiny_package):
    code = """
        import sys
        from starlette.testclient import TestClient
        import edgelm.runtime as edgelm
        from edgelm.runtime.server.app import create_app

        # one running batch, as serve runs; the constraint table, which serve builds in the background, left out:
        # what is measured is the completion's own path
        app = create_app(edgelm.load(sys.argv[1], spinning=False), prepare_constraints=False)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            answer = client.post("/v1/completions", json={"model": app.names.id, "prompt": "Hi", "max_tokens": 1})
            assert answer.status_code == 200, answer.text
        REPORT
    """
    assert imported_after(code, SERVE_NOT_NEEDED, checked_once(tiny_package)) == []


# The Model's own modules (runtime/model/loaded.py and what its methods use), which load() imports while the
# session's thread creates the onnxruntime session: each is noted as it is first imported, with whether that
# thread had been started then (a tiny package's session may be made before the imports end).
BESIDE_THE_SESSION = (
    "edgelm.runtime.engine.decode",
    "edgelm.runtime.batching.batch",
    "edgelm.runtime.sampling",
    "edgelm.runtime.speculative",
    "edgelm.runtime.text.chat_template",
    "edgelm.runtime.generation_config",  # the package's reading needs none of it (Package.describe imports it)
    "numpy.random",
)
# and the command's own: `edgelm generate -m PKG` starts the session before click is imported (runtime/cli/early.py)
BESIDE_THE_COMMANDS_SESSION = (*BESIDE_THE_SESSION, "click", "edgelm.runtime.cli.main")
WATCH = f"""
import sys, threading

started, start = [], threading.Thread.start
threading.Thread.start = lambda thread: started.append(thread.name) or start(thread)

class Watch:  # a finder that finds nothing: it notes each module of BESIDE_THE_COMMANDS_SESSION as it is imported
    def find_spec(self, name, path=None, target=None):
        if name in {BESIDE_THE_COMMANDS_SESSION!r}:
            print("beside", name, "edgelm-onnxruntime-session" in started, flush=True)
        return None

sys.meta_path.insert(0, Watch())
"""


def imported_beside_the_session(code: str, *args) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WATCH + textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    noted = [line.split() for line in done.stdout.splitlines() if line.startswith("beside ")]
    return {name: running == "True" for _, name, running in noted}


def test_the_api_imports_the_models_modules_while_the_session_is_created(tiny_package):
    code = """
        import edgelm.runtime as edgelm
        print(edgelm.load(sys.argv[1]).generate("Hello", max_new_tokens=1).completion_tokens)
    """
    assert imported_beside_the_session(code, checked_once(tiny_package)) == dict.fromkeys(BESIDE_THE_SESSION, True)


def test_generate_imports_the_models_modules_while_the_session_is_created(tiny_package):
    code = """
        from edgelm.runtime.cli.launch import command
        sys.argv = ["edgelm", "generate", "-m", sys.argv[1], "Hello", "--max-new-tokens", "1"]
        command()
    """
    expected = dict.fromkeys(BESIDE_THE_COMMANDS_SESSION, True)
    assert imported_beside_the_session(code, checked_once(tiny_package)) == expected


def test_the_beside_check_sees_a_module_imported_before_the_load(tiny_package):
    code = """
        import edgelm.runtime.engine.decode
        import edgelm.runtime as edgelm
        edgelm.load(sys.argv[1])
    """
    noted = imported_beside_the_session(code, checked_once(tiny_package))
    assert noted["edgelm.runtime.engine.decode"] is False and noted["edgelm.runtime.speculative"] is True


def test_a_fresh_process_loads_a_model_with_its_draft(tiny_package):
    """load(draft=) in a process where nothing imported the Model's modules before the load."""
    code = """
        import edgelm.runtime as edgelm
        model = edgelm.load(sys.argv[1], draft=sys.argv[1])
        completion = model.generate("Hello", max_new_tokens=2, speculative="draft")
        print(type(model.draft).__name__, completion.completion_tokens)
    """
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + textwrap.dedent(code), checked_once(tiny_package)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Model", "2"]
