"""Stage 5, validate: run the exported graph through edgelm's own runtime engine and compare it with the
same checkpoint run by transformers in PyTorch.

fp32 is a gate on a fixed set of cases (export fails, nothing is written, when it misses); a quantized graph
(int8 or int4, with or without an int8 KV cache) gets a quality report on the evaluation text
(runtime/quality/eval_text.py), its figures computed by runtime/quality/measure.py, the same code `edgelm verify --quality` runs.
Relative error is max |ours - reference| / max |reference| over real (unpadded) positions.
"""

import numpy as np
import onnxruntime as ort
from edgelm.runtime.engine.decode import Engine, left_pad, position_ids_from_mask
from edgelm.runtime.engine.session import graph_io
from edgelm.runtime.quality.measure import Plan, cache_path_logits, greedy_tokens, measure

from .errors import ParityError
from .weights_file import ShippedGraph

FP32_TOLERANCE = 1e-5
GREEDY_TOKENS = 16
# The longest case's prompt: near the position limit, up to this many tokens. PyTorch's eager attention holds
# [heads, T, T] scores per layer: 32K positions (Qwen2.5) would need 60 GB; 2048 need 235 MB.
LONGEST_CASE = 2048
PROMPTS = (
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "import numpy as np\n",
    "Émile a visité 東京 🚀",
)


def validation_cases(tokenizer, arch, rng_seed: int = 0) -> dict:
    """The fixed set: one-token prompt, text prompts, a prompt near the position limit, a padded batch."""
    rng = np.random.default_rng(rng_seed)
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    start = arch.bos_token_id if arch.bos_token_id is not None else 0
    near_limit = rng.integers(0, arch.vocab_size, size=min(arch.n_positions, LONGEST_CASE) - 4).tolist()
    return {
        "one_token": [[start]],
        **{f"text_{i}": [encode(text)] for i, text in enumerate(PROMPTS)},
        "near_limit": [near_limit],
        "padded_batch": [encode(PROMPTS[0]), encode(PROMPTS[1]), [start] + encode(PROMPTS[3])],
    }


def _torch_logits(model, rows):
    import torch

    ids, mask = left_pad(rows, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(position_ids_from_mask(mask)),
        )
    return out.logits.float().numpy(), mask


def _torch_greedy(model, rows, new_tokens, eos):
    """transformers' own greedy generate of exactly new_tokens (end-of-text held back until then): the tokens
    ours are compared with."""
    import torch

    ids, mask = left_pad(rows, 0)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=eos,
        )
    return out[:, ids.shape[1] :].numpy()


def _engine(graph, arch, in_place: bool = False) -> Engine:
    """graph: ONNX bytes with the weights inside, or a ShippedGraph, whose model.onnx.data is not written yet:
    its weights are handed to onnxruntime from memory.

    Handed over as external initializers, onnxruntime copies the weights into the session (and prepacks them);
    onnxruntime 1.32 refuses in-memory references in a model, and reads an initializer given in place only where
    the graph holds one. in_place=True, for the float32 check, computes on the arrays themselves instead: the
    graph declares the weights as inputs and every run feeds them (gpt2-xl's float32 weights are 6 GB; the
    check would hold them twice). The operators are the same; the quantized graphs keep initializers and
    prepacking, which select the kernels the runtime runs (MatMulNBits' int8-activation one among them)."""
    import onnx

    options = ort.SessionOptions()
    options.log_severity_level = 3
    embeddings, fed = None, {}
    if isinstance(graph, ShippedGraph):
        embeddings = graph.embeddings()
        if in_place:
            model = onnx.load_model_from_string(graph.graph)
            for tensor in [t for t in model.graph.initializer if t.name in graph.weights]:
                model.graph.initializer.remove(tensor)
                model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
            fed, graph = graph.weights, model.SerializeToString()
        else:
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in graph.weights.values()]
            options.add_external_initializers(list(graph.weights), values)
            graph = graph.graph
    session = ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
    io = graph_io(session, arch.n_layer, kv_cache_in_place=True)
    engine = Engine(session, io, arch.kv_heads, arch.head_size, arch.vocab_size, "cpu", embeddings)
    if fed:
        engine.runner = _Fed(engine.runner, fed)
    return engine


