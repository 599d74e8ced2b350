"""Errors only the export side raises. They subclass the runtime's EdgelmError, so the CLI's one catch turns
them into one clean line and a non-zero exit like every other edgelm error."""

from edgelm.runtime.errors import EdgelmError


class ExportError(EdgelmError):
    """The export stage could not turn a checkpoint into a package."""


class ParityError(ExportError):
    """The exported graph does not match the PyTorch reference closely enough; nothing was written."""


class StageError(ExportError):
    """A stage failed in a way it did not foresee (an onnxruntime or a library error): the message names the stage
    and what to do; the original error is its __cause__."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage
