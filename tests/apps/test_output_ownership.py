"""`generate --input X --output F` writes over nothing it did not write: an existing F is resumed only when it is
provably this job's output (every complete line a result of this job, a last line cut short only after such lines
and only as the start of one), else refused with the --overwrite hint and left byte for byte; a full disk mid-write
is one line, the file keeps its whole lines only, and the rerun finishes it; reading F back is bounded."""

import errno
import io
import json
import os
import tempfile
from pathlib import Path

import edgelm.runtime as rt
import pytest
from edgelm.runtime import untrusted
from edgelm.runtime.apps import prompt_file
from edgelm.runtime.apps.prompt_file import PromptFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prompt_files import GOOD, read_output, run, write_lines

FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def finished(model, tmp_path_factory):
    """(input, its whole output's bytes) of a clean run of GOOD."""
    folder = tmp_path_factory.mktemp("finished")
    source, out = write_lines(folder / "p.jsonl", GOOD), folder / "out.jsonl"
    list(_job(model, source, out).run(batch_size=2))
    return source, out.read_bytes()


def _job(model, source, out, **options):
    return PromptFile(model, source, out, config=model.settings(max_new_tokens=3), **options)


def _refused(model, source, out, match="not a result of edgelm"):
    before = out.read_bytes()
    with pytest.raises(rt.PromptFileError, match=match) as refused:
        _job(model, source, out)
    assert "--overwrite" in str(refused.value)
    assert out.read_bytes() == before  # left byte for byte


@pytest.mark.parametrize(
    "content",
    [
        b'{"user": "admin", "password": "hunter2"}',  # what json.dump writes: one line, no newline
        b"x",  # printf x
        b'{"line": 1, "job": "0123456789abcdef"',  # a result's start, but with no result before it
        b"\n",
        b"notes\n" + b'{"line": 1',
    ],
)
def test_a_file_edgelm_did_not_write_is_refused_not_cut(model, finished, tmp_path, content):
    source, _ = finished
    out = tmp_path / "config.json"
    out.write_bytes(content)
    _refused(model, source, out)
    result = run("generate", "-m", model.package.folder, "--input", source, "--output", out, "--max-new-tokens", 3)
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "--overwrite" in result.output
    assert out.read_bytes() == content


def test_a_cut_line_is_dropped_only_after_this_jobs_lines_and_only_as_a_results_start(model, finished, tmp_path):
    source, whole = finished
    two = whole[: whole.index(b"\n", whole.index(b"\n") + 1) + 1]
    out = tmp_path / "out.jsonl"
    out.write_bytes(two + b"password=hunter2")  # complete lines of this job, then something else
    _refused(model, source, out, match="line 3 of .* does not begin like one")
    out.write_bytes(two + b'{"line": 3, "te')  # a kill mid-write
    assert _job(model, source, out).answered == {1, 2} and out.read_bytes() == two


def test_a_line_over_the_bound_is_refused_and_a_result_over_it_written_as_an_error(model, tmp_path, monkeypatch):
    source, out = write_lines(tmp_path / "p.jsonl", GOOD[:2]), tmp_path / "out.jsonl"
    monkeypatch.setattr(prompt_file, "MAX_RESULT_BYTES", 160)
    list(_job(model, source, out).run())
    written = read_output(out)
    assert [o["line"] for o in written] == [1, 2] and all("over 160 bytes" in o["error"] for o in written)
    assert max(map(len, out.read_bytes().splitlines(keepends=True))) <= 160
    assert _job(model, source, out).answered == {1, 2}  # and it reads them back
    out.write_bytes(b'{"line": 1, "text": "' + b"a" * 400 + b'", "job": "x"}\n')
    _refused(model, source, out, match="over 160 bytes")


class FullDisk:
    """os, except that the output's writes fail with ENOSPC after `whole` of them, the first failing one after
    writing half its bytes (what a disk filling up mid-write does)."""

    def __init__(self, whole: int):
        self.whole, self.calls = whole, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        self.calls += 1
        if self.calls <= self.whole:
            return os.write(fd, data)
        if self.calls == self.whole + 1:
            return os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("whole", [0, 1])  # the first batch, a later one
