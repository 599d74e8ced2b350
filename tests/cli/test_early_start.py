"""`edgelm generate -m PKG` opens its package and starts its session before click is imported (runtime/cli/early.py):
which command lines start early, which the parsed options take, and that every other end waits for the thread."""

import subprocess
import sys
import textwrap
import threading
import time

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


def test_a_usage_error_after_an_early_start_is_one_message_and_does_not_wait_for_the_thread(tiny_package):
    """The process ends at once, the session still being created with it: nothing waits for the thread."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN), "generate", "-m", str(tiny_package), "--bogus", "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "No such option '--bogus'" in done.stderr
    assert "abandoned" not in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def busy_session(monkeypatch):
    """The session's creation held back a moment, so that a thread not waited for is still running when looked
    at; the threads left running are waited for at the end."""
    import edgelm.runtime.model.session_start as session_start

    real = session_start.create_session

    def create_session(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(session_start, "create_session", create_session)
    yield
    for thread in _threads():
        thread.join()


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_exit_once_the_thread_runs_waits_for_it(tiny_package, busy_session, monkeypatch, error):
    """Interrupted (Ctrl-C) or failed after its thread started, the early start waits for the thread: a Ctrl-C goes
    on up, any other error leaves the command line to the normal path."""

    def interrupted(*args):
        raise error("interrupted")

    monkeypatch.setattr(early, "EarlyStart", interrupted)
    args = ["generate", "-m", str(tiny_package), "Hello"]
    if error is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            early.start(args)
    else:
        assert early.start(args) is None
    assert _threads() == []


def test_an_unexpected_error_opening_the_package_starts_nothing(tiny_package, monkeypatch):
    import edgelm.runtime.store.local as local

    def broken(*args):
        raise ValueError("unexpected")

    monkeypatch.setattr(local, "resolve_package", broken)
    assert early.start(["generate", "-m", str(tiny_package), "Hello"]) is None and _threads() == []


CTRL_C = """
import atexit
import sys
import threading

import edgelm.runtime.model  # load() holds its own resolve_package, not patched
import edgelm.runtime.store.local as local
from edgelm.runtime.cli import early
from edgelm.runtime.cli.launch import command


def raising(*args, **kwargs):
    raise KeyboardInterrupt if where != "unexpected" else ValueError("unexpected")


class Finder:  # the import of click's group and the commands' modules, after the early start returned
    def find_spec(self, name, path=None, target=None):
        if name == "edgelm.runtime.cli.main":
            raising()


where = sys.argv.pop(1)
if where in ("resolve", "unexpected"):
    local.resolve_package = raising
elif where == "started":
    early.EarlyStart = raising
else:
    sys.meta_path.insert(0, Finder())
running = lambda: [t.name for t in threading.enumerate() if t.name == "edgelm-onnxruntime-session"]
atexit.register(lambda: print("running", running(), flush=True))
sys.argv = ["edgelm", *sys.argv[1:]]
command()
"""


@pytest.mark.parametrize("where", ["resolve", "started", "import"])
def test_a_ctrl_c_before_click_runs_says_aborted(tiny_package, where):
    """A Ctrl-C while the package is opened, once its thread runs, or while click's modules are imported: click's
    one line and exit status 1, as for a Ctrl-C while click runs; a thread started by the early start has ended
    before the exit (but where the early start returned: its session then ends with the process)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CTRL_C), where, "generate", "-m", str(tiny_package), "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stderr) == (1, "Aborted!\n")
    if where != "import":
        assert done.stdout == "running []\n"


def test_an_unexpected_error_in_the_early_start_leaves_the_report_to_the_command(tmp_path):
    """The early open fails with an error of no expected type: the command opens the folder itself and says in
    one line why it cannot."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CTRL_C), "unexpected", "generate", "-m", str(tmp_path), "Hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stderr.startswith("Error: ") and "not a model package" in done.stderr
    assert done.stderr.count("\n") == 1


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
