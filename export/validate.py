"""Stage 5, validate: run the exported graph through edgelm's own runtime engine and compare it with the
same checkpoint run by transformers in PyTorch, on a fixed set of cases.

fp32 is a gate (export fails, nothing is written, when it misses); int8 and int4 (with or without an int8
KV cache) get a measured quality report.
Relative error is max |ours - reference| / max |reference| over real (unpadded) positions.
"""

import weakref

import numpy as np
import onnxruntime as ort
from edgelm.runtime.engine.decode import Engine, decode_steps, left_pad, position_ids_from_mask
from edgelm.runtime.engine.session import graph_io
from edgelm.runtime.generation_config import GenerationConfig

from .errors import ParityError
from .weights_file import ShippedGraph

FP32_TOLERANCE = 1e-5
GREEDY_TOKENS = 16
# The longest case's prompt: near the position limit, up to this many tokens. PyTorch's eager attention holds
# [heads, T, T] scores per layer: 32K positions (Qwen2.5) would need 60 GB; 2048 need 235 MB.
LONGEST_CASE = 2048
CACHE_STEPS = 32  # held-out positions the quality report decodes one at a time through the cache
PROMPTS = (
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "import numpy as np\n",
    "Émile a visité 東京 🚀",
)
# Held-out text for perplexity: written for this project, not part of any training set we know of.
HELD_OUT = (
    "The lighthouse keeper rowed out at dawn to read the tide gauge, as he had every morning for eleven years. "
    "The numbers went into a ledger that nobody else opened, but he kept it neatly, because a record kept "
    "carelessly is worse than none. By noon the fog had lifted, and the supply boat was late again."
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


# model -> {(rows, new_tokens, eos): tokens}: the fp32 check and the quantized graph's quality report compare with
# the same reference generations, and transformers' generate is nearly all of the validate stage's time.
_REFERENCE_TOKENS = weakref.WeakKeyDictionary()


def _torch_greedy(model, rows, new_tokens, eos):
    """transformers' own greedy generate: the tokens ours must equal (computed once per model and case)."""
    done = _REFERENCE_TOKENS.setdefault(model, {})
    key = (tuple(map(tuple, rows)), int(new_tokens), eos)
    if key not in done:
        done[key] = _generate(model, rows, new_tokens, eos)
    return done[key]


def _generate(model, rows, new_tokens, eos):
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
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=arch.eos_token_id)
    steps = [tokens for tokens, _ in decode_steps(engine, rows, config, [None] * len(rows), pad_id=0)]
    return np.stack(steps, axis=1)


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


def check_fp32(graph, model, tokenizer, arch) -> dict:
    """Full logits, cache path and greedy tokens against PyTorch; raises ParityError past the tolerance."""
    engine = _engine(graph, arch, in_place=True)
    report = {"tolerance": FP32_TOLERANCE, "cases": {}}
    for name, rows in validation_cases(tokenizer, arch).items():
        reference, mask = _torch_logits(model, rows)
        ids, _ = left_pad(rows, 0)
        full, _ = engine.forward(
            ids, mask, position_ids_from_mask(mask), engine.empty_past(len(rows)), logits_to_keep=0
        )
        logits_error = _relative_error(full, reference, mask)
        del full  # [B, T, V] each: 1 GB at 2,048 tokens of a 128K vocabulary, not kept through the passes below
        cached = _cache_path_logits(engine, ids, mask)
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


def _cache_path_logits(engine, ids, mask, steps: int = 4):
    """Prefill all but the last `steps` tokens, then feed them one at a time through the cache."""
    steps = min(steps, ids.shape[1] - 1)
    if steps <= 0:
        logits, _ = engine.forward(
            ids, mask, position_ids_from_mask(mask), engine.empty_past(len(ids)), logits_to_keep=1
        )
        return logits
    positions = position_ids_from_mask(mask)
    head = ids.shape[1] - steps
    _, past = engine.forward(ids[:, :head], mask[:, :head], positions[:, :head], engine.empty_past(len(ids)))
    collected = []
    for t in range(head, ids.shape[1]):
        logits, past = engine.forward(ids[:, t : t + 1], mask[:, : t + 1], positions[:, t : t + 1], past)
        collected.append(logits[:, -1])
    return np.stack(collected, axis=1)


def quality_report(graph, model, tokenizer, arch) -> dict:
    """How far a quantized graph is from the PyTorch reference: top-1, KL, greedy agreement, perplexity."""
    engine = _engine(graph, arch)
    held_out = tokenizer.encode(HELD_OUT).ids[: arch.n_positions]
    reference, mask = _torch_logits(model, [held_out])
    ids, _ = left_pad([held_out], 0)
    ours, _ = engine.forward(ids, mask, position_ids_from_mask(mask), engine.empty_past(1), logits_to_keep=0)
    ref_lp, our_lp = _log_softmax(reference[0]), _log_softmax(ours[0])
    kl = lambda ref, our: np.sum(np.exp(ref) * (ref - our), axis=-1)  # noqa: E731  KL(reference || ours) per position
    # The last CACHE_STEPS positions again, one token at a time through the cache (where an int8 cache acts).
    cached_lp = _log_softmax(_cache_path_logits(engine, ids, mask, steps=CACHE_STEPS)[0])
    targets = np.asarray(held_out[1:])
    ppl = lambda lp: float(np.exp(-lp[np.arange(len(targets)), targets].mean()))  # noqa: E731
    agreement = []
    for name, rows in validation_cases(tokenizer, arch).items():
        if name in ("near_limit",):
            continue
        new_tokens = min(GREEDY_TOKENS, arch.n_positions - max(len(r) for r in rows))
        ours_tokens, torch_tokens = (
            _ours_greedy(engine, rows, new_tokens, arch),
            _torch_greedy(model, rows, new_tokens, arch.eos_token_id),
        )
        for a, b in zip(ours_tokens, torch_tokens):
            differ = np.flatnonzero(a != b)
            agreement.append((differ[0] if len(differ) else new_tokens) / new_tokens)
    report = {
        "held_out_tokens": len(held_out),
        "top1_agreement": float((reference[0].argmax(-1) == ours[0].argmax(-1)).mean()),
        "mean_kl_divergence": float(kl(ref_lp, our_lp).mean()),
        "cache_path_mean_kl_divergence": float(kl(ref_lp[-len(cached_lp) :], cached_lp).mean()),
        "cache_path_positions": len(cached_lp),
        "kv_cache": engine.io.cache_dtype,
        "greedy_agreement": float(np.mean(agreement)),
        "greedy_agreement_means": "tokens before the first divergence / tokens generated, averaged over prompts",
        "perplexity_reference": ppl(ref_lp[:-1]),
        "perplexity": ppl(our_lp[:-1]),
        "perplexity_change": ppl(our_lp[:-1]) / ppl(ref_lp[:-1]) - 1,
    }
    return _finite(report)


def _finite(report: dict) -> dict:
    """A NaN or Inf figure means the graph or the reference computed garbage; it must not read as a result."""
    bad = [k for k, v in report.items() if isinstance(v, float) and not np.isfinite(v)]
    if bad:
        raise ParityError(
            f"the quality report has non-finite figures ({', '.join(f'{k}={report[k]}' for k in bad)}): the exported "
            "graph or the PyTorch reference produced NaN or Inf. No package was written; please report this with "
            "the checkpoint's config.json."
        )
    return report


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
