"""`edgelm verify --quality`: find the reference and the text, call runtime/quality/check.py, print the figures
with the manifest's beside them."""

import hashlib
import importlib
import json
import sys
from pathlib import Path

import click

from ..errors import EdgelmError, install_hint
from ..quality.eval_text import EvalText

# A checkpoint as the reference: the export stage's PyTorch side, imported by name and only then (the runtime
# itself never imports the export stage; tests/repository/test_import_contract.py).
CHECKPOINT_REFERENCE = "edgelm.export.validate:checkpoint_reference"


def quality_report(package_folder, reference: str, text_path: str | None, eval_tokens: int | None, as_json: bool):
    """The text `edgelm verify --quality` prints: a line naming what was measured, then the figures."""
    from ..model import load
    from ..package.format import figure_lines
    from ..quality.check import package_reference, remeasure

    model = load(package_folder, verify=False)  # its files were just checked
    text = _text(model, text_path)
    reference_folder = Path(reference)
    show = _progress()
    if _is_checkpoint(reference_folder):
        show(f"loading the checkpoint {reference} in PyTorch")
        side, against = _checkpoint_side(model, reference_folder), f"the checkpoint {reference} in PyTorch"
    else:
        side, against = package_reference(model, load(reference_folder)), f"the float32 package {reference}"
    result = remeasure(model, side, text, eval_tokens, progress=show)
    show(None)
    if as_json:
        return json.dumps(result | {"reference": against}, indent=2)
    t, recorded_text = result["text"], result["recorded_text"]
    lines = [
        f"measured on {t['name']}: its first {t['measured_tokens']:,} of {t['tokens']:,} tokens (sha256 {t['sha256'][:12]}...)",
    ]
    if result["recorded"] is None:
        lines.append("  the manifest records no quality figures for this package to compare with")
    elif recorded_text["sha256"] != t["sha256"] or recorded_text["measured_tokens"] != t["measured_tokens"]:
        lines.append(
            f"  the manifest's figures are of {recorded_text['name']}'s first {recorded_text['measured_tokens']:,} "
            "tokens, another text: compare them as two texts, not as a check"
        )
    lines += figure_lines(result["recipe"], result["figures"], model.arch.vocab_size, against, result["recorded"])
    return "\n".join(lines)


def _progress():
    """show(detail): where the measurement is, on stderr (the figures go to stdout): one status line rewritten
    on a terminal, a line each in a log; show(None) clears a terminal's status line at the end."""
    terminal = sys.stderr.isatty()

    def show(detail):
        if terminal:
            click.echo("\r\x1b[K" + (f"measuring: {detail}" if detail else ""), err=True, nl=False)
        elif detail:
            click.echo(f"measuring: {detail}", err=True)

    return show


def _text(model, text_path):
    """--text, else the text the manifest names where edgelm ships it (export/data/, checked by sha256)."""
    if text_path is not None:
        try:
            return EvalText.read(text_path)
        except EdgelmError as error:
            raise click.BadParameter(str(error), param_hint="--text") from None
    manifest = model.package.manifest
    recorded = manifest.validation.text if manifest is not None else None
    if recorded is None:
        raise click.UsageError("the package records no evaluation text: give one with --text FILE")
    from importlib.resources import files

    shipped = Path(str(files("edgelm.export"))) / "data" / recorded.name
    if shipped.is_file() and hashlib.sha256(shipped.read_bytes()).hexdigest() == recorded.sha256:
        return EvalText.read(shipped)
    raise click.UsageError(
        f"the package was measured on {recorded.name} (sha256 {recorded.sha256[:12]}...), which edgelm does not "
        "ship: give it, or another text, with --text FILE"
    )


def _is_checkpoint(folder: Path) -> bool:
    """A Hugging Face checkpoint folder: config.json and weights, no manifest or ONNX graph."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    weights = any(n.endswith((".safetensors", ".bin")) for n in names)
    return "config.json" in names and weights and not names & {"manifest.json", "model.onnx"}


def _checkpoint_side(model, folder: Path):
    """The checkpoint in PyTorch as the reference (the export extra's TorchSide), checked to be the package's."""
    from ..quality.check import check_same_model

    module, name = CHECKPOINT_REFERENCE.split(":")
    try:  # torch and transformers are imported on the way: ImportError where the export extra is absent
        side, architecture, tokenizer_text = getattr(importlib.import_module(module), name)(folder)
    except ImportError as error:
        raise click.ClickException(
            f"a checkpoint as the reference needs the export extra ({error.name} is missing): "
            f"{install_hint('export')}, or give the float32 package instead"
        ) from None
    check_same_model(model, architecture, tokenizer_text, f"the checkpoint {folder}")
    return side
