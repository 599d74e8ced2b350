"""The model package format, written once: its file names and constants, the graph's input and output names, the
manifest as typed sections (architecture.py, graph_section.py, sections.py, their JSON values read by fields.py),
the files a package must list, and the text `edgelm info` prints. `edgelm export` builds a Manifest and writes
`to_dict()`; the runtime reads one with `Manifest.from_dict`, which checks every type and range, and uses nothing
it has not checked. Standard library only: the launcher reads a manifest
before anything heavy is imported.

A package folder (format_version 2) holds, each listed in manifest.json's `files` with its size and sha256:

    model.onnx               the decoder graph (graph.file); its weights live in
    model.onnx.data          ONNX external data (graph.weights_file), large tensors at 64 KiB-aligned offsets;
                             int8 packages also read token rows from it (graph.token_embeddings)
    tokenizer.json           the fast tokenizer (tokenizer)
    generation_config.json   generation defaults, transformers' format
    config.json, ...         the checkpoint's own files, copied as they were
    prompt_cache.kv          with `edgelm export --system-prompt`: the prefilled rows of the start every chat with
                             that system prompt shares (prompt_cache; runtime/batching/package_prefix.py)

Every name is a plain file name inside the folder: no folders, no '..', no absolute paths.
"""

import math
from dataclasses import dataclass, field

from .architecture import Architecture
from .fields import FormatError, _get, _int, _object, _str, file_name
from .graph_section import Graph, Region, TensorInfo, TokenTable
from .sections import FileRecord, PromptCacheRecord, Validation, Weights

MANIFEST = "manifest.json"
FORMAT = "edgelm-package"
FORMAT_VERSION = 3  # 2: weights in model.onnx.data, int8 graphs take inputs_embeds; 3: the token table in blocks
OLDEST_VERSION = 1
GRAPH_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG = "generation_config.json"
PROMPT_CACHE_FILE = "prompt_cache.kv"
HF_CONFIG = "config.json"  # the checkpoint's config: all an optimum folder is described by
ALIGN = 65536  # offsets of large tensors and of the token table: onnxruntime maps aligned external data
TOKEN_ROWS, TOKEN_SCALE = "transformer.wte.weight_int8", "transformer.wte.weight_scale"  # + ".{part}"
KV_CACHES = ("float32", "int8")  # the key/value cache storage a graph may have (`edgelm export --kv-cache`)
# The graph's inputs and outputs by name (docs/package-format.md): export/graph/contract.py declares them, the
# engine (runtime/engine) feeds and reads them. An optimum folder's graph has the same names.
INPUT_IDS, INPUTS_EMBEDS = "input_ids", "inputs_embeds"  # the tokens: their ids, or their rows (int8 packages)
ATTENTION_MASK, POSITION_IDS, LOGITS_TO_KEEP = "attention_mask", "position_ids", "logits_to_keep"
LOGITS = "logits"
PAST, PRESENT = "past_key_values.", "present."  # the cache in and out: PAST + "{layer}.key", PRESENT + "{layer}.value"


def past_name(layer: int, kind: str) -> str:
    """The cache input of `layer`, kind "key" or "value": past_key_values.{layer}.{kind}."""
    return f"{PAST}{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    """The cache output of `layer`, kind "key" or "value": present.{layer}.{kind}."""
    return f"{PRESENT}{layer}.{kind}"


# Packages of earlier edgelm releases have graphs that also make "sampling outputs" (the last position's softmax
# weights in blocks, and their sums) for the first R rows of this overridable initializer, [R, 1] float32. The
# sampler computes from the logits alone: the runtime feeds it zero rows, so such a graph makes none
# (docs/package-format.md).
SAMPLING_TEMPERATURE = "sampling_temperature"


MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB
MAX_JSON_BYTES = 64 << 20  # config.json, generation_config.json, tokenizer.json of a folder without records

__all__ = [
    "ALIGN",
    "Architecture",
    "FileRecord",
    "FormatError",
    "Graph",
    "Manifest",
    "PromptCacheRecord",
    "Region",
    "TensorInfo",
    "TokenTable",
    "Validation",
    "Weights",
    "describe",
    "file_name",
    "oldest_format",
]


def oldest_format(graph) -> int:
    """The format version a package with this graph is written as: the oldest that describes it, so that an older
    edgelm runs every package it can and tells the user to upgrade for the others (a token table in blocks)."""
    table = graph.token_embeddings
    return 3 if table is not None and table.block else 2


def check_format(data) -> dict:
    """The manifest's own format and version; raises FormatError (with its own advice) for anything else."""
    data = _object("the manifest", data)
    if data.get("format") != FORMAT:
        raise FormatError(f"not an edgelm manifest (format is {data.get('format')!r})", advice="")
    version = data.get("format_version")
    _int("format_version", version, 0)
    if version > FORMAT_VERSION:
        raise FormatError(
            f"the package uses package format {version}, newer than this edgelm reads ({FORMAT_VERSION})",
            advice="Upgrade edgelm: pip install -U edgelm",
        )
    if version < OLDEST_VERSION:
        raise FormatError(f"format_version {version} is not a format edgelm ever wrote")
    return data


