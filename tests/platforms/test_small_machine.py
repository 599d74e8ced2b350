"""A distilgpt2-shaped int8 package generates, chats and serves inside a 512 MB memory cgroup, as on a board
with 512 MB of RAM (tools/ci/memory_limit.py runs the commands and reads the cgroup's peak; the package's page
cache is charged to it too). Slow tier: it exports the 89 MB package; it needs root, to make the cgroup."""

import os

import pytest

LIMIT = 512 << 20


@pytest.fixture(scope="module")
def distilgpt2_int8(shared_folder, tmp_path_factory):
    if not (shared_folder / "distilgpt2-config.json").exists():
        pytest.skip(f"needs {shared_folder}/distilgpt2-config.json and gpt2-tokenizer (../shared is absent)")
    from distilgpt2_checkpoint import build
    from edgelm.export.stages import export_model

    checkpoint = build(tmp_path_factory.mktemp("distilgpt2") / "ckpt", shared_folder)
    folder = tmp_path_factory.mktemp("pkg") / "distilgpt2-int8"
    return export_model(str(checkpoint), folder, quantize="int8", validate=False).path


@pytest.mark.slow
@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_the_int8_package_runs_in_512_mb(distilgpt2_int8, command):
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root (CI runs as root)")
    from memory_limit import run_limited

    result = run_limited(command, distilgpt2_int8, LIMIT)
    assert not result["oom_killed"], f"{command} was killed at 512 MB: {result['output']}"
    assert result["ok"], result["output"]
    assert result["peak_mb"] < 512
