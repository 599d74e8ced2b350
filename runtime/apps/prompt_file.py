"""Files of prompts: every line of a JSON-lines file through one model, one JSON line out per line in.

    job = PromptFile(model, "prompts.jsonl", "results.jsonl", config=model.settings(max_new_tokens=20))
    for step in job.run(batch_size=8):   # a Step per batch written to the output
        ...                              # step.lines finished, step.errors (their line numbers and why)
    job.failed                           # every failed line, from this run and earlier ones

Input lines (blank lines are skipped):
    generate: {"prompt": "text" or [token ids]} or {"messages": [{"role": ..., "content": ...}, ...]}, plus
              any generation option by its GenerationConfig name ("max_new_tokens": 20, "stop": ["\\n"]); a
              sampling option without do_sample turns sampling on, as on the command line
    score:    {"text": "..."} (or "prompt"), plus "top_logprobs": N
    either may carry an "id" of any JSON value; any other key is an error (a misspelt option is not ignored).
Output lines: {"line": N, "id": ..., <the result>, "job": FINGERPRINT}, where the result is a Completion's
fields (generate with one sequence), {"completions": [...]} (several), a Score's fields (score; a log-prob
that does not exist is null), or {"error": "what is wrong and what to do"} for a line that cannot be run.

Resuming: the output is appended to and synced after every batch, so an interruption loses at most the batch
in flight, and a batch that cannot be written whole (a full disk) is cut back off, leaving the lines before it.
Running the same job again skips every line the output already answers (an error record answers its line too:
the same line would fail the same way). `job` fingerprints the input file's bytes, the package and the options.
An existing output is written to only when it is provably this job's: every complete line a result of this
job, and a last line without its newline (cut short by a kill) only after such lines and only as the start of
one; then that last line is dropped. Anything else (another job's results, or a file edgelm did not write:
a config.json, a line of anything) is refused and left as it is (overwrite=True replaces it). A result line
is at most MAX_RESULT_BYTES (a larger result is written as an error record), so reading an output back is
bounded too. Lines are batched in input order; the lines of one batch that share their options run as one
Model.batch call.
"""

import hashlib
import itertools
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import untrusted
from ..errors import PromptError, PromptFileError
from ..generation_config import GenerationConfig
from ..inputs import decode_utf8
from . import output_lock
from .prompt_records import generate_records, score_records

GENERATE, SCORE = "generate", "score"
MAX_LINE_BYTES = 16 << 20  # one input line; longer ones are reported, never read into memory whole
MAX_RESULT_BYTES = 64 << 20  # one output line; a larger result is written as an error record
RESULT_START = b'{"line": '  # how every output line begins


@dataclass
class LineError:
    """An input line that could not be run: its 1-based number, its own id (if it had one) and why."""

    line: int
    message: str
    id: object = None


@dataclass
class Step:
    """One batch written to the output."""

    lines: int  # input lines answered (results and errors)
    errors: list = field(default_factory=list)  # LineError for each line of the batch that failed