@dataclass(frozen=True)
class Manifest:
    """manifest.json: what a package holds and how it was made."""

    name: str
    architecture: Architecture
    graph: Graph
    weights: Weights
    validation: Validation
    files: dict = field(default_factory=dict)  # name -> FileRecord: every file the runtime may read
    tokenizer: str = TOKENIZER_FILE
    source: dict = field(default_factory=dict)  # where the checkpoint came from
    tools: dict = field(default_factory=dict)  # the versions that made the package
    export_seconds: dict = field(default_factory=dict)
    created: str = ""
    format_version: int = FORMAT_VERSION
    prompt_cache: PromptCacheRecord | None = None  # a system prompt's prefilled rows (edgelm export --system-prompt)

    def required_files(self) -> dict:
        """What the runtime reads, by the field that names it: each must be listed in `files`."""
        needed = {"graph.file": self.graph.file, "tokenizer": self.tokenizer, "generation defaults": GENERATION_CONFIG}
        if self.graph.weights_file is not None:
            needed["graph.weights_file"] = self.graph.weights_file
        if self.graph.token_embeddings is not None:
            needed["graph.token_embeddings.file"] = self.graph.token_embeddings.file
        if self.prompt_cache is not None:
            needed["prompt_cache.file"] = self.prompt_cache.file
        return needed

    @classmethod
    def from_dict(cls, data) -> "Manifest":
        """Check a manifest read from JSON against the format, all of it, before anything uses it."""
        data = check_format(data)
        arch = _get("", data, "architecture", lambda w, v: Architecture.from_dict(v, "architecture"))
        files = {
            file_name(f"files key {name!r}", name): FileRecord.from_dict(record, f"files[{name!r}]")
            for name, record in _get("", data, "files", _object).items()
        }
        manifest = cls(
            name=_get("", data, "name", _str, ""),
            architecture=arch,
            graph=_get("", data, "graph", lambda w, v: Graph.from_dict(v, "graph", arch)),
            weights=_get("", data, "weights", lambda w, v: Weights.from_dict(v, "weights")),
            validation=_get("", data, "validation", lambda w, v: Validation.from_dict(v, "validation"), Validation({})),
            files=files,
            tokenizer=_get("", data, "tokenizer", lambda w, v: file_name("tokenizer", v)),
            source=_get("", data, "source", lambda w, v: _object("source", v), {}),
            tools=_get("", data, "tools", lambda w, v: _object("tools", v), {}),
            export_seconds=_get("", data, "export_seconds", lambda w, v: _object("export_seconds", v), {}),
            created=_get("", data, "created", lambda w, v: _str("created", v), ""),
            format_version=data["format_version"],
            prompt_cache=_get("", data, "prompt_cache", lambda w, v: PromptCacheRecord.from_dict(v, w), None),
        )
        for role, name in manifest.required_files().items():
            if name not in files:
                raise FormatError(f"files does not list {name!r} ({role}), which the runtime reads")
        table = manifest.graph.token_embeddings
        if table is not None:
            for part, region in (("rows", table.rows), ("scale", table.scale)):
                if region.offset + region.nbytes > files[table.file].size:
                    raise FormatError(f"graph.token_embeddings.{part} ends past the end of {table.file}")
        return manifest

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "name": self.name,
            "architecture": self.architecture.to_dict(),
            "graph": self.graph.to_dict(),
            "tokenizer": self.tokenizer,
            "weights": self.weights.to_dict(),
            "source": self.source,
            "tools": self.tools,
            "validation": self.validation.to_dict(),
            "export_seconds": self.export_seconds,
            "files": {name: record.to_dict() for name, record in self.files.items()},
            "created": self.created,
        } | ({"prompt_cache": self.prompt_cache.to_dict()} if self.prompt_cache is not None else {})


