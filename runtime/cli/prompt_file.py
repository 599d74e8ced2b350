"""The --input / --output options of `edgelm generate` and `edgelm score`: a file of prompts (apps/prompt_file.py)
run with a progress bar on stderr, each failed line reported by number, and an exit status that says whether
every line was answered."""

import sys

import click


def file_options(command):
    """Add --input, --output, --batch-size, --overwrite and --quiet."""
    for option in reversed(
        [
            click.option(
                "--input",
                "input_path",
                type=click.Path(dir_okay=False),
                help="A file of JSON lines, one request per line (the format is above), run instead of the argument.",
            ),
            click.option(
                "--output",
                "output_path",
                type=click.Path(dir_okay=False),
                help="Where --input's results go, one JSON line per input line; rerun to resume it.",
            ),
            click.option(
                "--batch-size",
                type=click.IntRange(min=1),
                default=8,
                show_default=True,
                help="--input lines run and written together.",
            ),
            click.option(
                "--overwrite",
                is_flag=True,
                help="Replace an existing --output that is not this job's results (without it, such a file is "
                "refused and left as it is).",
            ),
            click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary on stderr."),
        ]
    ):
        command = option(command)
    return command


def check_file_options(prompt, input_path, output_path, **single_only) -> bool:
    """True when the command runs a file; usage errors for options that do not go together."""
    if input_path is None:
        if output_path is not None:
            raise click.UsageError("--output goes with --input, a file of prompts; give --input too.")
        return False
    if prompt is not None:
        raise click.UsageError("give a prompt or --input, not both.")
    if output_path is None:
        raise click.UsageError("--input needs --output, the file of JSON lines its results go to.")
    given = [name for name, value in single_only.items() if value]
    if given:
        raise click.UsageError(f"--{given[0].replace('_', '-')} is for one prompt; --input writes JSON lines already.")
    return True


def progress_bar(total: int, initial: int, quiet: bool, stream=None):
    """A tqdm bar on stderr, disabled with --quiet or when stderr is not a terminal (a log file stays clean)."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    enabled = not quiet and hasattr(stream, "isatty") and stream.isatty()
    return tqdm(total=total, initial=initial, unit="line", file=stream, disable=not enabled, dynamic_ncols=True)


def run_file(model, input_path, output_path, task, batch_size, overwrite, quiet, **options) -> None:
    """Run the file job, reporting each failed line on stderr; exits 1 when some lines failed, 130 on Ctrl-C."""
    from ..apps.prompt_file import PromptFile

    job = PromptFile(model, input_path, output_path, task, overwrite=overwrite, **options)
    with progress_bar(job.total, len(job.answered), quiet) as bar:
        try:
            for step in job.run(batch_size):
                for error in step.errors:
                    bar.write(f"line {error.line}: {error.message}", file=sys.stderr)
                bar.update(step.lines)
        except KeyboardInterrupt:
            bar.close()
            click.echo(
                f"interrupted: {len(job.answered)} of {job.total} lines are answered in {output_path}; "
                "run the same command again to finish.",
                err=True,
            )
            sys.exit(130)
    if job.failed:
        numbers = sorted(e.line for e in job.failed)
        shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
        raise click.ClickException(
            f"{len(numbers)} of {job.total} lines failed (line {shown}); each has its \"error\" in {output_path}. "
            "Fix them and run them as a new file."
        )
    if not quiet:
        click.echo(f"{job.total} lines answered in {output_path} ({job.written} this run).", err=True)
