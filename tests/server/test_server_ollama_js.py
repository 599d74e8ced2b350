"""The official ollama JavaScript client (npm's `ollama`) against edgelm serve's /api/, with node: the slow tier,
since it installs the client from the npm registry."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from server_harness import Server

CLIENT = Path(__file__).resolve().parent / "clients" / "ollama_js.mjs"


@pytest.mark.slow
def test_the_ollama_javascript_client_lists_chats_streams_and_constrains(tiny_package, tmp_path):
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for the ollama JavaScript client's test"
    folder = tmp_path / "client"
    folder.mkdir()
    shutil.copy(CLIENT, folder / CLIENT.name)
    installed = subprocess.run([npm, "install", "--no-audit", "--no-fund", "ollama@0"], cwd=folder,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    server = Server(tiny_package, tmp_path, "--model-name", "tiny")
    try:
        environ = os.environ | {"EDGELM_URL": server.url, "EDGELM_MODEL": "tiny"}
        done = subprocess.run([node, CLIENT.name], cwd=folder, capture_output=True, text=True, timeout=300,
                              env=environ)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:] + server.log()[-2000:]
    finally:
        server.stop()
    out = json.loads(done.stdout)
    assert out["models"] == ["tiny"] and out["done"] is True and out["eval_count"] > 0
    assert isinstance(out["chat"], str) and isinstance(out["streamed"], str)
    assert set(out["json"]) == {"ok"} and isinstance(out["json"]["ok"], bool)
    assert out["error"]["status"] == 404 and "does not exist" in out["error"]["message"]
