"""`export_model`: checkpoint in, model package out, in fixed named stages (CTranslate2's converter shape):

    load -> export -> optimize -> quantize (optional) -> validate -> save

Each stage reports to an optional `progress(stage, event, detail)` callback; the library never prints.
"""

import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

from edgelm.runtime.package.onnxruntime_compat import graph_minimum
from edgelm.runtime.quality.eval_text import DEFAULT_EVAL_TOKENS, EvalText, check_eval_tokens
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.package.format import (
    GENERATION_CONFIG,
    GRAPH_FILE,
    HF_CONFIG,
    KV_CACHES,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    Graph,
    Manifest,
    TensorInfo,
    Validation,
    Weights,
)
from edgelm.runtime.package.open import open_package
from edgelm.runtime.store.local import check_name

from .errors import ExportError
from .families import family_for
from .graph.contract import OPSET
from .int4 import Int4Options
from .load import load_checkpoint
from .quantize import INT8_RECIPES, RECIPES, recipe_description
from .weights_file import split_weights
from .writer import PackageWriter, check_destination, refuse_existing, sweep_partials

# The evaluation text a quantized package's quality report measures unless given another: package data.
DEFAULT_EVAL_TEXT = Path(__file__).resolve().parent / "data" / "persuasion-chapters-1-4.txt"
NOT_VALIDATED = "exported with --no-validate (validate=False): no comparison against PyTorch was made"
STAGES = ("load", "export", "optimize", "quantize", "validate", "save")
TOOLS = (
    "edgelm",
    "torch",
    "transformers",
    "onnx",
    "onnxruntime",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "numpy",
)


@dataclass
class ExportResult:
    path: Path
    manifest: dict


