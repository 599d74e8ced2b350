"""Text the CLI did not write (a manifest's name and source, an archive's path, an error quoting them) reaches the
terminal without its control sequences: an OSC 52 clipboard write, a title change or a cursor move in a package
prints as the plain text around it."""

import io
import json
import os
import pty
import shutil
import subprocess
import sys

import pytest
from edgelm.runtime.cli.terminal import clean, generated
from store_support import invoke, make_store

OSC52 = "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # "put 'echo owned' on the clipboard"
HOSTILE = [OSC52, "\x1b]0;title\x1b\\", "\x1b[2J\x1b[H", "\x9b31m", "\x9d8;;http://x\x9c", "\r\x08\x7f", "\u202e"]


@pytest.mark.parametrize("sequence", HOSTILE, ids=["osc52", "osc-st", "csi", "c1-csi", "c1-osc", "c0", "bidi"])
def test_clean_removes_the_sequence_and_keeps_the_text(sequence):
    assert clean(f"a{sequence}b\tc\nd") == "ab\tc\nd"
    assert clean(f"a{sequence}b\nc", keep_newlines=False) == "ab c"


def test_clean_keeps_ordinary_text():
    text = "models/distilgpt2  (float32, 1.2 MB) — ünïcode ✓ 中文"
    assert clean(text) == text


def _hostile_package(tiny_package, tmp_path):
    folder = shutil.copytree(tiny_package, tmp_path / f"pkg{OSC52}")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["name"] = f"tiny{OSC52}"
    manifest["source"] = {**manifest.get("source", {}), "hub_id": f"owner/repo{OSC52}"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_info_prints_no_control_sequence(tiny_package, tmp_path):
    folder = _hostile_package(tiny_package, tmp_path)
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    assert "tiny" in result.output and "\x1b" not in result.output and "\x07" not in result.output


def test_an_error_quoting_a_hostile_path_prints_no_control_sequence(tmp_path):
    result = invoke("info", tmp_path / f"missing{OSC52}")
    assert result.exit_code == 1 and "missing" in result.output and "\x1b" not in result.output


def test_list_prints_no_control_sequence(tiny_package, tmp_path, monkeypatch):
    make_store(tmp_path, monkeypatch)
    archive = tmp_path / f"a{OSC52}.zip"
    assert invoke("pack", tiny_package, "-o", archive).exit_code == 0
    installed = invoke("install", archive, "--name", "tiny")
    assert installed.exit_code == 0, installed.output
    assert "\x1b" not in installed.output
    result = invoke("list")
    assert result.exit_code == 0 and "tiny" in result.output
    assert "\x1b" not in result.output and "\x07" not in result.output


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_models_output_is_cleaned_for_a_terminal_and_exact_when_piped():
    hostile = "ok\x1b]52;c;cGF5bG9hZA==\x07 then\ttab\nline"
    assert generated(hostile, _Terminal()) == "ok then\ttab\nline"
    assert generated(hostile, io.StringIO()) == hostile  # a file or a pipe gets what the model wrote


def test_generate_on_a_terminal_prints_no_control_sequence_the_model_was_made_to_write(tiny_package):
    """A regex constraint makes the random model write an OSC title change; on a pseudo-terminal it is dropped."""
    main_fd, child_fd = pty.openpty()
    command = [sys.executable, "-m", "edgelm.runtime.cli", "generate", "-m", str(tiny_package)]
    done = subprocess.run(
        [*command, "--regex", "\\x1b\\]0;pwned\\x07", "--max-new-tokens", "20", "Hi"],
        stdin=subprocess.DEVNULL,
        stdout=child_fd,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    os.close(child_fd)
    shown = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the terminal's other end is closed: all of it is read
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_fd)
    assert done.returncode == 0, done.stderr
    assert b"0;pwned" in shown and b"\x1b" not in shown and b"\x07" not in shown
