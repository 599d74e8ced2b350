"""`edgelm generate` imports what its first token needs and nothing more: each unneeded import is paid by every
command's start (benchmarks/start_to_first_token.py measures it)."""

import subprocess
import sys
import textwrap

# Imported by other commands or by nothing on this path: importlib.metadata (email, zipfile, csv: ~0.07 s) was
# once imported to read the onnxruntime distributions, which their folders' names give.
NOT_NEEDED = (
    "importlib.metadata",
    "email",
    "jinja2",
    "tqdm",
    "onnxruntime.transformers",
    "onnxruntime.tools",
    "edgelm.export",
    "edgelm.runtime.server",
    "edgelm.runtime.cli.serve",
    "edgelm.runtime.cli.chat",
    "edgelm.runtime.cli.bundle",
    "edgelm.runtime.apps.bench",
    "torch",
    "transformers",
    "llguidance",
)


def test_generate_imports_nothing_its_first_token_does_not_need(tiny_package):
    code = textwrap.dedent("""
        import sys
        from edgelm.runtime.cli.launch import command
        sys.argv = ["edgelm", "generate", "-m", sys.argv[1], "Hello", "--max-new-tokens", "1"]
        try:
            command()
        except SystemExit as exit:
            assert not exit.code, exit.code
        print("imported", sorted(m for m in NOT_NEEDED if m in sys.modules))
    """).replace("NOT_NEEDED", repr(NOT_NEEDED))
    done = subprocess.run([sys.executable, "-c", code, str(tiny_package)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "imported []", done.stdout
