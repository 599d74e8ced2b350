"""Files of prompts as the prompt-file tests write and read them, and the CLI they run."""

import json

from click.testing import CliRunner
from edgelm.runtime.cli.main import main

GOOD = [
    {"prompt": "The quick brown", "id": "first"},
    {"prompt": "Hello", "max_new_tokens": 3},
    {"prompt": "Once upon a time", "id": 7},
    {"prompt": [5, 6, 7]},
    {"prompt": "A third"},
]


def write_lines(path, lines):
    path.write_bytes(
        b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)
    )
    return path


def read_output(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])
