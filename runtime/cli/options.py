"""The one way every `edgelm` command names its package: `-m/--model NAME_OR_PATH`.

NAME_OR_PATH is a package folder or the name of an installed package (`edgelm list`); store.resolve_package turns
it, or its absence, into a folder, the same way for every command and for load(). Commands whose only argument
is the package (info, verify, bench, serve, pack) take it as that argument too; generate's argument is the prompt,
so there the package is given with -m only. Every command that loads one takes --device the same way too.
"""

import functools

import click

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
