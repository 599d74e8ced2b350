"""`edgelm generate -m NAME_OR_PATH ...` opens its package and starts creating its onnxruntime session before
click and the command's own modules are imported (launch.py), so that those imports, like the Model's in load(),
run while onnxruntime creates the session on the other core (benchmarks/NOTES.md, "Start:" rows).

The command line is read without parsing it (click is not imported yet), and only in the plain case: -m given,
and none of PLAIN_ONLY. The package is opened, checked (manifest, checksums, graph scan) and its session started
by load()'s own function (model.session_start.open_and_start). What click then parses decides: generate takes the
start where its options ask for that package with load()'s defaults (load_model), and otherwise the thread is
waited for and its session dropped (EarlyStart.abandon). A command that ends before it loads anything (a usage
error) ends the process at once, the thread with it (launch.py)."""

COMMAND = "generate"
MODEL_OPTIONS = ("-m", "--model")  # options.py's package option
# options that change what generate loads: a command line with any of them is left to click and load()
PLAIN_ONLY = ("--device", "--threads", "--verify", "--no-verify", "--draft-model", "-h", "--help")


class EarlyStart:
    """A package opened (at `folder`) and its session's thread started with load()'s defaults, before the command's
    options were parsed."""

    def __init__(self, folder, package, session_start):
        self.folder, self.package, self.session_start = folder, package, session_start

    def abandon(self) -> None:
        """Wait for the session's thread and drop what it made; nothing once the model took it."""
        self.session_start.abandon()


def model_argument(args: list[str]) -> str | None:
    """The value of the last -m/--model among `args` (a command line after the program's name), read as click
    reads it, up to a `--`; None where none is given."""
    given = None
    for i, arg in enumerate(args[1:], 1):
        if arg == "--":
            break
        if arg in MODEL_OPTIONS and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith("--model="):
            given = arg.partition("=")[2]
        elif arg.startswith("-m") and not arg.startswith("--") and len(arg) > 2:
            given = arg[2:]
    return given


def start(args: list[str]) -> EarlyStart | None:
    """The early start of `edgelm generate` for the command line `args` (after the program's name), or None where
    it is not the plain case or the start fails in any way (the command then says why, once click parsed it). A
    thread it started is waited for on every exit but its return: a Ctrl-C (KeyboardInterrupt) goes on up."""
    if not args or args[0] != COMMAND:
        return None
    options = args[1 : args.index("--")] if "--" in args else args[1:]
    given = model_argument(args)
    if given is None or any(arg.partition("=")[0] in PLAIN_ONLY for arg in options):
        return None
    session_start = None
    try:
        from ..model.session_start import open_and_start
        from ..store.local import resolve_package

        folder = resolve_package(given)
        package, session_start = open_and_start(folder, True, "auto", None, True)
        return EarlyStart(folder, package, session_start)
    except BaseException as error:
        if session_start is not None:
            session_start.abandon()
        if isinstance(error, Exception):  # the normal path meets it again and reports it, once click parsed the line
            return None
        raise


def load_model(early: EarlyStart | None, package, device: str, threads, verify, draft):
    """generate's model: the early start's where the parsed options ask for what it started, else load()'s (the
    early start's thread waited for and its session dropped first)."""
    from ..model import load, model_of
    from ..store.local import resolve_package

    if early is not None:
        try:
            plain = (device, threads, verify, draft) == ("auto", None, True, None)
            if plain and package is not None and resolve_package(package) == early.folder:
                return model_of(early.package, early.session_start)
        finally:
            early.abandon()  # nothing to wait for once model_of returned or raised
    return load(package, device=device, threads=threads, verify=verify, draft=draft)
