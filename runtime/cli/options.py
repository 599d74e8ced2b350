"""The one way every `edgelm` command names its package: `-m/--model NAME_OR_PATH`.

NAME_OR_PATH is a package folder or the name of an installed package (`edgelm list`); store.resolve_package turns
it, or its absence, into a folder, the same way for every command and for load(). Commands whose only argument
is the package (info, verify, bench, serve, pack) take it as that argument too; generate's argument is the prompt,
so there the package is given with -m only. Every command that loads one takes --device the same way too.
"""

import functools

import click

from ..generation_options import OPTIONS

HELP = (
    "The package: an installed name (edgelm list) or a package folder. Default: the one set with edgelm default, "
    "else the only installed package, else models/distilgpt2."
)


def package_option(command):
    """Add -m/--model, passed to the command as `package` (None when not given)."""
    return click.option("-m", "--model", "package", metavar="NAME_OR_PATH", default=None, help=HELP)(command)


def package_option_or_argument(command):
    """Add -m/--model and an optional NAME_OR_PATH argument meaning the same; the command gets one `package`."""

    @functools.wraps(command)
    def with_package(*args, package=None, package_argument=None, **kwargs):
        if package is not None and package_argument is not None and package != package_argument:
            raise click.UsageError(
                f"two packages given ({package_argument!r} and -m {package!r}); name one, with -m NAME_OR_PATH."
            )
        return command(*args, package=package if package is not None else package_argument, **kwargs)

    with_package = click.argument("package_argument", metavar="[NAME_OR_PATH]", required=False)(with_package)
    return package_option(with_package)


def device_option(command):
    """Add --device (auto, cpu or cuda), passed to the command as `device`."""
    return click.option(
        "--device",
        type=click.Choice(["auto", "cpu", "cuda"]),
        default="auto",
        show_default=True,
        help="Where to run: auto picks CUDA for a float32 package when onnxruntime-gpu and a GPU are present, else the CPU (int8 and int4 run faster there).",
    )(command)


def generation_options(options=OPTIONS, before: dict | None = None):
    """A decorator adding a flag for each option of `options` that has help (runtime/generation_options.py), in
    their order; each passes the command a value, or None (a repeated one: ()) when not given. `before` maps an
    option's name to a decorator whose flags go just before that option's (generate's constraint_options)."""

    def decorate(command):
        decorators = []
        for option in options:
            if option.help is None:
                continue
            if before and option.name in before:
                decorators.append(before[option.name])
            decorators.append(_flag(option))
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def _flag(option):
    """The click option of one declared option."""
    names = option.flags or ("--" + option.name.replace("_", "-"),)
    given = {"metavar": option.metavar, "callback": CALLBACKS.get(option.name)}
    kwargs = {"help": option.help, **{k: v for k, v in given.items() if v is not None}}
    if option.form == "repeated":
        kwargs["multiple"] = True
    elif option.form == "flag":
        kwargs.update(is_flag=True, default=None)
    elif option.form == "switch":
        kwargs["default"] = None  # None when not given, so that the settings' own value stays
    else:
        kwargs["type"] = click.Choice(option.choices) if option.choices else option.field_type
    return click.option(*names, option.name, **kwargs)


def _bias_pairs(ctx, param, items):
    """--logit-bias ID=BIAS ... as {ID: BIAS} (None when not given)."""
    bias = {}
    for item in items:
        token, _, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not ID=BIAS, e.g. 50256=-100", param_hint="--logit-bias") from None
    return bias or None


CALLBACKS = {"logit_bias": _bias_pairs}  # options whose flag's text is parsed into the option's value


def constraint_options(command):
    """Add --json-schema, --json-object, --regex, --grammar and --choice: the GenerationConfig options json_schema,
    json_object, regex, grammar and choices (at most one; runtime/sampling/constraint.py)."""
    for option in reversed(
        [
            click.option(
                "--json-schema",
                metavar="FILE_OR_JSON",
                callback=_schema_or_file,
                help="The output is JSON valid under this schema: a file, or the schema's JSON text.",
            ),
            click.option("--json-object", is_flag=True, default=None, help="The output is a JSON object."),
            click.option("--regex", metavar="REGEX", help="The output matches this regular expression (Rust syntax)."),
            click.option(
                "--grammar",
                type=click.Path(exists=True, dir_okay=False),
                callback=_read_text,
                help="The output is a sentence of this Lark grammar (a file; llguidance's Lark).",
            ),
            click.option(
                "--choice",
                "choices",
                multiple=True,
                callback=lambda ctx, param, value: value or None,
                help="The output is exactly one of the choices (repeatable: --choice yes --choice no).",
            ),
        ]
    ):
        command = option(command)
    return command