def default_output(model: str, quantize: str, kv_cache: str = "float32") -> Path:
    name = Path(model.rstrip("/")).name
    return Path("models") / (
        name + ("" if quantize == "none" else f"-{quantize}") + ("-kv8" if kv_cache == "int8" else "")
    )


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
    Int4Options())."""
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
        _check_chat_template(chat_template)
    text = _eval_text(eval_text, eval_tokens, quantize, validate)
    if output is None:  # a named package is written to models/NAME, where commands given NAME look
        output = Path("models") / check_name(name) if name is not None else default_output(model, quantize, kv_cache)
    output = Path(output)
    package_name = output.name if name is None else check_name(name)  # the model id servers answer to, the store name
    report = progress or (lambda stage, event, detail: None)
    sweep_partials(output)  # first, so a package a stopped export had moved aside is back before the checks
    refuse_existing(output, force)
    timings, stage_started = {}, {}

    def stage(name, event, detail=""):
        if event == "start":
            stage_started[name] = time.perf_counter()
        else:
            timings[name] = round(time.perf_counter() - stage_started[name], 3)
        report(name, event, detail)

    stage("load", "start", model)
    checkpoint = load_checkpoint(model, revision)
    tokenizer_json = _tokenizer_json(checkpoint.folder)
    tokenizer_config = _tokenizer_config(checkpoint.folder, chat_template)
    tokenizer = _tokenizer(tokenizer_json)
    eval_ids = text.tokens(tokenizer, eval_tokens) if text is not None else None  # refused here, before the work
    arch = checkpoint.arch
    generation_defaults = _generation_defaults(checkpoint)
    family = family_for(arch.model_type)
    # The PyTorch reference (and transformers' import, most of a small export's time) only for what needs it.
    reference = family.reference_model(checkpoint) if validate or kv_cache == "int8" else None
    weight_bytes = sum(w.nbytes for w in checkpoint.weights.values())
    stage("load", "done", f"{arch.n_layer} layers, {arch.n_embd} wide, {weight_bytes / 4e6:.1f} M parameters")
    check_destination(output, force, int(weight_bytes * (0.3 if quantize != "none" else 1.05)) + (1 << 20))

    stage("export", "start")
    fp32_decoder = family.build_decoder(arch, checkpoint.weights, "none")
    stage("export", "done", f"{len(fp32_decoder.model.graph.node)} nodes, opset {OPSET}")

    stage("optimize", "start")
    fp32_graph = split_weights(_optimize(fp32_decoder.model), fp32_decoder.arrays)
    del fp32_decoder
    stage("optimize", "done", "checked, shapes inferred")

    shipped = fp32_graph  # what is written: model.onnx and model.onnx.data
    if quantize != "none":
        what = (
            quantize
            if int4 is None
            else f"int4 ({int4.method}, blocks of {int4.block_size}, {int4.head_bits}-bit head)"
        )
        stage("quantize", "start", what + (" weights, int8 KV cache" if kv_cache == "int8" else ""))
        scales = None
        if kv_cache == "int8":
            scales = family.kv_cache_scales(reference, tokenizer, arch)
        if int4 is not None and int4.method == "gptq":
            from .gptq import with_hessians

            int4 = with_hessians(int4, fp32_graph, tokenizer, arch)
        decoder = family.build_decoder(arch, checkpoint.weights, quantize, scales, int4=int4)
        shipped = split_weights(_optimize(decoder.model), decoder.arrays)
        del decoder
        stage("quantize", "done", f"{shipped.size / 1e6:.1f} MB of weights")

    if validate:
        from .validate import validate_stage

        validation = Validation.from_dict(
            validate_stage(shipped, fp32_graph, reference, tokenizer, arch, quantize, stage, family, text, eval_ids)
        )
    else:
        validation = Validation({}, skipped=NOT_VALIDATED)

    stage("save", "start", str(output))
    writer = PackageWriter(output)
    try:
        writer.write_bytes(GRAPH_FILE, shipped.graph)
        writer.write_chunks(WEIGHTS_FILE, shipped.chunks())
        writer.write_bytes(TOKENIZER_FILE, tokenizer_json.encode())
        for name in (HF_CONFIG, GENERATION_CONFIG, "tokenizer_config.json", "special_tokens_map.json"):
            if (checkpoint.folder / name).exists():
                writer.copy(name, checkpoint.folder / name)
        if tokenizer_config is not None:  # without auto_map, with the chat template
            writer.write_json("tokenizer_config.json", tokenizer_config)
        if generation_defaults is not None:  # the checkpoint has none
            writer.write_json(GENERATION_CONFIG, generation_defaults)
        manifest = writer.publish(
            Manifest(
                name=package_name,
                architecture=arch,
                graph=_graph_section(shipped, kv_cache),
                tokenizer=TOKENIZER_FILE,
                weights=Weights(
                    dtype="float32" if quantize == "none" else "int8" if quantize in INT8_RECIPES else quantize,
                    quantization=recipe_description(quantize, tied=arch.tie_word_embeddings, int4=int4),
                    tied_embedding_stored_once=arch.tie_word_embeddings,
                ),
                source=checkpoint.source | {"weights_file": checkpoint.weight_file},
                tools=_tool_versions() | {"onnx_opset": OPSET},
                validation=validation,
                export_seconds=dict(timings),
            )
        )
    except BaseException:
        writer.discard()
        raise
    # What was written reads back as the manifest says; recorded, so the first load need not hash it again
    # (runtime/package/verified.py).
    open_package(output, verify="full")
    stage("save", "done", f"{sum(f['size'] for f in manifest['files'].values()) / 1e6:.1f} MB")
    return ExportResult(output, manifest)


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
    """Check the graph and infer shapes; fails loudly here rather than at the user's first run. The weights are
    not written yet: the checker sees the external ones as graph inputs of the same type and shape."""
    import onnx

    model = onnx.shape_inference.infer_shapes(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    external = [t for t in probe.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    for tensor in external:
        probe.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
        probe.graph.initializer.remove(tensor)
    onnx.checker.check_model(probe)
    return model.SerializeToString()


def _generation_defaults(checkpoint) -> dict | None:
    """The generation_config.json to write when the checkpoint has none (its bos id and every end-of-text id
    config.json names: Llama 3's are a list), else None (its own is copied). Either is checked as the runtime
    will read it (every end-of-text id in the vocabulary, each setting in range): ExportError before anything is
    written."""
    path, arch = checkpoint.folder / GENERATION_CONFIG, checkpoint.arch
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            raise ExportError(f"{path} is not readable JSON ({str(error)[:120]}); fix or remove it.") from None
        if not isinstance(data, dict):
            raise ExportError(
                f"{path} holds a JSON {type(data).__name__}, not an object of settings; fix or remove it."
            )
        written, where = None, path
    else:
        eos = checkpoint.config.get("eos_token_id", arch.eos_token_id)
        data = written = {"bos_token_id": arch.bos_token_id, "eos_token_id": eos}
        where = checkpoint.folder / "config.json"
    try:
        GenerationConfig.from_generation_config_json(data, arch.eos_token_id, arch.pad_token_id, arch.vocab_size)
    except (GenerationOptionError, TypeError, ValueError) as error:
        raise ExportError(
            f"{where} holds a generation setting edgelm cannot use: {str(error)[:200]}. Fix it."
        ) from None
    return written


def _graph_section(shipped, kv_cache: str) -> Graph:
    import onnx

    model = onnx.load_model_from_string(shipped.graph)
    uses = {(n.op_type, None) for n in model.graph.node} | {
        (n.op_type, a.name) for n in model.graph.node for a in n.attribute
    }

    def describe(value) -> TensorInfo:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        return TensorInfo(dtype, tuple(d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim))

    return Graph(
        file=GRAPH_FILE,
        opset=OPSET,
        inputs={v.name: describe(v) for v in model.graph.input},
        outputs={v.name: describe(v) for v in model.graph.output},
        kv_cache_in_place=True,  # past and present may be bound to one [batch, heads, capacity, head_size] buffer
        weights_file=WEIGHTS_FILE,
        token_embeddings=shipped.token_embeddings,
        kv_cache=_kv_cache_description(kv_cache),
        min_onnxruntime=graph_minimum(uses),  # measured per operator: runtime/package/onnxruntime_compat.py
    )


def _kv_cache_description(kv_cache: str) -> dict:
    if kv_cache == "float32":
        return {"dtype": "float32"}
    from .calibrate import HEADROOM

    return {
        "dtype": "int8",
        "scales": f"fixed, one per head and channel ({HEADROOM} x the largest |K| or |V| seen / 127), calibrated at export on the PyTorch reference (export/calibrate.py); larger values are clipped",
        "op": "GroupQueryAttention kv_cache_bit_width 8, PER_CHANNEL",
    }


def _tokenizer(tokenizer_json: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as error:  # tokenizers raises a bare Exception for a damaged file
        raise ExportError(
            f"the checkpoint's tokenizer cannot be read: {str(error)[:200]}. Save it again with the model (tokenizer.save_pretrained)."
        ) from None


def _check_chat_template(source) -> None:
    from edgelm.runtime.errors import ChatError
    from edgelm.runtime.text.chat_template import compile_template

    try:
        compile_template(source, "the chat template given")
    except ChatError as error:
        raise ExportError(str(error)) from None


def _tokenizer_config(folder: Path, chat_template: str | None) -> dict | None:
    """The checkpoint's tokenizer_config.json as the package ships it: without `auto_map` (the package ships no
    Python code for it to name) and with `chat_template` set (the one given, else the checkpoint's
    chat_template.jinja, where transformers saves a template beside it). None when it can be copied as it is."""
    jinja = folder / "chat_template.jinja"
    if chat_template is None and jinja.is_file():
        try:
            chat_template = jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ExportError(f"cannot read {jinja}: {error}") from None
        _check_chat_template(chat_template)
    path = folder / "tokenizer_config.json"
    config = None
    if path.exists():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            if chat_template is None:
                return None  # not JSON: copied as it is; the package's tokenizer is tokenizer.json
            raise ExportError(f"cannot read {path} to set its chat template: {error}") from None
        if not isinstance(config, dict):
            if chat_template is None:
                return None
            raise ExportError(f"{path} does not hold a JSON object; fix or remove it.")
    if chat_template is None and (config is None or "auto_map" not in config):
        return None
    config = {k: v for k, v in (config or {}).items() if k != "auto_map"}
    return config | ({"chat_template": chat_template} if chat_template is not None else {})


def _tokenizer_json(folder: Path) -> str:
    if (folder / "tokenizer.json").exists():
        return (folder / "tokenizer.json").read_text(encoding="utf-8")
    if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        # GPT-2's own tokenizer class, never AutoTokenizer: an auto_map or a custom tokenizer_class in
        # tokenizer_config.json would make transformers offer to import Python files from the checkpoint.
        from transformers import GPT2TokenizerFast

        try:
            tokenizer = GPT2TokenizerFast.from_pretrained(str(folder), trust_remote_code=False)
        except Exception as error:  # transformers raises many types for damaged vocab or merges files
            raise ExportError(
                f"the checkpoint's vocab.json / merges.txt cannot be read ({type(error).__name__}: {str(error)[:200]}); "
                "save the tokenizer again with the model (tokenizer.save_pretrained)."
            ) from None
        return tokenizer.backend_tokenizer.to_str()
    raise ExportError(f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json with merges.txt.")


def _tool_versions() -> dict:
    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
