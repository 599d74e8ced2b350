"""`edgelm export`: the command-line face of export_model, with a line of progress per stage."""

import contextlib
import tempfile
import time
from pathlib import Path

import click
from edgelm.runtime.errors import EdgelmError, install_hint
from edgelm.runtime.package.format import KV_CACHES
from edgelm.runtime.quality.eval_text import DEFAULT_EVAL_TOKENS, MIN_EVAL_TOKENS, EvalText

from .quantize import RECIPES
from .random_weights import SHAPES

from .int4 import BLOCK_SIZES, HEAD_BITS, METHODS, Int4Options

INT4_DEFAULT = Int4Options()  # the defaults the --int4-* help names


@click.command()
@click.argument("model", default="distilgpt2", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False),
    help="Package folder (default: models/NAME with --name; else models/MODEL, models/MODEL-int8 when quantized, "
    "...-kv8 with an int8 cache).",
)
@click.option(
    "--quantize",
    type=click.Choice(list(RECIPES)),
    default="none",
    show_default=True,
    help="Weight storage: float32, or int8 / int8-rows / int8-dynamic / int4 with a measured quality report. int8's "
    "and int8-rows' rows do not depend on each other (a greedy request gives the same tokens alone and in a batch); "
    "int8-rows reads each weight once for all the rows of a pass, for faster long prompts, batches and speculation "
    "at a slower one-row step; int8-dynamic quantizes a whole pass's activations with one scale (docs/export.md).",
)
@click.option(
    "--int4-block",
    type=click.Choice([str(b) for b in BLOCK_SIZES]),
    help=f"With --quantize int4: weights per scale along each product's input (default {INT4_DEFAULT.block_size}).",
)
@click.option(
    "--int4-method",
    type=click.Choice(METHODS),
    help=f"With --quantize int4: how each block is rounded (default {INT4_DEFAULT.method}): rtn plain rounding, clip a per-block "
    "clipping search, kquant llama.cpp's k-quant, hqq half-quadratic (asymmetric), gptq with calibration text. "
    "See docs/quantization.md.",
)
@click.option(
    "--int4-head",
    type=click.Choice([str(b) for b in HEAD_BITS]),
    help=f"With --quantize int4: bits of the LM head and token table (default {INT4_DEFAULT.head_bits}; 8 costs "
    "bytes, gains quality).",
)
@click.option(
    "--kv-cache",
    type=click.Choice(KV_CACHES),
    default="float32",
    show_default=True,
    help="Key/value cache storage; int8 (with a quantized --quantize recipe) reads a quarter of the bytes per step, scales calibrated at export.",
)
@click.option("--revision", help="Hub branch, tag or commit (default: main).")
@click.option(
    "--random-weights",
    is_flag=True,
    help=f"No download: MODEL's published shape ({', '.join(SHAPES)}) with random weights and GPT-2's tokenizer, "
    "for a first run with no model hub. Its size and speed are the real model's; its text is noise.",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    default=0,
    show_default=True,
    help="With --random-weights: the seed the weights are drawn from (one seed, one package).",
)
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
@click.option(
    "--eval-text",
    type=click.Path(dir_okay=False),
    help="A UTF-8 text file for the quantized package's quality report (default: chapters 1-4 of Austen's Persuasion, "
    "shipped with edgelm); the manifest records its name and sha256.",
)
@click.option(
    "--eval-tokens",
    type=click.IntRange(min=MIN_EVAL_TOKENS),
    default=DEFAULT_EVAL_TOKENS,
    show_default=True,
    help=f"Tokens of the evaluation text the quality report measures (at least {MIN_EVAL_TOKENS}; the text must hold them).",
)
@click.option(
    "--system-prompt",
    type=click.Path(dir_okay=False),
    help="A UTF-8 text file: the system prompt whose conversation start (rendered by the package's chat template) "
    "is prefilled at export and stored in the package (prompt_cache.kv), so that chats with it start warm "
    "(docs/apps.md).",
)
@click.option(
    "--tools",
    "tools_path",
    type=click.Path(dir_okay=False),
    help="With --system-prompt: a JSON list of OpenAI function tools rendered with it into the stored start.",
)
def export(model, output, quantize, int4_block, int4_method, int4_head, kv_cache, revision, random_weights, seed,
           force, validate, name, chat_template, eval_text, eval_tokens, system_prompt, tools_path):  # fmt: skip
    """Turn MODEL (a Hugging Face hub id such as distilgpt2, or a local folder) into a validated model package.

    Stages: load, export, optimize, quantize (with --quantize), validate against PyTorch (unless --no-validate), save.
    A quantized package's quality report (KL, top-1, greedy agreement, perplexity) measures --eval-tokens tokens of
    --eval-text; edgelm info shows it, edgelm verify --quality measures it again on any text.
    With --system-prompt (and --tools), a last stage stores the prefilled start of every chat with that system prompt.
    """
    if eval_text is not None:
        try:
            EvalText.read(eval_text)  # the file's faults before the checkpoint is read; its length once it is
        except EdgelmError as error:
            raise click.BadParameter(str(error), param_hint="--eval-text") from None
    if tools_path is not None and system_prompt is None:
        raise click.UsageError("--tools goes with --system-prompt: the tools are stored with its conversation start.")
    try:
        from rich.console import Console

        from .prompt_cache import read_system_prompt, read_tools
        from .stages import default_output, export_model
    except ImportError as error:
        raise click.ClickException(
            f"edgelm export needs the export extra ({error.name} is missing): {install_hint('export')}"
        ) from None
    int4 = _int4_options(quantize, int4_block, int4_method, int4_head)
    system_text = _read_option(read_system_prompt, system_prompt, "--system-prompt")  # before any work
    tools = _read_option(read_tools, tools_path, "--tools")
    console = Console(stderr=True, highlight=False)
    started = {}

    def show(text, status=False):
        if console.is_terminal:
            console.file.write("\x1b[K")  # clears what a longer status line before it left
        if status and console.is_terminal:  # one row, whatever the width, so that the next one overwrites it
            console.print(text, end="\r", no_wrap=True, overflow="ellipsis", crop=True)
        else:
            console.print(text)

    def progress(stage, event, detail):
        if stage == "save" and event == "start" and not validate:
            show(f"[yellow]-[/] {'validate':<9} skipped (--no-validate): not compared against PyTorch")
        if event == "start":
            started[stage] = time.perf_counter()
        if event in ("start", "step"):  # a terminal keeps one status line per stage; a log gets each line
            elapsed = f"  [dim]({time.perf_counter() - started[stage]:.0f}s)[/]" if event == "step" else ""
            show(f"[bold]{stage:<9}[/] {detail}{elapsed}", status=True)
        else:
            show(f"[green]✓[/] {stage:<9} {detail}  [dim]({time.perf_counter() - started[stage]:.1f}s)[/]")

    if not random_weights and seed != 0:
        raise click.UsageError("--seed goes with --random-weights.")
    try:
        with _checkpoint(model, random_weights, revision, seed) as source:
            result = export_model(
                source,
                output if output is not None or name is not None else default_output(model, quantize, kv_cache),
                quantize=quantize,
                force=force,
                revision=revision,
                validate=validate,
                progress=progress,
                kv_cache=kv_cache,
                name=name,
                chat_template=_read_template(chat_template),
                eval_text=eval_text,
                eval_tokens=eval_tokens,
                int4=int4,
                system_prompt=system_text,
                tools=tools,
            )
    except EdgelmError as error:  # a stage's unforeseen failure too: StageError names it and what to do
        raise click.ClickException(str(error)) from None
    except Exception as error:  # outside any stage: still one line, never a traceback
        cause = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise click.ClickException(f"edgelm export failed ({cause}); please report it with the command.") from None
    size = sum(f["size"] for f in result.manifest["files"].values())
    click.echo(f"{result.path}  ({size / 1e6:.1f} MB)")
    if quantize != "none":
        for line in _quality_lines(result.path):
            click.echo(line)
    if random_weights:
        console.print(f"[yellow]random weights[/] (seed {seed}): {model}'s size and speed, but its text is noise")
    console.print(f"Try it: edgelm generate -m {result.path} \"Hello, my name is\"")


