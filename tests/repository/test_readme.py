"""Every code block of README.md runs as written, in order, offline: the hub is a hub-shaped server on 127.0.0.1
(HF_ENDPOINT) whose `distilgpt2` is a small GPT-2 with GPT-2's real tokenizer, so `edgelm export distilgpt2`
downloads, exports and validates as it does for a user. The install line is the one thing not run (the tests'
own environment is the installed one, linked as `.venv`): the test checks it asks for nothing more than .ci/run
installs. A line ending in `&` starts a server, which the next blocks talk to once /health answers."""

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fake_hub import FakeHub

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)
INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install (.*)$", re.M)


def blocks(readme: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in BLOCK.finditer(readme)]


def _extras(line: str) -> set:
    words = shlex.split(line)
    spec = next(w for w in words if w.startswith(".["))
    return set(spec[2:-1].split(","))


def test_the_readme_install_line_asks_only_for_what_ci_installs():
    """The line the README test does not run is covered by .ci/run's own install."""
    install_lines = [m[1] for _, code in blocks((ROOT / "README.md").read_text()) for m in INSTALL.finditer(code)]
    assert install_lines, "README.md has no install line"
    ci = (ROOT / ".ci" / "run").read_text()
    ci_extras = _extras(re.search(r"\.venv/bin/pip install [^&]*", ci)[0]) | {"constrained"}  # test holds llguidance
    for line in install_lines:
        assert "torch==2.13.0" in line
        assert _extras(line) <= ci_extras, f"README installs {_extras(line) - ci_extras} that .ci/run does not"


def _small_distilgpt2(folder: Path) -> Path:
    """A two-layer GPT-2 with GPT-2's tokenizer, as `edgelm export --random-weights` writes distilgpt2's."""
    import torch
    from edgelm.export.random_weights import random_checkpoint
    from transformers import GPT2Config, GPT2LMHeadModel

    random_checkpoint("distilgpt2", folder)  # the tokenizer files, and a config overwritten below
    torch.manual_seed(0)
    small = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=1024, bos_token_id=50256, eos_token_id=50256)
    GPT2LMHeadModel(small).eval().save_pretrained(folder)
    return folder


def _wait_for(url: str, server: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server stopped: {server.stdout.read()}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200 and json.loads(response.read()).get("status") == "ok":
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{url} did not answer in {seconds} s")


@pytest.mark.slow
def test_every_readme_block_runs_as_written(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    hub = FakeHub()
    hub.add_folder("distilgpt2", _small_distilgpt2(tmp_path / "checkpoint"))
    environ = os.environ | {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    servers = []
    try:
        for number, (language, code) in enumerate(blocks((ROOT / "README.md").read_text()), 1):
            if language == "python":
                script = work / f"block{number}.py"
                script.write_text(code)
                command = [sys.executable, str(script)]
            else:
                lines = [line for line in code.splitlines() if not INSTALL.match(line)]
                for line in [line for line in lines if line.rstrip().split("#")[0].rstrip().endswith("&")]:
                    server_command = line.split("#")[0].rstrip()[:-1]
                    servers.append(
                        subprocess.Popen(["bash", "-c", f"exec {server_command}"], cwd=work, env=environ,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    )  # fmt: skip
                    _wait_for("http://127.0.0.1:8000/health", servers[-1])
                    lines.remove(line)
                command = ["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines)]
            done = subprocess.run(command, cwd=work, env=environ, capture_output=True, text=True, timeout=1800,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
            assert done.returncode == 0, f"README block {number} ({language}) failed:\n{code}\n{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr, f"README block {number}:\n{done.stderr[-3000:]}"
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        hub.stop()
    assert (work / "results.jsonl").read_text().count("\n") == 2
    assert (work / "kiosk" / "edgelm").is_dir() and (work / "models" / "distilgpt2-int8" / "manifest.json").is_file()