def describe(
    name: str,
    kind: str,
    folder,
    arch: Architecture,
    manifest: Manifest | None = None,
    eos_ids: tuple | None = None,
    needs_here: tuple | None = None,
) -> str:
    """What `edgelm info` prints about a package: architecture, weights, files and validation figures. eos_ids: the
    end-of-text ids generation_config.json lists, where it lists them (generation stops at any), else arch's.
    needs_here: (onnxruntime version, machine) where the machine needs a newer release than the manifest says."""
    a = arch
    eos = ", ".join(map(str, eos_ids)) if eos_ids else a.eos_token_id
    lines = [
        f"{name}  ({kind} package at {folder})",
        f"  architecture  {a.model_type}: {a.n_layer} layers, {a.n_head} heads x {a.head_size}, width {a.n_embd}, "
        f"{a.n_positions} positions, vocab {a.vocab_size}, eos {eos}",
    ]
    if a.model_type == "gpt2":
        head = "tied to the token embedding" if a.tie_word_embeddings else "a matrix of its own (untied)"
        lines.append(
            f"  blocks        MLP {a.mlp_width} wide, {a.activation_function}; attention scale "
            f"{a.attention_scale_rule()}; LM head {head}"
        )
    if a.positions != "learned":
        lines.append("  family        " + family_summary(a))
    if manifest is None:
        return "\n".join(lines)
    m, g = manifest, manifest.graph
    lookup = f", token rows read from {g.token_embeddings.file} by the runtime" if g.token_embeddings else ""
    source = m.source.get("hub_id") or m.source.get("local_folder") or m.source.get("local_path") or ""
    head = "tied embedding stored once" if a.tie_word_embeddings else "token embedding and LM head stored apart"
    lines += [
        f"  weights       {m.weights.dtype} ({m.weights.quantization.get('weights')}), {head}{lookup}",
        f"  KV cache      {g.kv_cache_dtype}, updated in place: {g.kv_cache_in_place}",
        *(
            [f"  onnxruntime   {needs_here[0]} or newer on {needs_here[1]}, {g.min_onnxruntime} elsewhere"]
            if needs_here
            else [f"  onnxruntime   {g.min_onnxruntime} or newer"]
            if g.min_onnxruntime
            else []
        ),
        f"  source        {source} {m.source.get('revision') or ''}".rstrip(),
        "  files         " + ", ".join(f"{n} {f.size / 1e6:.1f} MB" for n, f in m.files.items()),
        *_prompt_cache(m),
    ]
    v = m.validation
    if v.skipped is not None:
        lines.append(f"  validation    not validated against PyTorch: {v.skipped}")
        return "\n".join(lines + _tools(m))
    fp32 = v.figures.get("fp32", {})
    lines.append(
        f"  fp32 parity   max logits rel. error {_figure(fp32, 'max_logits_relative_error', '.1e')}, cache path "
        f"{_figure(fp32, 'max_cache_path_relative_error', '.1e')}, greedy identical {fp32.get('greedy_identical')}"
    )
    if v.text is not None:
        t = v.text
        lines.append(
            f"  eval text     {t.name}: its first {t.measured_tokens:,} of {t.tokens:,} tokens (sha256 {t.sha256[:12]}...)"
        )
    for recipe, figures in v.quality.items():
        lines += figure_lines(recipe, figures.to_dict(), a.vocab_size, v.reference or "the reference")
    for recipe, r in v.figures.items():  # a package measured before the evaluation text: its figures as they were
        if recipe == "fp32":
            continue
        cached = (
            f", through the cache {_figure(r, 'cache_path_mean_kl_divergence', '.4f')}"
            if "cache_path_mean_kl_divergence" in r
            else ""
        )
        lines.append(
            f"  {recipe} quality  top-1 {_figure(r, 'top1_agreement', '.3f')}, mean KL {_figure(r, 'mean_kl_divergence', '.4f')}"
            f"{cached}, greedy agreement {_figure(r, 'greedy_agreement', '.3f')}, perplexity "
            f"{_figure(r, 'perplexity_reference', '.2f')} -> {_figure(r, 'perplexity', '.2f')} ({_figure(r, 'perplexity_change', '+.2%')})"
            f" on a {r.get('held_out_tokens', '?')}-token paragraph (an older export's report)"
        )
    return "\n".join(lines + _tools(m))