class PromptFile:
    """A file of prompts and the output that answers it. Opening one reads the input once (its fingerprint
    and line count) and the output (which lines it answers), repairing a last line cut short; run() does
    the rest. `task` is "generate" (with `config`, model.settings(...)) or "score" (with top_logprobs)."""

    def __init__(
        self,
        model,
        input_path,
        output_path,
        task: str = GENERATE,
        config: GenerationConfig | None = None,
        top_logprobs: int | None = None,
        overwrite: bool = False,
    ):
        if task not in (GENERATE, SCORE):
            raise PromptFileError(f"task must be {GENERATE!r} or {SCORE!r}, got {task!r}")
        self.model, self.task = model, task
        self.input, self.output = Path(input_path), Path(output_path)
        self.config = config if config is not None else model.settings()
        self.top_logprobs = top_logprobs
        _check_paths(self.input, self.output)
        self._input_state = _state(self.input)
        digest, self.total = _fingerprint_input(self.input)
        self.job = _job_id(task, digest, model.package, self.config if task == GENERATE else top_logprobs)
        with _open_output(self.output) as out, _lock(out, self.output):  # a running job's lines are never cut
            if overwrite:
                out.truncate(0)
            self.answered, self.failed = _read_output(self.output, self.job, out)
        self.written = 0  # lines this run wrote

    def run(self, batch_size: int = 8):
        """Answer every line the output does not answer yet, `batch_size` lines at a time; yields a Step after
        each batch is on disk."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise PromptFileError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        with _open_output(self.output) as out, _lock(out, self.output):
            self.answered, self.failed = _read_output(self.output, self.job, out)  # as it is now that it is ours
            pending = []  # (line number, record or the LineError that parsing gave)
            for number, raw in _lines(self.input, lambda: self._check_input()):
                if number in self.answered or (raw is not None and not raw.strip()):
                    continue
                pending.append((number, _parse(number, raw)))
                if len(pending) == batch_size:
                    yield self._answer(pending, out)
                    pending = []
            if pending:
                yield self._answer(pending, out)

    def _check_input(self) -> None:
        if _state(self.input) != self._input_state:
            raise PromptFileError(
                f"{self.input} changed while its lines were being run; the lines answered so far are kept in "
                f"{self.output}. Run the changed file with another --output (or --overwrite), or restore it to resume"
            )

    def _answer(self, pending: list, out) -> Step:
        records = [r for _, r in pending if isinstance(r, dict)]
        answers = iter(
            generate_records(self.model, self.config, records)
            if self.task == GENERATE
            else score_records(self.model, records, self.top_logprobs)
        )
        lines, step = [], Step(len(pending))
        for number, record in pending:
            answer = {"error": record.message} if isinstance(record, LineError) else next(answers)
            ident = record.get("id") if isinstance(record, dict) else None
            head = {"line": number, **({"id": ident} if isinstance(record, dict) and "id" in record else {})}
            line = json.dumps({**head, **answer, "job": self.job}, ensure_ascii=False) + "\n"
            if len(line.encode("utf-8")) > MAX_RESULT_BYTES:  # the resume reads no longer line back
                answer = {"error": f"the result is over {MAX_RESULT_BYTES:,} bytes; ask for fewer tokens or logprobs"}
                line = json.dumps({**head, **answer, "job": self.job}, ensure_ascii=False) + "\n"
            lines.append(line)
            if "error" in answer:
                step.errors.append(LineError(number, answer["error"], ident))
            self.answered.add(number)
        try:
            _append(out, "".join(lines).encode("utf-8"))
        except OSError as error:  # a full disk, a quota: the lines before this batch stay, and they only
            raise PromptFileError(
                f"cannot write {self.output}: {error.strerror or error}; free some space and run the same command "
                "again: it resumes after the lines already written"
            ) from None
        self.written += len(lines)
        self.failed += step.errors
        return step


def _parse(number: int, raw: bytes):
    """A line's JSON object, or the LineError that says what is wrong with it."""
    if raw is None:
        return LineError(number, f"the line is over {MAX_LINE_BYTES:,} bytes; shorten it")
    try:
        record = json.loads(decode_utf8(raw, "the line"))
    except PromptError as error:
        return LineError(number, str(error))
    except ValueError as error:
        return LineError(number, f"the line is not JSON ({str(error)[:120]}); write one object per line")
    if not isinstance(record, dict):
        return LineError(number, f'the line is a JSON {type(record).__name__}, not an object like {{"prompt": "..."}}')
    return record


def _lines(path: Path, check=None):
    """(1-based number, bytes) for each line, None for a line over MAX_LINE_BYTES (skipped, not read whole).
    `check()`, if given, runs before every line is read and at the end (it raises to stop)."""
    with _open_input(path) as source:
        number = 0
        while True:
            if check is not None:
                check()
            raw, taken = untrusted.read_line(source, MAX_LINE_BYTES)
            if not taken:
                return
            number += 1
            yield number, raw


def _open_input(path: Path):
    return untrusted.open_regular(path, PromptFileError, "; give a file of JSON lines with --input")


def _open_output(path: Path):
    """The output, to append to unbuffered (a write that fails leaves nothing to flush at close); never waits."""
    return untrusted.open_append(path, PromptFileError, "; name a file for --output")


def _append(out, data: bytes) -> None:
    """Write `data` whole at the end of `out` and sync it, or leave `out` as it was: a write cut short (a full
    disk, Ctrl-C) is cut back off, so the file never ends in a line this did not finish."""
    start = os.fstat(out.fileno()).st_size  # the lock keeps every other writer out
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(out.fileno(), view) :]
        os.fsync(out.fileno())
    except BaseException:
        try:
            os.ftruncate(out.fileno(), start)  # shrinking needs no space
        except OSError:
            pass
        raise


