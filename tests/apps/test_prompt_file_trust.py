"""Nothing a user wrote is lost by a prompt-file run: --overwrite waits for the lock before it empties the
output, the lock holds on systems without fcntl (the portable lock file, forced by these tests), a full disk is one
line saying the rerun repairs it, and an input edited while its run goes stops the run."""

import errno
import os
import subprocess
import sys

import edgelm.runtime as rt
import pytest
from edgelm.runtime.apps import output_lock, prompt_file
from edgelm.runtime.apps.prompt_file import PromptFile
from prompt_files import GOOD, read_output, run, write_lines


def _job(model, source, out, **options):
    return PromptFile(model, source, out, config=model.settings(max_new_tokens=3), **options)


@pytest.fixture(params=["system", "file"])
def lock_kind(request, monkeypatch):
    """The system's lock (flock on Linux), and the portable lock file that systems without one get."""
    monkeypatch.setattr(output_lock, "LOCKS", [] if request.param == "system" else ["file"])
    return request.param


def test_overwrite_waits_for_the_lock_and_leaves_a_running_jobs_lines(model, tmp_path, lock_kind):
    source, out = write_lines(tmp_path / "p.jsonl", GOOD), tmp_path / "out.jsonl"
    running = _job(model, source, out).run(batch_size=2)
    next(running)  # holds the output, two lines written
    with pytest.raises(rt.PromptFileError, match="another run is writing"):
        _job(model, source, out, overwrite=True)
    assert [o["line"] for o in read_output(out)] == [1, 2]
    list(running)
    assert [o["line"] for o in read_output(out)] == [1, 2, 3, 4, 5]
    assert _job(model, source, out, overwrite=True).answered == set()  # free now: it does replace the file
    assert not (tmp_path / "out.jsonl.lock").exists()


def test_the_lock_file_of_a_killed_run_is_taken_over(model, tmp_path, monkeypatch):
    monkeypatch.setattr(output_lock, "LOCKS", ["file"])
    source, out = write_lines(tmp_path / "p.jsonl", GOOD), tmp_path / "out.jsonl"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "out.jsonl.lock").write_text(gone.stdout.strip())  # a pid no process has any more
    list(_job(model, source, out).run())
    assert [o["line"] for o in read_output(out)] == [1, 2, 3, 4, 5]
    (tmp_path / "out.jsonl.lock").write_text(str(os.getpid()))  # a live run's
    with pytest.raises(rt.PromptFileError, match="another run is writing"):
        _job(model, source, out)


def test_a_full_disk_is_one_line_and_the_rerun_repairs_the_output(model, tiny_package, tmp_path, monkeypatch):
    source, out = write_lines(tmp_path / "p.jsonl", GOOD), tmp_path / "out.jsonl"
    real_fsync, calls = os.fsync, []

    def full(fd):
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(prompt_file.os, "fsync", full)
    args = [
        "generate",
        "-m",
        tiny_package,
        "--input",
        source,
        "--output",
        out,
        "--max-new-tokens",
        3,
        "--batch-size",
        2,
    ]
    result = run(*args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "No space left on device" in result.output and "resumes" in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    monkeypatch.setattr(prompt_file.os, "fsync", real_fsync)
    assert run(*args).exit_code == 0
    assert [o["line"] for o in read_output(out)] == [1, 2, 3, 4, 5]


def test_an_input_edited_while_its_run_goes_stops_the_run(model, tmp_path):
    source, out = write_lines(tmp_path / "p.jsonl", GOOD), tmp_path / "out.jsonl"
    running = _job(model, source, out).run(batch_size=2)
    next(running)
    with open(source, "ab") as edit:
        edit.write(b'{"prompt": "added later"}\n')
    with pytest.raises(rt.PromptFileError, match="changed while its lines were being run"):
        list(running)
    assert [o["line"] for o in read_output(out)] == [1, 2]  # what was answered is kept