class _Fed:
    """A runner (runtime/engine/fast_path.py: value, run, bind) that feeds `weights` {name: array} with every run,
    borrowed: the arrays must outlive it."""

    def __init__(self, runner, weights: dict):
        self.runner = runner
        self.weights = {name: runner.value(array) for name, array in weights.items()}

    def value(self, array, device: str = "cpu"):
        return self.runner.value(array, device)

    def run(self, feeds: dict, output_names: list) -> list:
        return self.runner.run(feeds | self.weights, output_names)

    def bind(self, input_names: list, outputs: dict):
        bound, weights = self.runner.bind([*input_names, *self.weights], outputs), list(self.weights.values())
        return lambda inputs: bound([*inputs, *weights])


def _ours_greedy(engine, rows, new_tokens, arch):
    return greedy_tokens(engine, rows, new_tokens, arch.eos_token_id)


def _relative_error(ours, reference, mask, positions_at_once: int = 64):
    """max |ours - reference| / max |reference| over the real positions of [B, T, V] logits, a few positions at
    a time: a 2,048-token case of a 128K vocabulary is 1 GB of logits, and each whole-array step would copy it."""
    errors, scales = [], []  # np.max of these keeps a NaN, which must fail the check
    for b in range(mask.shape[0]):
        real = np.flatnonzero(mask[b])
        for start in range(0, len(real), positions_at_once):
            at = real[start : start + positions_at_once]
            errors.append(np.abs(ours[b, at] - reference[b, at]).max())
            scales.append(np.abs(reference[b, at]).max())
    error, scale = float(np.max(errors)), float(np.max(scales))
    if scale == 0:  # all-zero reference logits (a token whose embedding is zero): equal, or infinitely far
        return 0.0 if error == 0 else float("inf")
    return error / scale


def check_fp32(graph, model, tokenizer, arch, step=None) -> dict:
    """Full logits, cache path and greedy tokens against PyTorch; raises ParityError past the tolerance.
    step(detail), if given, hears of each case as it starts."""
    engine = _engine(graph, arch, in_place=True)
    report = {"tolerance": FP32_TOLERANCE, "cases": {}}
    cases = validation_cases(tokenizer, arch)
    for number, (name, rows) in enumerate(cases.items(), 1):
        if step is not None:
            step(f"fp32 parity, case {number} of {len(cases)} ({name})")
        reference, mask = _torch_logits(model, rows)
        ids, _ = left_pad(rows, 0)
        full, _ = engine.forward(
            ids, mask, position_ids_from_mask(mask), engine.empty_past(len(rows)), logits_to_keep=0
        )
        logits_error = _relative_error(full, reference, mask)
        del full  # [B, T, V] each: 1 GB at 2,048 tokens of a 128K vocabulary, not kept through the passes below
        cached = cache_path_logits(engine, ids, mask)
        cache_error = _relative_error(cached, reference[:, -cached.shape[1] :], mask[:, -cached.shape[1] :])
        del reference
        new_tokens = min(GREEDY_TOKENS, arch.n_positions - ids.shape[1])
        ours_tokens, torch_tokens = (
            _ours_greedy(engine, rows, new_tokens, arch),
            _torch_greedy(model, rows, new_tokens, arch.eos_token_id),
        )
        case = {
            "prompt_tokens": [len(r) for r in rows],
            "logits_relative_error": logits_error,
            "cache_path_relative_error": cache_error,
            "greedy_tokens": int(new_tokens),
            "greedy_identical": bool(np.array_equal(ours_tokens, torch_tokens)),
        }
        report["cases"][name] = case
        errors = (case["logits_relative_error"], case["cache_path_relative_error"])
        # `not error <= limit` rather than `error > limit`: NaN compares false either way and must fail
        if not all(error <= FP32_TOLERANCE for error in errors) or not case["greedy_identical"]:
            raise ParityError(
                f"fp32 parity failed on case '{name}': logits relative error {case['logits_relative_error']:.2e}, "
                f"cache path {case['cache_path_relative_error']:.2e} (limit {FP32_TOLERANCE:.0e}), greedy identical: "
                f"{case['greedy_identical']}. No package was written; please report this with the checkpoint's config.json."
            )
    report["max_logits_relative_error"] = max(c["logits_relative_error"] for c in report["cases"].values())
    report["max_cache_path_relative_error"] = max(c["cache_path_relative_error"] for c in report["cases"].values())
    report["greedy_identical"] = True
    return report