@contextlib.contextmanager
def _checkpoint(model, random_weights, revision, seed):
    """What export_model reads: MODEL itself, or with --random-weights a checkpoint of its shape built in a
    temporary folder named for what it is (the manifest's source names that folder, never its path)."""
    if not random_weights:
        yield model
        return
    if revision is not None:
        raise click.UsageError("--revision names a hub version; --random-weights downloads nothing.")
    from .random_weights import random_checkpoint

    with tempfile.TemporaryDirectory(prefix="edgelm-random-") as folder:
        yield str(random_checkpoint(model, Path(folder) / f"{model}-random-weights-seed{seed}", seed))


def _quality_lines(package_folder) -> list:
    """The quantized package's measured quality, as edgelm info shows it (from its eval text line on)."""
    from edgelm.runtime.package.open import open_package

    try:
        described = open_package(package_folder, verify=False).describe().splitlines()
    except EdgelmError:
        return []
    start = next((i for i, line in enumerate(described) if line.startswith("  eval text")), len(described))
    return [line for line in described[start:] if not line.startswith("  made with")]


def _read_option(read, path, hint: str):
    """What `read(path)` makes of an option's file (None without one), its fault as the option's error."""
    if path is None:
        return None
    try:
        return read(path)
    except EdgelmError as error:
        raise click.BadParameter(str(error), param_hint=hint) from None


def _read_template(file) -> str | None:
    if file is None:
        return None
    try:
        return file.read()
    except UnicodeDecodeError as error:
        raise click.BadParameter(
            f"{file.name} is not UTF-8 text ({error.reason})", param_hint="--chat-template"
        ) from None


FLAGS = {"block_size": "--int4-block", "method": "--int4-method", "head_bits": "--int4-head"}


def _int4_options(quantize, block, method, head):
    """The --int4-* options as an Int4Options (None when none is given); refused without --quantize int4."""
    given = {k: v for k, v in (("block_size", block), ("method", method), ("head_bits", head)) if v is not None}
    if not given:
        return None
    if quantize != "int4":
        flags = ", ".join(
            "--int4-" + {"block_size": "block", "method": "method", "head_bits": "head"}[k] for k in given
        )
        raise click.UsageError(f"{flags} go with --quantize int4, not --quantize {quantize}.")
    return Int4Options(**{k: v if k == "method" else int(v) for k, v in given.items()})
