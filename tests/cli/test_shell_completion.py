"""Shell completion, as docs/install.md tells a user to turn it on: click's own, through the installed command."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EDGELM = Path(sys.executable).parent / "edgelm"


@pytest.mark.parametrize(
    "words, expected", [("edgelm gen", "plain,generate"), ("edgelm generate --max-n", "plain,--max-new-tokens")]
)
def test_the_installed_command_completes_commands_and_options(words, expected):
    environ = os.environ | {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
    done = subprocess.run(
        [str(EDGELM)], env=environ | {"_EDGELM_COMPLETE": "bash_complete"}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.split() == [expected], done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_documented_shell_gets_a_script(shell):
    done = subprocess.run(
        [str(EDGELM)], env=os.environ | {"_EDGELM_COMPLETE": f"{shell}_source"}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "_EDGELM_COMPLETE" in done.stdout
    assert f'_EDGELM_COMPLETE={shell}_source edgelm' in (Path(__file__).parents[2] / "docs" / "install.md").read_text()
