"""Errors only the export side raises. They subclass the runtime's EdgelmError, so the CLI's one catch turns
them into one clean line and a non-zero exit like every other edgelm error."""

from edgelm.runtime.errors import EdgelmError


class ExportError(EdgelmError):
    """The export stage could not turn a checkpoint into a package."""


class ParityError(ExportError):
    """The exported graph does not match the PyTorch reference closely enough; nothing was written."""
