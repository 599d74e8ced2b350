"""Running code in a child Python where PyTorch, transformers, optimum and onnx cannot be imported."""

import os
import subprocess
import sys
import textwrap

FORBIDDEN = {"torch", "transformers", "optimum", "onnx"}  # onnxruntime is allowed; the onnx package is not


# Run first in the child: every import of a forbidden top-level package fails, as if it were not installed.
BLOCKER = textwrap.dedent("""
    import sys

    FORBIDDEN = {forbidden!r}

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in FORBIDDEN:
                raise ImportError(f"{{name}} is blocked: the runtime must work without it", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in FORBIDDEN:
            del sys.modules[name]
    try:
        import torch
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker does not work")
""").format(forbidden=FORBIDDEN)


CHECK_LOADED = textwrap.dedent("""
    leaked = sorted({name.split(".")[0] for name in sys.modules} & FORBIDDEN)
    assert not leaked, f"imported: {leaked}"
""")


def run_blocked(code, *args):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}  # never the network, whatever the code under test tries
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code) + CHECK_LOADED, *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
        env=environment,
    )
