"""`edgelm generate -m PKG` opens its package and starts its session before click is imported (runtime/cli/early.py):
which command lines start early, which the parsed options take, and that every other end waits for the thread."""

import subprocess
import sys
import textwrap
import threading

import pytest
from edgelm.runtime.cli import early

SESSION_THREAD = "edgelm-onnxruntime-session"


def _threads() -> list:
    return [t for t in threading.enumerate() if t.name == SESSION_THREAD]


@pytest.mark.parametrize(
    ("args", "given"),
    [
        (["generate", "-m", "a", "Hello"], "a"),
        (["generate", "--model", "a", "-m", "b"], "b"),  # the last one, as click takes it
        (["generate", "--model=a", "Hello"], "a"),
        (["generate", "-ma", "Hello"], "a"),
        (["generate", "Hello", "--", "-m", "a"], None),  # after --, the prompt's
        (["generate", "Hello", "-m"], None),
    ],
)
def test_the_model_argument_is_read_as_click_reads_it(args, given):
    assert early.model_argument(args) == given


@pytest.mark.parametrize(
    "args",
    [
        ["score", "-m", "PKG", "Hello"],  # generate only
        ["generate", "Hello"],  # no -m: the default package, and a prompt that may name one, are click's to decide
        ["generate", "-m", "PKG", "--device", "cpu", "Hello"],
        ["generate", "-m", "PKG", "--threads=1", "Hello"],
        ["generate", "-m", "PKG", "--no-verify", "Hello"],
        ["generate", "-m", "PKG", "--verify", "Hello"],
        ["generate", "-m", "PKG", "--draft-model", "PKG", "Hello"],
        ["generate", "-m", "PKG", "--help"],
    ],
)
def test_only_the_plain_generate_starts_early(tiny_package, args):
    args = [str(tiny_package) if a == "PKG" else a for a in args]
    assert early.start(args) is None and _threads() == []


def test_a_package_that_cannot_be_opened_starts_nothing(tiny_package, tmp_path):
    assert early.start(["generate", "-m", str(tmp_path / "none"), "Hello"]) is None
    assert _threads() == []


def test_the_parsed_options_take_the_early_start_where_they_ask_for_it(tiny_package):
    started = early.start(["generate", "-m", str(tiny_package), "Hello"])
    assert started is not None
    model = early.load_model(started, str(tiny_package), "auto", None, True, None)
    assert model.package is started.package  # opened once
    assert model.generate("Hello", max_new_tokens=1).completion_tokens == 1
    assert _threads() == []


@pytest.mark.parametrize(
    ("device", "threads", "verify"), [("cpu", None, True), ("auto", 1, True), ("auto", None, "full")]
)
def test_other_options_drop_the_early_start_and_load_as_asked(tiny_package, device, threads, verify):
    started = early.start(["generate", "-m", str(tiny_package), "Hello"])
    model = early.load_model(started, str(tiny_package), device, threads, verify, None)
    assert model.package is not started.package and model.device == "cpu"
    assert started.session_start.made == {} and _threads() == []


def test_another_package_drops_the_early_start(tiny_package, tiny_package_int8):
    """A guess that is not what click parsed (`--stop -mOTHER`: a stop string) is dropped, its thread ended."""
    started = early.start(["generate", "-m", str(tiny_package), "--stop", f"-m{tiny_package_int8}", "Hello"])
    assert started.folder.name == tiny_package_int8.name
    model = early.load_model(started, str(tiny_package), "auto", None, True, None)
    assert model.package.folder.name == tiny_package.name and _threads() == []


RUN = """
import sys
from edgelm.runtime.cli import early
from edgelm.runtime.cli.launch import command

abandon = early.EarlyStart.abandon

def noted(self):
    print("abandoned", file=sys.stderr, flush=True)
    abandon(self)

early.EarlyStart.abandon = noted
sys.argv = ["edgelm", *sys.argv[1:]]
command()
"""


def test_a_usage_error_after_an_early_start_is_one_message_and_waits_for_the_thread(tiny_package):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN), "generate", "-m", str(tiny_package), "--bogus", "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "No such option '--bogus'" in done.stderr
    assert "abandoned" in done.stderr and "Traceback" not in done.stderr


def test_generate_from_an_early_start_prints_the_same_tokens(tiny_package):
    def generate(*options):
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RUN), "generate", "-m", str(tiny_package), *options, "Hello",
             "--max-new-tokens", "4"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert generate() == generate("--device", "cpu")  # the second loads through load(): no early start