def test_a_full_disk_mid_write_is_one_line_keeps_whole_lines_and_resumes(model, finished, tmp_path, monkeypatch, whole):
    source, clean = finished
    out = tmp_path / "out.jsonl"
    args = ("generate", "-m", model.package.folder, "--input", source, "--output", out, "--max-new-tokens", 3)
    monkeypatch.setattr(prompt_file, "os", FullDisk(whole))
    result = run(*args, "--batch-size", 2)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "No space left on device" in result.output and "Traceback" not in result.output
    assert result.output.count("\n") == 1
    lines = out.read_bytes()
    assert lines == clean[: len(lines)] and (not lines or lines.endswith(b"\n"))  # nothing cut, nothing lost
    assert len(lines.splitlines()) == 2 * whole
    monkeypatch.setattr(prompt_file, "os", os)
    assert run(*args, "--batch-size", 2).exit_code == 0
    assert out.read_bytes() == clean


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("where", ["fifo", "link to a fifo", "device"])
def test_a_fifo_or_a_device_at_the_output_is_refused_without_waiting(model, finished, tmp_path, where):
    source, _ = finished
    out = tmp_path / "out.jsonl"
    if where == "device":
        out.symlink_to(os.devnull)
    else:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        (out.symlink_to(fifo) if where == "link to a fifo" else os.replace(fifo, out))
    with pytest.raises(rt.PromptFileError, match="not a regular file"):
        _job(model, source, out)


def test_reading_a_line_never_holds_more_than_its_bound():
    class Counted(io.BytesIO):
        largest = 0

        def readline(self, size=-1):
            line = super().readline(size)
            Counted.largest = max(Counted.largest, len(line))
            return line

    source = Counted(b"short\n" + b"x" * 5_000_000 + b"\nafter\n")
    assert untrusted.read_line(source, 100) == (b"short\n", 6)
    assert untrusted.read_line(source, 100) == (None, 5_000_001)  # skipped to its end, never held whole
    assert Counted.largest <= max(101, untrusted.SKIP)
    assert untrusted.read_line(source, 100) == (b"after\n", 6)
    assert untrusted.read_line(source, 100) == (b"", 0)


RESULT_LIKE = st.fixed_dictionaries(
    {"line": st.one_of(st.integers(-2, 10), st.booleans(), st.text(max_size=3))},
    optional={"job": st.one_of(st.text(max_size=16), st.integers()), "text": st.text(max_size=20)},
)


@FUZZ
@given(
    lines=st.lists(
        st.one_of(st.binary(max_size=60), RESULT_LIKE.map(lambda r: json.dumps(r).encode())), min_size=1, max_size=4
    ),
    newline_at_end=st.booleans(),
)
def test_random_files_in_place_of_the_output_are_never_changed(model, finished, lines, newline_at_end):
    """Whatever bytes stand at the output, a resume either refuses them, leaving them byte for byte, or (for this
    job's own lines only, which random files are not) resumes them."""
    source, _ = finished
    content = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    if not content:
        return
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out.jsonl"
        out.write_bytes(content)
        with pytest.raises(rt.PromptFileError):
            _job(model, source, out)
        assert out.read_bytes() == content


@FUZZ
@given(tail=st.binary(max_size=40))
def test_after_this_jobs_lines_only_a_results_start_is_cut(model, finished, tail):
    """This job's whole lines, then any bytes without a newline: dropped when they begin like a result (what a kill
    leaves), else the file is refused and left; this job's lines are never lost either way."""
    source, whole = finished
    if not tail or b"\n" in tail:
        return
    two = whole[: whole.index(b"\n", whole.index(b"\n") + 1) + 1]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out.jsonl"
        out.write_bytes(two + tail)
        if prompt_file.RESULT_START.startswith(tail[: len(prompt_file.RESULT_START)]):
            assert _job(model, source, out).answered == {1, 2}
            assert out.read_bytes() == two
        else:
            with pytest.raises(rt.PromptFileError, match="--overwrite"):
                _job(model, source, out)
            assert out.read_bytes() == two + tail
