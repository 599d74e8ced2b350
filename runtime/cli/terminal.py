"""What the CLI prints of text it did not write: names, paths, manifest fields and error messages come from
packages, archives, hubs and file names, so a control sequence in one (an OSC 52 clipboard write, a cursor move,
a title change) must not reach the terminal. Every command prints such text through this module's `echo`, and the group
passes every error message through `clean` (main.py), so this is the one place the rule lives. A model's own
output is cleaned too when it goes to a terminal (`generated`)."""

import re

import click

# ESC-introduced sequences (CSI "ESC [ ... final", OSC/DCS/APC/PM/SOS "ESC ] ... BEL or ST", two-byte escapes),
# their 8-bit C1 forms (U+009B CSI, U+009D OSC, ...), then any other C0/C1 control or DEL. Bidirectional
# overrides are dropped too: they reorder what a reader sees without being printed themselves.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI: parameters, intermediates, final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (ESC c, ESC ( B, ...)
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text, keep_newlines: bool = True) -> str:
    """`text` with every terminal control sequence and control character removed; tabs are kept, and newlines
    unless keep_newlines is False (then each becomes a space, for a value that must stay on one line)."""
    text = _CONTROLS.sub("", _SEQUENCES.sub("", str(text)))
    return text if keep_newlines else text.replace("\n", " ")


def generated(text: str, stream=None) -> str:
    """A model's output as the CLI prints it: cleaned when it goes to a terminal (a package's model can be made to
    write control sequences as well as any string of a package), as it is when piped to a file or a program, which
    get exactly what the model wrote. Tabs and newlines stay either way."""
    import sys

    out = stream if stream is not None else sys.stdout
    return clean(text) if getattr(out, "isatty", lambda: False)() else text


def echo(text="", **kwargs) -> None:
    """click.echo of text that holds untrusted parts, cleaned first."""
    click.echo(clean(text), **kwargs)
