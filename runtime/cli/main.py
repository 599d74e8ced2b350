"""The `edgelm` command. Thin: parse options, call one library function, print. Errors become one line."""

import json
import sys

import click

from ..errors import EdgelmError
from ..generation_config import SPECULATIVE, sampling_implied
from ..quality.eval_text import MIN_EVAL_TOKENS
from ..inputs import decode_utf8
from .early import EarlyStart, load_model
from .options import (
    constraint_options,
    device_option,
    generation_options,
    package_option,
    package_option_or_argument,
    threads_option,
    verify_options,
)
from .prompt_file import check_file_options, file_options, run_file
from .store import COMMANDS as STORE_COMMANDS
from .terminal import clean, echo, generated

LAZY_COMMANDS = {
    "bundle": "edgelm.runtime.cli.bundle:bundle",
    "chat": "edgelm.runtime.cli.chat:chat",
    "export": "edgelm.export.cli:export",
    "serve": "edgelm.runtime.cli.serve:serve",
    **STORE_COMMANDS,  # pull, list, rm, default, pack, install
}  # heavy stages import only when asked for


class EdgelmGroup(click.Group):
    """The `edgelm` group: lazily imported commands, and the one place an EdgelmError (the library's refusal,
    worded for the user) becomes a click error: one line and exit code 1, for every command."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name].split(":")
            return getattr(__import__(module, fromlist=[attr]), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EdgelmError as error:  # the library's refusal, worded for the user: one line, exit code 1
            raise click.ClickException(clean(str(error))) from None
        except click.ClickException as error:  # a message may quote a package's, an archive's or a hub's text
            error.message = clean(error.message)
            raise


@click.group(cls=EdgelmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgelm")
def main():
    """Ship a GPT-2, Llama or Qwen2 model as an ONNX package and run it without PyTorch.

    \b
    edgelm export distilgpt2                  # hub id or local folder -> models/distilgpt2
    edgelm generate "Hello, my name is"       # stream a completion from the default package
    edgelm generate -m NAME_OR_PATH "Hello"   # -m names the package, the same in every command
    echo "Once upon a time" | edgelm generate # piped text is the prompt
    """


@main.command()
@click.argument("prompt", required=False)
@package_option
@generation_options(before={"truncate": constraint_options})
@click.option(
    "--draft-model",
    metavar="NAME_OR_PATH",
    help="A smaller package of the same tokenizer whose guesses are verified several per pass (auto and draft).",
)
@device_option
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON instead of streaming text.")
@click.option("--show-config", is_flag=True, help="Print the settings in effect and exit.")
@verify_options
@file_options
def generate(
    prompt,
    package,
    device,
    threads,
    as_json,
    show_config,
    verify,
    input_path,
    output_path,
    batch_size,
    overwrite,
    quiet,
    draft_model,
    **options,
):
    """Complete PROMPT and stream it to stdout. With no PROMPT, piped stdin is the prompt ('-' reads stdin too);
    '' asks for unconditional text. The package is given with -m (an installed name or a folder).

    \b
    edgelm generate -m distilgpt2 "Hello, my name is" --max-new-tokens 30
    git log -1 --format=%B | edgelm generate --do-sample -n 3
    edgelm generate --input prompts.jsonl --output results.jsonl --max-new-tokens 30
    edgelm generate --json --json-schema person.json "A person:"   # "parsed" holds the JSON value
    edgelm generate --choice yes --choice no "Is water wet?"

    --input: one JSON object per line, {"prompt": "..."} or {"messages": [...]}, with an optional "id" and any
    generation option by its Python name ({"prompt": "Hi", "max_new_tokens": 5, "stop": ["."]}) over the
    options given here. Each output line names its input "line" (and "id"); a line that cannot be run gets an
    "error" and the rest go on. Rerunning the same command resumes an interrupted output.
    """
    from_file = check_file_options(prompt, input_path, output_path, json=as_json)
    prompt = None if from_file else _prompt(prompt, package)
    options = sampling_implied({k: v for k, v in options.items() if v is not None and v != ()})
    early = click.get_current_context().obj  # the session launch.py started, if any (it ends it on every exit)
    model = load_model(early if isinstance(early, EarlyStart) else None, package, device, threads, verify, draft_model)
    settings = model.settings(**options)
    if show_config:
        click.echo(
            json.dumps(
                {"package": str(model.package.folder), "device": model.device, **settings.__dict__},
                indent=2,
                default=str,
            )
        )
        return
    if from_file:
        return run_file(model, input_path, output_path, "generate", batch_size, overwrite, quiet, config=settings)
    if as_json or settings.num_return_sequences > 1:
        completions = model.generate([prompt], settings)
        if as_json:
            click.echo(
                json.dumps(
                    [c.to_dict() for c in completions] if len(completions) > 1 else completions[0].to_dict(),
                    indent=2,
                    ensure_ascii=False,
                )
            )
        else:
            click.echo(generated("\n---\n".join(c.text for c in completions)))
        return
    _stream(model.stream(prompt, settings))


def _stream(stream):
    """Print pieces as they come; Ctrl-C keeps what was printed and exits 130."""
    try:
        for piece in stream:
            click.echo(generated(piece), nl=False)
            sys.stdout.flush()
        click.echo()
    except KeyboardInterrupt:
        stream.close()
        click.echo()
        sys.exit(130)


def _prompt(prompt: str | None, package: str | None, command: str = "generate") -> str:
    """The prompt to complete: the argument, else piped stdin. A terminal with no prompt, or a prompt that names a
    package while -m is absent, is a usage error (never a wait on the keyboard, never the wrong model)."""
    if prompt == "-":
        return _read_stdin()
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError(
                f"no prompt: give one (edgelm {command} \"Hello\"), pipe one in (echo Hello | edgelm {command}), "
                "give a file of them with --input, or pass '' for unconditional text."
            )
        return _read_stdin()
    if package is None:
        from ..store.local import names_a_package

        if names_a_package(prompt):
            raise click.UsageError(
                f"{prompt!r} is a model package, not a prompt: name the package with -m, e.g. "
                f"edgelm {command} -m {prompt} \"Hello\" (with -m given, any text is taken as the prompt)."
            )
    return prompt


def _read_stdin() -> str:
    from ..apps import prompt_file  # one prompt: at most what one line of a prompt file may hold

    data = sys.stdin.buffer.read(prompt_file.MAX_LINE_BYTES + 1)  # /dev/zero piped in ends here too
    if len(data) > prompt_file.MAX_LINE_BYTES:
        raise click.UsageError(f"stdin holds over {prompt_file.MAX_LINE_BYTES:,} bytes; pipe in a shorter prompt.")
    text = decode_utf8(data, "stdin")
    return text[:-1] if text.endswith("\n") else text


@main.command()
@click.argument("text", required=False)
@package_option
@click.option("--top-logprobs", type=click.IntRange(min=0), help="Also give each token's N most likely tokens.")
@device_option
@threads_option
@verify_options
@file_options
def score(text, package, top_logprobs, device, threads, verify, input_path, output_path, batch_size, overwrite, quiet):
    """Print each token's log-probability of TEXT and its perplexity, as JSON. With no TEXT, piped stdin is the
    text; --input scores a file of {"text": "..."} lines (optionally "id" and "top_logprobs") into --output.

    \b
    edgelm score -m distilgpt2 "The quick brown fox"
    edgelm score --input texts.jsonl --output scores.jsonl
    """
    from ..model import load
    from ..apps.prompt_records import score_records

    from_file = check_file_options(text, input_path, output_path)
    text = None if from_file else _prompt(text, package, "score")
    model = load(package, device=device, threads=threads, verify=verify)
    if from_file:
        return run_file(
            model, input_path, output_path, "score", batch_size, overwrite, quiet, top_logprobs=top_logprobs
        )
    (answer,) = score_records(model, [{"text": text, "top_logprobs": top_logprobs}])
    if "error" in answer:
        raise click.ClickException(answer["error"])
    click.echo(json.dumps(answer, indent=2, ensure_ascii=False))


@main.command()
@package_option_or_argument
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest.")
def info(package, as_json):
    """Show a package's architecture, weights, sizes and validation figures (NAME_OR_PATH is the same as -m)."""
    from ..package.open import open_package
    from ..store.local import resolve_package

    pkg = open_package(resolve_package(package), verify=False)
    echo(json.dumps(pkg.to_dict(), indent=2) if as_json else pkg.describe())