def _read_text(ctx, param, path):
    """A file's text, at most the constraint's size bound (runtime/sampling/constraint.py)."""
    if path is None:
        return None
    from pathlib import Path

    from ..sampling.constraint import MAX_TEXT

    file = Path(path)
    if not _is_file(file) or file.stat().st_size > 4 * MAX_TEXT:
        raise click.BadParameter(f"{path} is not a file of at most {MAX_TEXT:,} characters", ctx, param)
    from .. import untrusted

    try:
        return untrusted.read_bytes(file, 4 * MAX_TEXT, OSError).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise click.BadParameter(f"cannot read {path}: {error}", ctx, param) from None


def _is_file(path) -> bool:
    """Whether `path` names a regular file; a name the system cannot look up (too long, say) names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _schema_or_file(ctx, param, value):
    """--json-schema's value: JSON text as given, else the file it names."""
    if value is None or value.lstrip().startswith(("{", "[")) or value.strip() in ("true", "false"):
        return value
    from pathlib import Path

    if not _is_file(Path(value)):
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise click.BadParameter(f"{shown!r} is neither a JSON schema nor a file that holds one", ctx, param)
    return _read_text(ctx, param, value)


def _checked_by(check):
    """A click callback that runs the library's own check of an option's value: its refusal becomes a usage error
    naming the option (exit code 2), worded once, where the library words it."""

    def callback(ctx, param, value):
        from ..errors import EdgelmError

        try:
            check(value)
        except EdgelmError as error:
            raise click.BadParameter(str(error), ctx=ctx, param=param) from None
        return value

    return callback


def _threads(value):
    from ..engine.session import check_threads

    check_threads(value)


def _prefix_cache_mb(value):
    from ..batching.prefix_cache import cache_bytes

    cache_bytes(value)


def threads_option(command):
    """Add --threads, passed to the command as `threads` (None: every core), checked as load() checks it."""
    return click.option(
        "--threads",
        type=int,
        callback=_checked_by(_threads),
        help="onnxruntime intra-op threads (default: all cores; edgelm serve --max-batch 0 gives each running "
        "request cores / --max-concurrency).",
    )(command)


def prefix_cache_option(command):
    """Add --prefix-cache-mb, passed to the command as `prefix_cache_mb`, checked as load() checks it."""
    from ..batching.prefix_cache import CLI_DEFAULT_MB

    return click.option(
        "--prefix-cache-mb",
        default=CLI_DEFAULT_MB,
        show_default=True,
        type=int,
        callback=_checked_by(_prefix_cache_mb),
        help="MiB of recent prompts' key/value rows kept, so a prompt that starts like a recent one (a conversation's "
        "history, a shared system prompt) skips recomputing that start, in its 128-token prefill passes (a "
        "conversation's system messages and tools kept whole); outputs are the same. 0 turns it off.",
    )(command)


def verify_options(command):
    """Add --verify and --no-verify; the command gets `verify`: True (hash the files changed since the last full
    check), "full" (hash them all) or False (none)."""

    @functools.wraps(command)
    def with_verify(*args, no_verify=False, full_verify=False, **kwargs):
        return command(*args, verify=verify_mode(no_verify, full_verify), **kwargs)

    with_verify = click.option("--no-verify", is_flag=True, help="Skip the package checksum check at load.")(
        with_verify
    )
    return click.option(
        "--verify",
        "full_verify",
        is_flag=True,
        help="Hash every file of the package (by default only files changed since the last full check are).",
    )(with_verify)


def verify_mode(no_verify: bool, full_verify: bool):
    """load()'s verify for the two flags."""
    if no_verify and full_verify:
        raise click.UsageError("--verify and --no-verify contradict each other; give one.")
    return False if no_verify else "full" if full_verify else True


def prefix_cache_dir_option(command):
    """Add --prefix-cache-dir and --prefix-cache-disk-mb (passed as `prefix_cache_dir`, `prefix_cache_disk_mb`)."""
    from ..batching.prefix_store import DISK_DEFAULT_MB

    command = click.option(
        "--prefix-cache-disk-mb",
        default=DISK_DEFAULT_MB,
        show_default=True,
        type=click.IntRange(min=1),
        help="MiB the --prefix-cache-dir folder may hold; the blocks used least recently go first.",
    )(command)
    return click.option(
        "--prefix-cache-dir",
        type=click.Path(file_okay=False),
        help="Also keep the prefix cache's blocks in this folder, so that prompts seen before a restart (a long "
        "system prompt, a conversation) skip their prefill after it; the most recent are read back at load, within "
        "--prefix-cache-mb. Bound to the package, safe to share.",
    )(command)