def figure_lines(recipe: str, figures: dict, vocab_size: int, against: str, beside: dict | None = None) -> list:
    """A heading, then one line per quality figure of `recipe` (QualityFigures' keys, runtime/quality/measure.py's
    measure) against the reference `against` names: KL and top-1 first, then through the cache, greedy agreement
    and perplexity. `beside`: figures to show after each, in brackets (edgelm verify --quality: the manifest's
    beside the ones just measured)."""
    rows = [f"  {recipe} quality  against {against}, windows of {_count(figures, 'window')} tokens"]
    if beside is not None:
        rows[0] += "; [the manifest's figures]"

    def add(label, text, short, note=""):
        rows.append(f"    {label:<11} {text(figures)}{note}" + (f"   [{short(beside)}]" if beside is not None else ""))

    cache = lambda g: g.get("cache_path", {})  # noqa: E731
    greedy = lambda g: g.get("greedy", {})  # noqa: E731
    kl = lambda g: _figure(g, "mean_kl_divergence", ".4f")  # noqa: E731
    top1 = lambda g: _figure(g, "top1_agreement", ".4f")  # noqa: E731
    add("mean KL", lambda g: f"{kl(g)} over {_count(g, 'tokens')} tokens", kl)
    add("top-1", lambda g: f"{top1(g)} over {_count(g, 'tokens')} tokens", top1)
    add(
        "cache path",
        lambda g: (
            f"mean KL {kl(cache(g))}, top-1 {top1(cache(g))} over {_count(cache(g), 'tokens')} tokens decoded "
            f"one at a time through the cache ({g.get('kv_cache', '?')})"
        ),
        lambda g: f"{kl(cache(g))}, {top1(cache(g))}",
    )
    same = lambda g: f"{_count(greedy(g), 'identical')} of {_count(greedy(g), 'continuations')}"  # noqa: E731
    prefix = lambda g: _figure(greedy(g), "prefix_agreement", ".3f")  # noqa: E731
    equal = lambda g: _figure(greedy(g), "token_agreement", ".3f")  # noqa: E731
    add(
        "greedy",
        lambda g: (
            f"{same(g)} continuations identical ({_count(greedy(g), 'tokens_each')} tokens from "
            f"{_count(greedy(g), 'prompt_tokens')}-token prompts), {prefix(g)} before the first difference, "
            f"{equal(g)} of tokens equal"
        ),
        lambda g: f"{same(g)}, {prefix(g)}, {equal(g)}",
    )
    ppl = lambda g: (  # noqa: E731
        f"{_figure(g, 'perplexity_reference', '.2f')} -> {_figure(g, 'perplexity', '.2f')} "
        f"({_figure(g, 'perplexity_change', '+.2%')})"
    )
    random = figures.get("perplexity_meaningful") is False
    note = "; means nothing for this checkpoint: the reference's is above a tenth of the vocabulary "
    note += f"({vocab_size:,}), as random weights' is"
    add("perplexity", lambda g: f"{ppl(g)} over {_count(g, 'tokens')} tokens", ppl, note if random else "")
    return rows


def _count(figures: dict, key: str) -> str:
    value = figures.get(key)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"


def family_summary(a: Architecture) -> str:
    """The Llama family's choices in one line: norm, MLP, rotary, key/value heads, head, biases."""
    norm = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[a.norm]
    mlp = "SwiGLU MLP (silu)" if a.activation_function == "silu" else f"{a.activation_function} MLP"
    mlp += f" {a.mlp_width} wide"
    rope = f"rope theta {a.rope_theta:g}"
    if a.rope_scaling:
        kind = a.rope_scaling.get("rope_type", a.rope_scaling.get("type"))
        factor = a.rope_scaling.get("factor")
        rope += f" ({kind} scaling" + (f" x{factor:g}" if isinstance(factor, (int, float)) else "") + ")"
    kv = a.kv_heads
    heads = f"{kv} KV heads (grouped, {a.n_head // kv} per KV head)" if kv < a.n_head else f"{kv} KV heads"
    biases = "biases on " + ", ".join(a.biases) if a.biases else "no biases"
    return f"{norm}, {mlp}, {rope}, {heads}, {'tied' if a.tie_word_embeddings else 'untied'} LM head, {biases}"


def _figure(figures: dict, key: str, spec: str) -> str:
    value = figures.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, spec)
    return "?" if value is None else str(value)


def _prompt_cache(m: Manifest) -> list:
    """The prompt cache's line: what it covers and what it holds."""
    c = m.prompt_cache
    if c is None:
        return []
    tools = f", tools {', '.join(c.tools)} (sha256 {c.tools_sha256[:12]}...)" if c.tools_sha256 else ", no tools"
    return [
        f"  prompt cache  {c.tokens:,} of the {c.shared_tokens:,} tokens every chat with its system prompt starts with "
        f"({m.files[c.file].size:,} bytes in {c.file}, {m.graph.kv_cache_dtype}): system prompt sha256 "
        f"{c.system_prompt_sha256[:12]}...{tools}"
    ]


def _tools(m: Manifest) -> list:
    return ["  made with     " + ", ".join(f"{k} {v}" for k, v in m.tools.items() if v is not None)] if m.tools else []