@main.command()
@package_option_or_argument
@click.option(
    "--quality",
    is_flag=True,
    help="Also measure the package's quality again, against --reference, and print it beside the manifest's figures.",
)
@click.option(
    "--reference",
    type=click.Path(exists=True, file_okay=False),
    help="With --quality: the float32 package of the same checkpoint (or the checkpoint folder, with the export extra).",
)
@click.option(
    "--text",
    "text_path",
    type=click.Path(dir_okay=False),
    help="With --quality: a UTF-8 text to measure on (default: the one the manifest names, where edgelm ships it).",
)
@click.option(
    "--eval-tokens",
    type=click.IntRange(min=MIN_EVAL_TOKENS),
    help="With --quality: tokens of the text to measure (default: as many as the manifest's figures measured).",
)
@click.option("--json", "as_json", is_flag=True, help="With --quality: print the figures as JSON.")
def verify(package, quality, reference, text_path, eval_tokens, as_json):
    """Check every file of a package against the sizes and sha256 in its manifest (NAME_OR_PATH is the same as -m).

    \b
    With --quality, measure it again against a reference on a text: perplexity, KL, top-1, greedy agreement.
    edgelm verify models/x-int8 --quality --reference models/x
    edgelm verify models/x-int8 --quality --reference models/x --text notes.txt
    """
    from ..package.open import open_package
    from ..store.local import resolve_package

    if not quality and (reference or text_path or eval_tokens or as_json):
        raise click.UsageError("--reference, --text, --eval-tokens and --json go with --quality")
    if quality and reference is None:
        raise click.UsageError("--quality needs --reference: the float32 package of the same checkpoint")
    pkg = open_package(resolve_package(package), verify="full")
    checked = (
        f"OK: {len(pkg.manifest.files)} files of {pkg.folder} match their sha256"
        if pkg.manifest
        else f"{pkg.folder} is an optimum folder with no manifest: nothing to verify"
    )
    if not quality:
        return echo(checked)
    from .quality import quality_report

    report = quality_report(pkg.folder, reference, text_path, eval_tokens, as_json)
    echo(report if as_json else f"{checked}\n{report}")


@main.command()
@package_option_or_argument
@click.option("--runs", type=int, default=3, show_default=True, help="Repeats per figure (medians are reported).")
@threads_option
@device_option
@click.option(
    "--speculative",
    type=click.Choice(SPECULATIVE),
    help="Also time greedy decode with this speculative mode against off, side by side, on a prompt that quotes "
    "itself: tokens/s of each, the speed-up, the drafted and accepted tokens.",
)
@click.option("--draft-model", metavar="NAME_OR_PATH", help="The draft package for --speculative draft (or auto).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench(package, runs, threads, device, speculative, draft_model, as_json):
    """Measure load time, time to first token, decode speed (batch 1, 8, 16), memory and the bandwidth ceiling
    (NAME_OR_PATH is the same as -m)."""
    from ..apps.bench import format_table, run_bench

    if runs < 1:
        raise click.BadParameter("must be at least 1", param_hint="--runs")
    if speculative == "draft" and draft_model is None:
        raise click.BadParameter("--speculative draft needs --draft-model NAME_OR_PATH", param_hint="--speculative")
    result = run_bench(
        package, threads=threads, device=device, runs=runs, speculative=speculative, draft=draft_model
    )
    click.echo(json.dumps(result, indent=2) if as_json else format_table(result))
