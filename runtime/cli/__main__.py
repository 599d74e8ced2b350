"""python -m edgelm.runtime.cli: through the same launcher as the `edgelm` command."""

from .launch import command

command()
