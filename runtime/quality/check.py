"""A package's quality measured again, by the runtime alone, against a reference on a text (`edgelm verify
--quality`): the same figures the export's report records (runtime/quality/measure.py's `measure`), with the recorded
ones beside them.

The reference is normally the float32 package of the same checkpoint (an EngineSide); the command line can also
hand in the checkpoint itself in PyTorch where the export extra is installed (export/validate.py's TorchSide).
Either must have the package's architecture and vocabulary: figures between two different models mean nothing.
"""

from ..errors import QualityError
from .eval_text import DEFAULT_EVAL_TOKENS, EvalText, check_eval_tokens
from .measure import EngineSide, Plan, measure


def package_reference(model, reference) -> EngineSide:
    """`reference` (a loaded Model) as the reference side for `model`: refused unless it is an edgelm package of
    float32 weights with the same architecture and tokenizer."""
    manifest = reference.package.manifest
    where = f"the reference {reference.package.folder}"
    if manifest is None:
        raise QualityError(f"{where} has no edgelm manifest: give the float32 package edgelm export wrote")
    if manifest.weights.dtype != "float32":
        raise QualityError(
            f"{where} holds {manifest.weights.dtype} weights; the reference is the float32 package of the same "
            "checkpoint (edgelm export CHECKPOINT --quantize none)"
        )
    check_same_model(model, reference.arch.to_dict(), reference.package.tokenizer_text(), where)
    return EngineSide(reference.engine, model.arch.eos_token_id)


def check_same_model(model, architecture: dict, tokenizer_text: str, where: str) -> None:
    """QualityError naming the first few differing fields when `architecture` (Architecture.to_dict()) or the
    tokenizer's JSON text is not the package's."""
    ours = model.arch.to_dict()
    differ = [k for k in sorted(set(ours) | set(architecture)) if ours.get(k) != architecture.get(k)]
    if differ:
        shown = ", ".join(f"{k} {architecture.get(k)!r} against {ours.get(k)!r}" for k in differ[:3])
        raise QualityError(
            f"{where} is a different model from the package ({shown}): give the float32 export of the same checkpoint"
        )
    if tokenizer_text != model.package.tokenizer_text():
        raise QualityError(
            f"{where} has another tokenizer (vocabulary) than the package: give the float32 export of the same checkpoint"
        )


def remeasure(model, reference, text: EvalText, eval_tokens: int | None = None, progress=None) -> dict:
    """`model` (a loaded Model) against `reference` (package_reference(), or another side with logits() and
    greedy()) on the first eval_tokens tokens of `text`: {"recipe", "text", "figures", "recorded"}. eval_tokens
    None measures as many as the manifest records for this text (the same tokens, so the figures line up),
    else DEFAULT_EVAL_TOKENS. "recorded" is the manifest's figures for the package's recipe, or None.
    progress(detail), if given, hears where the measurement is (runtime/quality/measure.py's measure)."""
    manifest = model.package.manifest
    validation = manifest.validation if manifest is not None else None
    recorded_text = validation.text if validation is not None else None
    if eval_tokens is None:
        same_text = recorded_text is not None and recorded_text.sha256 == text.sha256
        eval_tokens = recorded_text.measured_tokens if same_text else DEFAULT_EVAL_TOKENS
    check_eval_tokens(eval_tokens)
    ids, prefix, total = text.tokens(model.tokenizer, eval_tokens)
    arch = model.arch
    plan = Plan.for_context(arch.n_positions)
    figures = measure(reference, model.engine, ids, plan, arch.eos_token_id, prefix, progress)
    recipe = manifest.weights.method if manifest is not None else "float32"
    recorded = validation.quality.get(recipe) if validation is not None else None
    return {
        "recipe": recipe,
        "text": text.record(total, len(ids)),
        "figures": figures | {"kv_cache": model.engine.io.cache_dtype},
        "recorded": recorded.to_dict() if recorded is not None else None,
        "recorded_text": recorded_text.to_dict() if recorded_text is not None else None,
    }
