"""`edgelm bundle`: the frozen command and a package in one folder, for a machine with no Python (bundle.py)."""

import click

from ..errors import EdgelmError
from .options import package_option_or_argument


@click.command()
@package_option_or_argument
@click.option("-o", "--output", type=click.Path(file_okay=False), required=True, help="The bundle's folder.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace a folder an earlier edgelm bundle made (it holds .edgelm-bundle); never any other folder.",
)
def bundle(package, output, force):
    """Freeze edgelm with PyInstaller, in a clean virtual environment it makes (runtime, server and PyInstaller
    only: needs PyPI), and put the package beside it. On the target: DIR/edgelm/edgelm generate "Hello".

    \b
    edgelm bundle -m models/distilgpt2-int8 -o dist/edgelm-distilgpt2
    """
    from ..apps.bundle import build_bundle
    from ..store.local import resolve_package

    try:
        executable = build_bundle(
            resolve_package(package), output, force=force, log=lambda line: click.echo(line, err=True)
        )
    except EdgelmError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"{executable}  (try: {executable} generate \"Hello, my name is\")")
