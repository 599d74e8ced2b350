"""`edgelm pull / list / rm / default / pack / install`: the model store's commands. Thin: parse, call one library
function (store/local.py, hub.py, archive.py), print; the group (main.py) turns every EdgelmError into one line
and exit code 1."""

import sys

import click

from .options import package_option_or_argument
from .terminal import clean, echo


def _report(installed) -> None:
    echo(f"installed {installed.name}  ({installed.recipe}, {installed.size / 1e6:.1f} MB) in {installed.folder}")
    echo(f"Try it: edgelm generate -m {installed.name} \"Hello, my name is\"", err=True)


@click.command()
@click.argument("repo")
@click.option("--revision", help="Hub branch, tag or commit (default: main).")
@click.option(
    "--name",
    help="Install under this name, which becomes the package's name (the model id edgelm serve answers to). Default: the name in its manifest.",
)
@click.option("--force", is_flag=True, help="Replace an installed package of the same name.")
def pull(repo, revision, name, force):
    """Download the edgelm package in hub repo REPO (OWNER/NAME), check every file's sha256, install it.

    An interrupted pull resumes when run again. HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE apply as in
    huggingface_hub."""
    from ..store.hub import pull as pull_package

    _report(pull_package(repo, revision=revision, name=name, force=force))


@click.command("list")
def list_packages():
    """Show the installed packages: name, recipe, size on disk and where each came from."""
    from ..store import local as store

    packages, default = store.installed(), store.get_default()
    if not packages:
        echo(f"no packages in {store.store_dir()}. {store.how_to_get_one()}")
        return
    rows = [("NAME", "RECIPE", "SIZE", "SOURCE")]
    rows += [
        tuple(
            clean(cell, keep_newlines=False)  # cleaned before the widths are measured
            for cell in (
                p.name + (" *" if p.name == default else ""),
                p.recipe,
                f"{p.size / 1e6:.1f} MB",
                p.source_text,
            )
        )
        for p in packages
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    echo(f"store: {store.store_dir()}" + ("  (* the default)" if default else ""), err=True)


@click.command()
@click.argument("name")
def rm(name):
    """Remove the installed package NAME from the store."""
    from ..store.local import remove

    remove(name)
    echo(f"removed {name}")


@click.command()
@click.argument("name", required=False)
def default(name):
    """Make the installed package NAME the one commands use when given no -m (no NAME: show it).

    Without a default, commands use the one installed package, else models/distilgpt2."""
    from ..store.local import get_default, set_default

    if name is not None:
        set_default(name)
    name = get_default()
    echo(f"default package: {name or 'none set'}")


@click.command()
@package_option_or_argument
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Archive file (default: ./NAME.zip).")
@click.option("--force", is_flag=True, help="Replace an existing archive file.")
@click.option(
    "--sign",
    "sign_key",
    metavar="KEY",
    type=click.Path(dir_okay=False),
    help="Sign the archive with this minisign secret key (FILE.minisig; password from EDGELM_SIGN_PASSWORD).",
)
def pack(package, output, force, sign_key):
    """Verify a package (-m NAME_OR_PATH, or NAME_OR_PATH alone) and write it as one zip file, with FILE.sha256 beside it."""
    from ..store.archive import pack as pack_package
    from ..store.signing import key_password

    packed = pack_package(package, output, force=force, sign_key=sign_key, password=key_password())
    echo(f"{packed.path}  ({packed.size / 1e6:.1f} MB)")
    echo(f"sha256 {packed.sha256}  (also in {packed.path}.sha256)")
    if packed.signature is not None:
        echo(f"signed: {packed.signature}  (check it with minisign -Vm {packed.path.name} -P PUBKEY)")
    echo(f"Install it elsewhere: edgelm install {packed.path.name} --sha256 {packed.sha256}", err=True)


@click.command()
@click.argument("source", metavar="FILE_OR_URL")
@click.option(
    "--name",
    help="Install under this name, which becomes the package's name (the model id edgelm serve answers to). Default: the name in its manifest.",
)
@click.option("--sha256", "sha256", metavar="HEX", help="Refuse the archive unless its sha256 is HEX.")
@click.option("--force", is_flag=True, help="Replace an installed package of the same name.")
@click.option(
    "--trust",
    multiple=True,
    metavar="PUBKEY",
    help="Install only an archive this minisign public key signed (RW... or a .pub file; repeatable). "
    "Keys in STORE/.meta/trusted-keys are trusted too.",
)
def install(source, name, sha256, force, trust):
    """Check an archive made by edgelm pack (a file, or an http(s) URL to download) and install it into the store.

    A local FILE's sha256 is also checked against FILE.sha256 when that file is beside it, and its signature
    (FILE.minisig, URL.minisig) against the trusted keys when any are given or listed."""
    from ..store.archive import install as install_archive

    installed = install_archive(
        source, name=name, sha256=sha256, force=force, progress=_progress_bar(source), trust=trust
    )
    _report(installed)
    if source.startswith("http://") and not sha256 and not installed.source.get("signed_by"):
        echo(
            f"warning: {source} came over plain HTTP with neither --sha256 nor a trusted signature (--trust): "
            "anyone on the way could have changed it.",
            err=True,
        )


def _progress_bar(source):
    def bar(total):
        from tqdm.auto import tqdm

        return tqdm(
            total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=source.rsplit("/", 1)[-1], file=sys.stderr
        )

    return bar


COMMANDS = {name: f"edgelm.runtime.cli.store:{name}" for name in ("pull", "rm", "default", "pack", "install")} | {
    "list": "edgelm.runtime.cli.store:list_packages"
}