def _lock(out, path: Path):
    """Hold the output for this job alone while the block runs: two runs appending to one output would answer
    the same lines twice, and an --overwrite would wipe a running job's lines."""
    return output_lock.hold(
        out,
        path,
        PromptFileError(
            f"another run is writing {path}; wait for it to finish (then rerun to resume), or name another --output"
        ),
    )


def _state(path: Path) -> tuple:
    """What says a file changed: its size, modification time and inode."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _check_paths(input_path: Path, output_path: Path) -> None:
    if not untrusted.is_regular(input_path):
        raise PromptFileError(f"{input_path} is not a file; give a file of JSON lines with --input")
    if os.path.lexists(output_path) and not untrusted.is_regular(output_path):
        raise PromptFileError(f"{output_path} is not a regular file; name a file for --output")
    if not output_path.parent.is_dir():
        raise PromptFileError(f"{output_path.parent} does not exist; create it, or name another --output")
    if output_path.exists() and os.path.samefile(input_path, output_path):
        raise PromptFileError(f"--input and --output are the same file ({output_path}); name another --output")


def _fingerprint_input(path: Path) -> tuple[str, int]:
    """(sha256 of the file, number of lines that are not blank)."""
    digest = hashlib.sha256()
    with _open_input(path) as source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest(), sum(raw is None or bool(raw.strip()) for _, raw in _lines(path))


def _job_id(task: str, input_digest: str, package, options) -> str:
    """What an output's lines carry to say which job they answer: input bytes, package and options."""
    if package.manifest is not None and package.model_file.name in package.manifest.files:
        identity = package.manifest.files[package.model_file.name].sha256
    else:
        identity = str(package.folder.resolve())
    options = asdict(options) if isinstance(options, GenerationConfig) else options
    text = json.dumps([task, input_digest, identity, options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_output(path: Path, job: str, out) -> tuple[set, list]:
    """The input lines the output (open as `out`) answers and those it records as failed, once it is proved
    this job's: every complete line a result of `job`, and a last line without its newline (a kill mid-write)
    only after such lines and only as the start of a result; that line is then cut off. Anything else is
    refused, the file left as it is."""
    answered, failed, end = set(), [], 0
    with untrusted.open_regular(path, PromptFileError, "; name a file for --output") as existing:
        for number in itertools.count(1):
            raw, taken = untrusted.read_line(existing, MAX_RESULT_BYTES)
            if not taken:
                break
            if raw is not None and not raw.endswith(b"\n"):
                if number == 1:
                    raise _not_a_result(path, number, "a line without its newline, and no result before it")
                if not RESULT_START.startswith(raw[: len(RESULT_START)]):
                    raise _not_a_result(path, number, "a last line without its newline that does not begin like one")
                break  # cut short: dropped below, and its input line answered again
            record = _result(raw)
            if record is None:
                why = f"over {MAX_RESULT_BYTES:,} bytes" if raw is None else "not a JSON result record"
                raise _not_a_result(path, number, why)
            if record["job"] != job:
                raise PromptFileError(
                    f"{path} answers another job (a different input file, package or options): rerun with the "
                    "same ones to resume it, name another --output, or pass --overwrite to start again"
                )
            answered.add(record["line"])
            if "error" in record:
                failed.append(LineError(record["line"], str(record["error"]), record.get("id")))
            end += taken
    if end != os.fstat(out.fileno()).st_size:
        os.ftruncate(out.fileno(), end)
    return answered, failed


def _result(raw: bytes | None) -> dict | None:
    """The output line `raw` as a result record ({"line": N, ..., "job": ...}), None if it is not one."""
    if raw is None or not raw.startswith(RESULT_START):
        return None
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    line = record.get("line") if isinstance(record, dict) else None
    if isinstance(line, int) and not isinstance(line, bool) and line >= 1 and isinstance(record.get("job"), str):
        return record
    return None


def _not_a_result(path: Path, number: int, why: str) -> PromptFileError:
    return PromptFileError(
        f"line {number} of {path} is not a result of edgelm generate or score --input ({why}), so the file is "
        "left as it is: name another --output, or pass --overwrite to replace the file"
    )
