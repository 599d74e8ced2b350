"""The export's stages as its caller sees them: their names in order, each stage's reports to the caller's
`progress(stage, event, detail)` callback (event "start", "step" within a long stage, "done"), its seconds, and
a failure the stage did not foresee as one StageError naming the stage and what to do (export/stages.py runs them).
"""

import time
from contextlib import contextmanager
from typing import Callable

from edgelm.runtime.errors import EdgelmError, install_hint

from .errors import StageError

STAGES = ("load", "export", "optimize", "quantize", "validate", "save")  # "cache" follows with a system prompt
# What to do when a stage fails in a way it did not foresee (StageError).
REPORT = "please report it with the checkpoint's config.json and the command"
ADVICE = {
    "load": "check that it is a complete Hugging Face checkpoint (config.json, the weights, the tokenizer), or "
    + REPORT,
    "export": REPORT,
    "optimize": REPORT,
    "quantize": REPORT + "; another --quantize recipe or --int4-* option may export",
    "validate": REPORT + "; --no-validate writes the package without this comparison",
    "save": "check the output folder's disk space and permissions and export again, or " + REPORT,
    "cache": "the package is in place without its prompt cache; " + REPORT,
}


class Progress:
    """The stages' reports to the caller's `progress(stage, event, detail)`, each stage's seconds, and the stage
    under way (the one a failure names)."""

    def __init__(self, report: Callable[[str, str, str], None] | None):
        self.report = report or (lambda stage, event, detail: None)
        self.timings, self.current, self._started = {}, STAGES[0], 0.0

    def start(self, stage: str, detail: str = "") -> None:
        self.current, self._started = stage, time.perf_counter()
        self.report(stage, "start", detail)

    def step(self, detail: str) -> None:
        """Where a long stage is within itself (a validation case, a part of the quality report)."""
        self.report(self.current, "step", detail)

    def done(self, detail: str = "") -> None:
        self.timings[self.current] = round(time.perf_counter() - self._started, 3)
        self.report(self.current, "done", detail)

    @contextmanager
    def failures(self):
        """Any failure a stage did not foresee, as one StageError naming that stage; typed errors pass as they are."""
        try:
            yield
        except EdgelmError:
            raise
        except ImportError as error:  # a library of the export extra missing or broken
            raise StageError(
                self.current, f"the {self.current} stage needs {error.name or 'a library'}, which cannot be imported "
                f"({' '.join(str(error).split())[:200]}): install the export extra, {install_hint('export')}."
            ) from None
        except MemoryError:
            raise StageError(
                self.current, f"the {self.current} stage ran out of memory: close other programs, or export on a "
                "machine with more memory."
            ) from None
        except Exception as error:
            cause = " ".join(f"{type(error).__name__}: {error}".split())  # one line: onnxruntime's span several
            cause = cause if len(cause) <= 300 else cause[:297] + "..."
            raise StageError(
                self.current, f"the {self.current} stage failed ({cause}); {ADVICE[self.current]}."
            ) from error
