"""Every error edgelm raises on purpose: one small family, each message says what to do next.

The library never prints and never exits; the CLI turns these into one clean line and a non-zero code.
"""


class EdgelmError(Exception):
    """Base of every error edgelm raises for a user to act on."""


class PackageError(EdgelmError):
    """A model package is missing, incomplete, tampered with, or of a format this runtime cannot read."""


class DeviceError(EdgelmError):
    """The requested execution device (for example CUDA) is not available here."""


class InferenceError(EdgelmError):
    """onnxruntime failed while running a loaded graph (a damaged weight, an operator this onnxruntime lacks)."""


class GenerationOptionError(EdgelmError, ValueError):
    """A generation option is out of range, of the wrong type, or unknown. `param` names the option (the
    server reports it as the error's `param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptError(EdgelmError, ValueError):
    """A prompt cannot be run: too long for the context, not valid UTF-8, or token ids out of range."""


class PromptFileError(EdgelmError):
    """A file of prompts cannot be run as asked: the input is not a readable file, or the output holds
    something other than this job's results (another input, package or options)."""


class DeadlineError(EdgelmError):
    """Work ran past the deadline its caller set (the server's --request-timeout): rendering a chat template,
    a download."""


class SessionError(EdgelmError):
    """A saved conversation (Model.save_session, `edgelm chat --session`) cannot be resumed or written: the file
    is another package's, altered, truncated, too large or not a regular file, or its folder is not writable."""


class StoreError(EdgelmError):
    """The model store cannot do what was asked: an unknown or invalid name, a name already taken, a download
    that failed, or a full disk. The store is left as it was."""


class ChatError(EdgelmError, ValueError):
    """A conversation cannot be turned into a prompt: malformed messages, or a chat template that fails to
    render them. `param` names the field at fault ("messages[2].content"), or is None when the package's
    template itself is at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QualityError(EdgelmError, ValueError):
    """A package's quality cannot be measured as asked: the evaluation text is missing, empty, binary, too large
    or too short, or the reference is not the float32 package of the same architecture and vocabulary."""


def install_hint(extra: str) -> str:
    """How to add what pyproject's optional `extra` holds, in words that work where edgelm runs: in an app frozen by
    `edgelm bundle`, build the bundle again; else `pip install` of the extra's own requirements, read from edgelm's
    installed metadata (edgelm installs from a checkout, so `pip install 'edgelm[extra]'` would ask PyPI for
    another project's package)."""
    import sys
    from importlib import metadata

    try:
        marker = f'extra == "{extra}"'
        wanted = [r.split(";")[0].strip() for r in metadata.requires("edgelm") or () if marker in r]
    except metadata.PackageNotFoundError:
        wanted = []
    what = " ".join(f"'{r}'" for r in wanted) or f"the {extra} extra"
    if getattr(sys, "frozen", False):
        return f"this edgelm was frozen without it: build the bundle again where {what} is installed"
    return f"pip install {what}"
