"""Where PyInstaller finds edgelm's hook: pyproject.toml names get_hook_dirs as the `pyinstaller40` entry point,
so an app that imports edgelm.runtime freezes with no option of its own."""

import os


def get_hook_dirs() -> list[str]:
    return [os.path.dirname(__file__)]
