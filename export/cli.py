"""`edgelm export`: the command-line face of export_model, with a line of progress per stage."""

import time

import click
from edgelm.runtime.errors import EdgelmError

from .quantize import RECIPES


@click.command()
@click.argument("model", default="distilgpt2", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False),
    help="Package folder (default: models/NAME, models/NAME-int8 when quantized, ...-kv8 with an int8 cache).",
)
@click.option(
    "--quantize",
    type=click.Choice(list(RECIPES)),
    default="none",
    show_default=True,
    help="Weight storage: float32, or int8 / int8-dynamic / int4 with a measured quality report. int8's rows do not depend on each other (a greedy request gives the same tokens alone and in a batch); int8-dynamic quantizes a whole batch's activations with one scale, for faster long prompts and batches (docs/export.md).",
)
@click.option(
    "--kv-cache",
    type=click.Choice(["float32", "int8"]),
    default="float32",
    show_default=True,
    help="Key/value cache storage; int8 (with a quantized --quantize recipe) reads a quarter of the bytes per step, scales calibrated at export.",
)
@click.option("--revision", help="Hub branch, tag or commit (default: main).")
@click.option("--force", is_flag=True, help="Replace an existing package at the output folder.")
@click.option(
    "--no-validate",
    "validate",
    is_flag=True,
    flag_value=False,
    default=True,
    help="Skip the comparison against PyTorch (the validate stage): faster, but nothing checks the graph's numbers and a quantized package gets no quality report; the manifest and edgelm info say it was not validated.",
)
@click.option(
    "--name",
    help="The package's name: the model id edgelm serve answers to, the name install uses (default: the output folder's name).",
)
@click.option(
    "--chat-template",
    type=click.File("r", encoding="utf-8"),
    help="A Jinja chat template (transformers' format) for the package's tokenizer_config.json; edgelm chat and the server use it.",
)
def export(model, output, quantize, kv_cache, revision, force, validate, name, chat_template):
    """Turn MODEL (a Hugging Face hub id such as distilgpt2, or a local folder) into a validated model package.

    Stages: load, export, optimize, quantize (with --quantize), validate against PyTorch (unless --no-validate), save.
    """
    try:
        from rich.console import Console

        from .stages import export_model
    except ImportError as error:
        raise click.ClickException(
            f"edgelm export needs the export extra ({error.name} is missing): pip install 'edgelm[export]'"
        ) from None
    console = Console(stderr=True, highlight=False)
    started = {}

    def progress(stage, event, detail):
        if stage == "save" and event == "start" and not validate:
            console.print(f"[yellow]-[/] {'validate':<9} skipped (--no-validate): not compared against PyTorch")
        if event == "start":
            started[stage] = time.perf_counter()
            console.print(f"[bold]{stage:<9}[/] {detail}", end="\r" if console.is_terminal else "\n")
        else:
            console.print(f"[green]✓[/] {stage:<9} {detail}  [dim]({time.perf_counter() - started[stage]:.1f}s)[/]")

    try:
        result = export_model(
            model,
            output,
            quantize=quantize,
            force=force,
            revision=revision,
            validate=validate,
            progress=progress,
            kv_cache=kv_cache,
            name=name,
            chat_template=_read_template(chat_template),
        )
    except EdgelmError as error:
        raise click.ClickException(str(error)) from None
    size = sum(f["size"] for f in result.manifest["files"].values())
    click.echo(f"{result.path}  ({size / 1e6:.1f} MB)")
    if quantize != "none":
        for line in _quality_lines(result.path):
            click.echo(line)
    console.print(f"Try it: edgelm generate -m {result.path} \"Hello, my name is\"")


QUALITY_LINES = ("fp32 parity", "int8 quality", "int4 quality", "validation")  # edgelm info's lines about it


def _quality_lines(package_folder) -> list:
    """The quantized package's measured quality (top-1 agreement, KL, perplexity change), as edgelm info shows it."""
    from edgelm.runtime.package.open import open_package

    try:
        described = open_package(package_folder, verify=False).describe()
    except EdgelmError:
        return []
    return [line.strip() for line in described.splitlines() if line.strip().startswith(QUALITY_LINES)]


def _read_template(file) -> str | None:
    if file is None:
        return None
    try:
        return file.read()
    except UnicodeDecodeError as error:
        raise click.BadParameter(
            f"{file.name} is not UTF-8 text ({error.reason})", param_hint="--chat-template"
        ) from None