class TorchSide:
    """The checkpoint in PyTorch as the reference side of runtime/quality/measure.py's `measure`: window logits for a
    batch of equal-length windows in one pass, greedy continuations from transformers' generate."""

    def __init__(self, model, eos_token_id):
        self.model, self.eos_token_id = model, eos_token_id

    def logits(self, windows: np.ndarray) -> np.ndarray:
        """[B, T] ids (no padding) -> [B, T, V] float32 logits."""
        logits, _ = _torch_logits(self.model, [list(w) for w in windows])
        return logits

    def greedy(self, prompts: list, new_tokens: int) -> np.ndarray:
        """Equal-length prompts -> [N, new_tokens]: the argmax of each step, end-of-text held back, through
        transformers' cache. The tokens of transformers' generate (min_new_tokens = max_new_tokens), without its
        attention mask: the prompts are unpadded, and building that mask each step was most of the time."""
        import torch

        eos = [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id or ())
        tokens, past, step = [], None, torch.tensor(prompts, dtype=torch.int64)
        with torch.no_grad():
            for _ in range(new_tokens):
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
                logits = out.logits[:, -1].float()
                logits[:, eos] = -torch.inf
                step, past = logits.argmax(-1, keepdim=True), out.past_key_values
                tokens.append(step)
        return torch.cat(tokens, dim=1).numpy()


def checkpoint_reference(folder) -> tuple:
    """A checkpoint folder as the reference of `edgelm verify --quality`: (its TorchSide, its Architecture as
    a manifest records it, its tokenizer's JSON text), for the runtime to check against the package's."""
    from .families import family_for
    from .load import load_checkpoint
    from .checkpoint_files import tokenizer_json

    checkpoint = load_checkpoint(str(folder), None)
    model = family_for(checkpoint.arch.model_type).reference_model(checkpoint)
    return TorchSide(model, checkpoint.arch.eos_token_id), checkpoint.arch.to_dict(), tokenizer_json(checkpoint.folder)


def quality_report(graph, model, arch, ids, prefix=(), step=None) -> dict:
    """How far a quantized graph is from the PyTorch reference on the evaluation text's token ids (the first
    eval_tokens of it, `prefix` before each window and prompt): runtime/quality/measure.py's figures, and the KV cache
    the graph keeps. step(detail), if given, hears where the measurement is."""
    engine = _engine(graph, arch)
    plan = Plan.for_context(arch.n_positions)
    side = TorchSide(model, arch.eos_token_id)
    figures = measure(side, engine, ids, plan, arch.eos_token_id, prefix, progress=step)
    return _finite(figures | {"kv_cache": engine.io.cache_dtype})


def validate_package(shipped, fp32_graph, reference, tokenizer, arch, family, quantize, text, eval_ids,
                     step=None) -> dict:  # fmt: skip
    """The validate stage's work: fp32 parity against transformers, and the quantized package's quality figures on
    the evaluation text, keyed by the recipe's name as weights.quantization.method records it. step(detail)
    hears where it is (each fp32 case, each part of the quality report)."""
    from .quantize import recipe_description

    validation = {
        "reference": f"transformers {family.reference_class(arch.model_type)}, float32, eager attention",
        "fp32": check_fp32(fp32_graph, reference, tokenizer, arch, step),
    }
    if quantize != "none":
        ids, prefix, total = eval_ids
        recipe = recipe_description(quantize, tied=arch.tie_word_embeddings)["method"]
        validation["text"] = text.record(total, len(ids))

        def quality_step(detail):
            if step is not None:
                step(f"{recipe} quality: {detail}")

        validation[recipe] = quality_report(shipped, reference, arch, ids, prefix, quality_step)
    return validation


def _finite(report: dict) -> dict:
    """A NaN or Inf figure means the graph or the reference computed garbage; it must not read as a result."""
    flat = report | {f"{k}.{n}": v for k, part in report.items() if isinstance(part, dict) for n, v in part.items()}
    bad = [k for k, v in flat.items() if isinstance(v, float) and not np.isfinite(v)]
    if bad:
        raise ParityError(
            f"the quality report has non-finite figures ({', '.join(f'{k}={flat[k]}' for k in bad)}): the exported "
            "graph or the PyTorch reference produced NaN or Inf. No package was written; please report this with "
            "the checkpoint's config.json."
        )
    return report
