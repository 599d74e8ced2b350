"""examples/sidecar.mjs, the recipe docs/apps.md gives an Electron-style app, run with node against the installed
`edgelm` command: spawn, ready line, a streamed chat, a structured answer, a clean stop. (The frozen command made
by `edgelm bundle` runs it too: tests/apps/test_freeze.py.)"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sidecar.mjs"
NODE = shutil.which("node")


def run_sidecar(command: str, *arguments, cwd=None, env=None) -> dict:
    """The example's output, as {step: what it printed}."""
    done = subprocess.run([NODE, str(EXAMPLE), command, *arguments], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(": ", 1) for line in done.stdout.splitlines())


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_node_recipe_spawns_streams_gets_json_and_stops(tiny_package_long):
    out = run_sidecar(str(Path(sys.executable).parent / "edgelm"), str(tiny_package_long),
                      env=os.environ | {"EDGELM_HOME": os.environ["EDGELM_HOME"]})  # fmt: skip
    assert out["ready"].startswith("tiny-long at http://127.0.0.1:")
    assert json.loads(out["streamed"])  # some text
    trip = json.loads(out["structured"])
    assert set(trip) == {"city", "days"} and 1 <= trip["days"] <= 30 and len(trip["city"]) <= 12
    assert out["stopped"] == "exit code 0"
