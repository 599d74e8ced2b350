"""`export_model`: checkpoint in, model package out, as a short sequence of named stages (CTranslate2's
`Converter.convert`), each one function below:

    load -> convert (export, optimize) -> quantize (optional) -> validate (optional) -> save
         -> cache (with a system prompt: its prefilled rows stored in the package, export/prompt_cache.py)

The options are checked once, before any work (`ExportPlan`). Each stage reports to an optional
`progress(stage, event, detail)` callback: event "start", "step" (the long stages' progress within themselves)
and "done"; the library never prints. A failure a stage did not foresee (an onnxruntime error, a library's own)
leaves as one StageError that names the stage and what to do (export/progress.py).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgelm.runtime.quality.eval_text import DEFAULT_EVAL_TOKENS, EvalText, check_eval_tokens
from edgelm.runtime.package.format import (
    GENERATION_CONFIG,
    GRAPH_FILE,
    HF_CONFIG,
    KV_CACHES,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    Manifest,
    Validation,
    Weights,
    oldest_format,
)
from edgelm.runtime.package.open import open_package
from edgelm.runtime.store.local import check_name

from .checkpoint_files import check_chat_template, generation_defaults, read_tokenizer, tokenizer_config, tokenizer_json
from .errors import ExportError
from .families import family_for
from .graph.contract import OPSET
from .int4 import Int4Options
from .load import load_checkpoint
from .manifest import graph_section, tool_versions
from .progress import ADVICE, REPORT, STAGES, Progress  # noqa: F401 (ADVICE, STAGES: importable here)
from .prompt_cache import add_prompt_cache, check_tools
from .quantize import INT8_RECIPES, RECIPES, recipe_description
from .weights_file import split_weights
from .writer import PackageWriter, check_destination, refuse_existing, sweep_partials

# The evaluation text a quantized package's quality report measures unless given another: package data.
DEFAULT_EVAL_TEXT = Path(__file__).resolve().parent / "data" / "persuasion-chapters-1-4.txt"
NOT_VALIDATED = "exported with --no-validate (validate=False): no comparison against PyTorch was made"


@dataclass
class ExportResult:
    path: Path
    manifest: dict


@dataclass(frozen=True)
class ExportPlan:
    """What one export does, every option checked (export_model's docstring says what each means)."""

    model: str
    output: Path
    name: str  # the model id servers answer to, the store name
    quantize: str
    kv_cache: str
    validate: bool
    force: bool
    revision: str | None
    chat_template: str | None
    text: EvalText | None  # the evaluation text a quantized, validated export measures
    eval_tokens: int
    int4: Int4Options | None
    system_prompt: str | None = None  # the text whose conversation start is prefilled and stored (prompt cache)
    tools: list | None = None  # OpenAI function tools rendered with it

    @property
    def needs_reference(self) -> bool:
        """The PyTorch reference (and transformers' import, most of a small export's time) only for what needs it."""
        return self.validate or self.kv_cache == "int8"


@dataclass
class Loaded:
    """What the load stage read: the checkpoint, what the package takes from beside it, and its PyTorch reference."""

    checkpoint: Any  # export/checkpoint.py's Checkpoint
    family: Any  # export/families/'s Family
    tokenizer_json: str
    tokenizer_config: dict | None  # None: the checkpoint's own file is copied as it is
    generation_defaults: dict | None  # None: the checkpoint's own file is copied
    tokenizer: Any  # a `tokenizers` Tokenizer
    eval_ids: tuple | None  # EvalText.tokens(): (ids, prefix, total)
    reference: Any  # the family's reference model, or None

    @property
    def arch(self):
        return self.checkpoint.arch


def export_model(
    model: str = "distilgpt2",
    output=None,
    quantize: str = "none",
    force: bool = False,
    revision: str | None = None,
    progress: Callable[[str, str, str], None] | None = None,
    kv_cache: str = "float32",
    validate: bool = True,
    name: str | None = None,
    chat_template: str | None = None,
    eval_text=None,
    eval_tokens: int = DEFAULT_EVAL_TOKENS,
    int4: Int4Options | None = None,
    system_prompt: str | None = None,
    tools: list | None = None,
) -> ExportResult:
    """Export a checkpoint of a family edgelm exports (hub id or local folder; export/families/) to a validated
    model package.

    validate=False (`edgelm export --no-validate`) skips the comparison against PyTorch, nearly all of a small
    model's export time: the manifest then records no figures but says why, and `edgelm info` says so.
    chat_template (Jinja source) is written into the package's tokenizer_config.json, where the runtime and
    transformers' AutoTokenizer read it.

    eval_text (a path; default export/data/'s sample) is the text a quantized package's quality report measures,
    its first eval_tokens tokens (default 8,192, at least 2,048: runtime/quality/eval_text.py). The manifest records the
    text's name, sha256 and token count.

    int4 (with quantize="int4"): block size, rounding method and the head's bits (export/int4.py; default
    Int4Options()).

    system_prompt (text), with tools (a list of OpenAI function tools) or not: the conversation start they render
    to through the package's chat template is prefilled once and stored in the package (export/prompt_cache.py),
    so that a chat with that system prompt starts from it.

    progress(stage, event, detail) hears each stage start, its steps where it is long, and its end (module
    docstring). Raises ExportError (runtime/errors.py's EdgelmError), StageError where a stage failed in a way it
    did not foresee."""
    plan = _plan(model, output, quantize, force, revision, kv_cache, validate, name, chat_template, eval_text,
                 eval_tokens, int4, system_prompt, tools)  # fmt: skip
    stages = Progress(progress)
    sweep_partials(plan.output)  # first, so a package a stopped export had moved aside is back before the checks
    refuse_existing(plan.output, plan.force)
    with stages.failures():
        loaded = _load(plan, stages)
        fp32_graph = _convert(loaded, stages)
        shipped = _quantize(plan, loaded, fp32_graph, stages)  # what is written: model.onnx and model.onnx.data
        validation = _validate(plan, loaded, shipped, fp32_graph, stages)
        manifest = _save(plan, loaded, shipped, validation, stages)
        if plan.system_prompt is not None:
            manifest = _cache(plan, stages)
    return ExportResult(plan.output, manifest)


def _plan(model, output, quantize, force, revision, kv_cache, validate, name, chat_template, eval_text, eval_tokens,
          int4, system_prompt=None, tools=None) -> ExportPlan:  # fmt: skip
    """export_model's options, checked: ExportError naming the first one that cannot be used."""
    if quantize not in RECIPES:
        raise ExportError(f"unknown quantization {quantize!r}; choose one of {', '.join(RECIPES)}.")
    int4 = Int4Options.for_recipe(quantize, int4)
    if kv_cache not in KV_CACHES:
        raise ExportError(f"unknown KV cache type {kv_cache!r}; choose one of {', '.join(KV_CACHES)}.")
    if kv_cache == "int8" and quantize == "none":
        raise ExportError(
            "an int8 KV cache goes with quantized weights (--quantize int8, int8-dynamic or int4): the float32 package stays token-exact with transformers."
        )
    if chat_template is not None:
        check_chat_template(chat_template)
    text = _eval_text(eval_text, eval_tokens, quantize, validate)
    if output is None:  # a named package is written to models/NAME, where commands given NAME look
        output = Path("models") / check_name(name) if name is not None else default_output(model, quantize, kv_cache)
    output = Path(output)
    package_name = output.name if name is None else check_name(name)  # the model id servers answer to, the store name
    if system_prompt is not None and (not isinstance(system_prompt, str) or not system_prompt.strip()):
        raise ExportError("system_prompt must be the system prompt's text (a non-empty string).")
    if tools is not None:
        if system_prompt is None:
            raise ExportError("tools are stored with a system prompt's cache: give system_prompt (--system-prompt).")
        check_tools(tools)
    return ExportPlan(model, output, package_name, quantize, kv_cache, validate, force, revision, chat_template, text,
                      eval_tokens, int4, system_prompt, tools)  # fmt: skip


def default_output(model: str, quantize: str, kv_cache: str = "float32") -> Path:
    name = Path(model.rstrip("/")).name
    return Path("models") / (
        name + ("" if quantize == "none" else f"-{quantize}") + ("-kv8" if kv_cache == "int8" else "")
    )


def _load(plan: ExportPlan, stages: Progress) -> Loaded:
    """Stage 1: the checkpoint, its tokenizer files and generation defaults, the evaluation text's tokens and the
    PyTorch reference; then the room the package needs at its destination."""
    stages.start("load", plan.model)
    checkpoint = load_checkpoint(plan.model, plan.revision)
    text = tokenizer_json(checkpoint.folder)
    config = tokenizer_config(checkpoint.folder, plan.chat_template)
    tokenizer = read_tokenizer(text)
    # refused here, before the work, when the text is shorter than eval_tokens
    eval_ids = plan.text.tokens(tokenizer, plan.eval_tokens) if plan.text is not None else None
    defaults = generation_defaults(checkpoint)
    family = family_for(checkpoint.arch.model_type)
    reference = family.reference_model(checkpoint) if plan.needs_reference else None
    loaded = Loaded(checkpoint, family, text, config, defaults, tokenizer, eval_ids, reference)
    arch, weight_bytes = checkpoint.arch, sum(w.nbytes for w in checkpoint.weights.values())
    stages.done(f"{arch.n_layer} layers, {arch.n_embd} wide, {weight_bytes / 4e6:.1f} M parameters")
    needed = int(weight_bytes * (0.3 if plan.quantize != "none" else 1.05)) + (1 << 20)
    check_destination(plan.output, plan.force, needed)
    return loaded


def _convert(loaded: Loaded, stages: Progress):
    """Stages 2 and 3, export and optimize: the float32 decoder graph, checked, its weights split from it
    (export/weights_file.py's ShippedGraph)."""
    stages.start("export")
    decoder = loaded.family.build_decoder(loaded.arch, loaded.checkpoint.weights, "none")
    stages.done(f"{len(decoder.model.graph.node)} nodes, opset {OPSET}")
    stages.start("optimize")
    graph = split_weights(_optimize(decoder.model), decoder.arrays)
    stages.done("checked, shapes inferred")
    return graph


def _quantize(plan: ExportPlan, loaded: Loaded, fp32_graph, stages: Progress):
    """Stage 4: the decoder again with the recipe's weights (and an int8 cache's calibrated scales); the float32
    graph itself for --quantize none."""
    if plan.quantize == "none":
        return fp32_graph
    int4 = plan.int4
    what = plan.quantize
    if int4 is not None:
        what = f"int4 ({int4.method}, blocks of {int4.block_size}, {int4.head_bits}-bit head)"
    stages.start("quantize", what + (" weights, int8 KV cache" if plan.kv_cache == "int8" else ""))
    arch, family = loaded.arch, loaded.family
    scales = family.kv_cache_scales(loaded.reference, loaded.tokenizer, arch) if plan.kv_cache == "int8" else None
    if int4 is not None and int4.method == "gptq":
        from .gptq import with_hessians

        int4 = with_hessians(int4, fp32_graph, loaded.tokenizer, arch)
    decoder = family.build_decoder(arch, loaded.checkpoint.weights, plan.quantize, scales, int4=int4)
    shipped = split_weights(_optimize(decoder.model), decoder.arrays)
    stages.done(f"{shipped.size / 1e6:.1f} MB of weights")
    return shipped


def _validate(plan: ExportPlan, loaded: Loaded, shipped, fp32_graph, stages: Progress) -> Validation:
    """Stage 5: float32 parity against transformers (a gate), and a quantized package's quality report
    (export/validate.py); the record of its absence with --no-validate."""
    if not plan.validate:
        return Validation({}, skipped=NOT_VALIDATED)
    from .validate import validate_package

    stages.start("validate", "against transformers (PyTorch)")
    validation = validate_package(
        shipped, fp32_graph, loaded.reference, loaded.tokenizer, loaded.arch, loaded.family, plan.quantize,
        plan.text, loaded.eval_ids, stages.step,
    )  # fmt: skip
    done = f"fp32 max relative error {validation['fp32']['max_logits_relative_error']:.1e}"
    if plan.quantize != "none":
        recipe = recipe_description(plan.quantize, tied=loaded.arch.tie_word_embeddings)["method"]
        figures = validation[recipe]
        done += (
            f"; {recipe} mean KL {figures['mean_kl_divergence']:.4f}, top-1 {figures['top1_agreement']:.3f} over "
            f"{figures['tokens']:,} tokens of {plan.text.name}"
        )
    stages.done(done)
    return Validation.from_dict(validation)


def _save(plan: ExportPlan, loaded: Loaded, shipped, validation: Validation, stages: Progress) -> dict:
    """Stage 6: the package's files and manifest written beside the destination and moved into place at once
    (export/writer.py), then read back as the manifest says."""
    stages.start("save", str(plan.output))
    folder, arch = loaded.checkpoint.folder, loaded.arch
    writer = PackageWriter(plan.output)
    try:
        writer.write_bytes(GRAPH_FILE, shipped.graph)
        writer.write_chunks(WEIGHTS_FILE, shipped.chunks())
        writer.write_bytes(TOKENIZER_FILE, loaded.tokenizer_json.encode())
        for name in (HF_CONFIG, GENERATION_CONFIG, "tokenizer_config.json", "special_tokens_map.json"):
            if (folder / name).exists():
                writer.copy(name, folder / name)
        if loaded.tokenizer_config is not None:  # without auto_map, with the chat template
            writer.write_json("tokenizer_config.json", loaded.tokenizer_config)
        if loaded.generation_defaults is not None:  # the checkpoint has none
            writer.write_json(GENERATION_CONFIG, loaded.generation_defaults)
        quantize = plan.quantize
        graph = graph_section(shipped, plan.kv_cache)
        manifest = writer.publish(
            Manifest(
                name=plan.name,
                architecture=arch,
                graph=graph,
                format_version=oldest_format(graph),
                tokenizer=TOKENIZER_FILE,
                weights=Weights(
                    dtype="float32" if quantize == "none" else "int8" if quantize in INT8_RECIPES else quantize,
                    quantization=recipe_description(quantize, tied=arch.tie_word_embeddings, int4=plan.int4),
                    tied_embedding_stored_once=arch.tie_word_embeddings,
                ),
                source=loaded.checkpoint.source | {"weights_file": loaded.checkpoint.weight_file},
                tools=tool_versions() | {"onnx_opset": OPSET},
                validation=validation,
                export_seconds=dict(stages.timings),
            )
        )
    except BaseException:
        writer.discard()
        raise
    # What was written reads back as the manifest says; recorded, so the first load need not hash it again
    # (runtime/package/verified.py).
    open_package(plan.output, verify="full")
    stages.done(f"{sum(f['size'] for f in manifest['files'].values()) / 1e6:.1f} MB")
    return manifest


def _cache(plan: ExportPlan, stages: Progress) -> dict:
    """Stage 7 (with a system prompt): its conversation start prefilled and stored in the package just written."""
    stages.start("cache", "prefilling the system prompt's conversation start")
    record = add_prompt_cache(plan.output, plan.system_prompt, plan.tools)
    stages.done(f"{record.tokens:,} of {record.shared_tokens:,} shared tokens in {record.file}")
    return open_package(plan.output, verify=False).manifest.to_dict()


def _eval_text(path, eval_tokens, quantize: str, validate: bool):
    """The evaluation text a quantized, validated export measures (EvalText), read and checked before any work;
    None for an export that measures none. Refuses a text or a size given to an export that would not use it."""
    if quantize == "none" or not validate:
        if path is not None or eval_tokens != DEFAULT_EVAL_TOKENS:
            why = "a float32 export (--quantize none)" if quantize == "none" else "an export with --no-validate"
            raise ExportError(
                f"--eval-text and --eval-tokens set the text a quantized package's quality report measures; {why} "
                "has no quality report."
            )
        return None
    check_eval_tokens(eval_tokens)
    return EvalText.read(DEFAULT_EVAL_TEXT if path is None else path)


def _optimize(model) -> bytes:
    """Check the graph (every weight read by an operator) and infer shapes; fails loudly here rather than at the
    user's first run. The weights are not written yet: the checker sees the external ones as graph inputs of the
    same type and shape."""
    import onnx

    read = {name for node in model.graph.node for name in node.input}
    unread = [t.name for t in model.graph.initializer if t.name not in read]
    if unread:  # onnxruntime would drop it, then refuse it by name where the weights are handed in from memory
        raise ExportError(f"the graph stores a weight no operator reads ({unread[0]}); {REPORT}.")
    model = onnx.shape_inference.infer_shapes(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    external = [t for t in probe.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    for tensor in external:
        probe.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
        probe.graph.initializer.remove(tensor)
    onnx.checker.check_model(probe)
    return model.SerializeToString()
