"""`edgelm chat`'s commands: a line that starts with `/` and a command's name is said to edgelm, not the model.

    /help           these lines
    /reset          forget the conversation (the system message stays)
    /system TEXT    set the system message (no TEXT: remove it)
    /save FILE      write the conversation to FILE (JSON); refuses a file edgelm did not write
    /load FILE      continue the conversation saved in FILE

`//text` sends `/text` to the model. A conversation file is {"edgelm_chat": 1, "messages": [...]}: the marker is
how /save knows a file it may replace, and /load a file it may read.
"""

import json
from pathlib import Path

from ..batching.prefix_store import replace_atomically
from ..errors import PromptError
from ..untrusted import read_bytes

HELP = __doc__.split("\n\n")[1].rstrip()
MARKER = "edgelm_chat"
MAX_FILE = 8 << 20  # bytes of a conversation file /load reads
ROLES = ("system", "user", "assistant")


def is_command(line: str) -> bool:
    """Whether `line` is for edgelm: `/name` or `/name ...` (not `//`, which sends a line that starts with `/`)."""
    return line.startswith("/") and not line.startswith("//")


def run_command(line: str, history: list) -> tuple[list, str]:
    """Carry out the command `line` on the conversation `history`: the new history and what to tell the user.
    A command that cannot be carried out raises PromptError, leaving the history as it was."""
    name, _, argument = line[1:].partition(" ")
    argument = argument.strip()
    system = [m for m in history[:1] if m["role"] == "system"]
    if name == "help":
        return history, HELP
    if name == "reset":
        return system, "The conversation is forgotten" + (" (the system message stays)." if system else ".")
    if name == "system":
        rest = history[len(system) :]
        if not argument:
            return rest, "No system message."
        return [{"role": "system", "content": argument}, *rest], "The system message is set."
    if name == "save":
        save(_path(argument, "/save"), history)
        return history, f"Saved {len(history)} messages to {argument}."
    if name == "load":
        loaded = load(_path(argument, "/load"))
        return loaded, f"Loaded {len(loaded)} messages from {argument}."
    raise PromptError(f"unknown command /{name}: /help lists them; start a line with // to send it with a /.")


def save(path: Path, history: list) -> None:
    """Write the conversation to `path`, which must be new or a conversation file (never another file)."""
    if path.is_symlink() or (path.exists() and not _is_conversation(path)):
        raise PromptError(f"{path} exists and is not a conversation edgelm saved: choose another file.")
    text = json.dumps({MARKER: 1, "messages": history}, ensure_ascii=False, indent=1)
    try:
        replace_atomically(path, text.encode("utf-8"))
    except OSError as error:
        raise PromptError(f"could not save to {path}: {error.strerror or error}.") from None


def load(path: Path) -> list:
    """The messages of a conversation file, checked: a list of {"role", "content"} with text content."""
    document = _read(path)
    messages = document.get("messages") if isinstance(document, dict) and document.get(MARKER) == 1 else None
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) and len(m) == 2
        for m in messages
    ):
        raise PromptError(f"{path} is not a conversation edgelm saved (/save FILE writes one).")
    if any(m["role"] == "system" for m in messages[1:]):
        raise PromptError(f"{path} has a system message after the first: not a conversation edgelm saved.")
    return messages


def _read(path: Path):
    # a regular file only, opened without waiting (a FIFO swapped in after a check would block a plain open)
    data = read_bytes(path, MAX_FILE, PromptError, ".", what="a conversation edgelm saved")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise PromptError(f"could not read {path}: {error}.") from None


def _is_conversation(path: Path) -> bool:
    try:
        document = _read(path)
    except PromptError:
        return False
    return isinstance(document, dict) and document.get(MARKER) == 1


def _path(argument: str, command: str) -> Path:
    if not argument:
        raise PromptError(f"{command} needs a file name: {command} FILE.")
    return Path(argument).expanduser()
