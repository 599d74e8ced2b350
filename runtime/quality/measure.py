"""How far one model's next-token distributions are from another's on the same text.

The figures of a package's quality report (export/validate.py, against the checkpoint in PyTorch) and of a
re-measurement against a float32 package on any text (`edgelm verify --quality`): perplexity of each, the change,
mean KL divergence KL(reference || model) and top-1 agreement over every position of the text's windows; the
same KL and top-1 over the last positions of a few windows decoded one token at a time through the cache (where
an int8 KV cache acts); and greedy agreement of continuations from prompts taken through the text. Pure NumPy
on logits and token ids; `measure` runs one reference side and one runtime Engine over the same ids, so the
export and the runtime compute every figure with the same code.

KL and top-1 are the headline: they measure how far the distributions moved and hold on random weights too.
Perplexity only means something where the reference predicts the text: a random-weight model's perplexity is
near its vocabulary size, and a change of it says nothing (`looks_random`).
"""

from dataclasses import dataclass

import numpy as np

from ..sampling.filters import log_softmax  # row-wise, float32: the samplers' own

POSITIONS_AT_ONCE = 256  # log-softmax over [positions, vocabulary] a slice at a time: 1,024 x 152K floats is 600 MB
WINDOW_LIMIT = 1024  # positions per window: the model's context, or this where the context is longer
LOGITS_BYTES_AT_ONCE = 256 << 20  # windows per reference pass: [B, T, V] float32 logits up to this size


@dataclass(frozen=True)
class Plan:
    """What a comparison measures on a text: windows of `window` tokens, `prompts` greedy continuations of
    `new_tokens` from `prompt_tokens`-token prompts, and the last `cache_steps` positions of `cache_windows`
    windows decoded one at a time through the cache."""

    window: int
    prompts: int = 32
    prompt_tokens: int = 32
    new_tokens: int = 64
    cache_windows: int = 4
    cache_steps: int = 32

    @classmethod
    def for_context(cls, n_positions: int) -> "Plan":
        """The plan for a model of n_positions positions: 32 prompts of 32 tokens + 64 new ones where they fit; a
        short context (tiny test models) keeps the counts and shortens each prompt to a quarter of it."""
        window = min(n_positions, WINDOW_LIMIT)
        prompt_tokens = max(1, min(32, n_positions // 4))
        return cls(window, 32, prompt_tokens, min(64, n_positions - prompt_tokens), 4, min(32, window // 2))


@dataclass
class LogitAgreement:
    """Sums over scored positions; add() one window at a time, summary() at the end."""

    tokens: int = 0
    nll_reference: float = 0.0
    nll: float = 0.0
    kl: float = 0.0
    top1_same: int = 0

    def add(self, reference_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> None:
        """reference_logits, logits: [T, V] at positions 0..T-1; targets: [T], the token that follows each."""
        targets = np.asarray(targets)
        for start in range(0, len(targets), POSITIONS_AT_ONCE):
            at = slice(start, start + POSITIONS_AT_ONCE)
            ref, ours, target = log_softmax(reference_logits[at]), log_softmax(logits[at]), targets[at]
            rows = np.arange(len(target))
            self.nll_reference -= float(ref[rows, target].sum(dtype=np.float64))
            self.nll -= float(ours[rows, target].sum(dtype=np.float64))
            self.kl += float((np.exp(ref) * (ref - ours)).sum(dtype=np.float64))
            self.top1_same += int((ref.argmax(-1) == ours.argmax(-1)).sum())
            self.tokens += len(target)

    def summary(self) -> dict:
        n = max(self.tokens, 1)
        reference, ours = float(np.exp(self.nll_reference / n)), float(np.exp(self.nll / n))
        return {
            "tokens": self.tokens,
            "perplexity_reference": reference,
            "perplexity": ours,
            "perplexity_change": ours / reference - 1,
            "mean_kl_divergence": self.kl / n,
            "top1_agreement": self.top1_same / n,
        }


def greedy_agreement(reference_tokens: np.ndarray, tokens: np.ndarray) -> dict:
    """[N, T] greedy continuations of the same N prompts: how many are identical, the mean share of tokens before
    the first difference, and the share of positions equal."""
    reference_tokens, tokens = np.asarray(reference_tokens), np.asarray(tokens)
    n, t = reference_tokens.shape
    same = reference_tokens == tokens
    first_difference = np.where(same.all(axis=1), t, np.argmin(same, axis=1))
    return {
        "continuations": int(n),
        "tokens_each": int(t),
        "identical": int(same.all(axis=1).sum()),
        "prefix_agreement": float(first_difference.mean() / t) if n and t else 1.0,
        "token_agreement": float(same.mean()) if n and t else 1.0,
    }


def text_windows(ids, window: int, prefix=()) -> list:
    """Consecutive, non-overlapping windows of at most `window` tokens (the last may be shorter, at least 2), each
    `prefix` (the ids a tokenizer puts before any text: a BOS, or none) and then the text's next tokens."""
    ids, prefix = np.asarray(ids, dtype=np.int64), np.asarray(prefix, dtype=np.int64)
    step = window - len(prefix)
    windows = [np.concatenate([prefix, ids[s : s + step]]) for s in range(0, len(ids), step)]
    return [w for w in windows if len(w) >= 2]


def greedy_prompts(ids, count: int, prompt_tokens: int, prefix=()) -> list:
    """`count` prompts of `prompt_tokens` tokens (prefix included) taken at even offsets through the text (fewer
    if it is short)."""
    ids, prefix, take = list(ids), list(prefix), prompt_tokens - len(prefix)
    room = len(ids) - take
    if room < 0:
        return [prefix + ids] if ids else []
    offsets = sorted({int(o) for o in np.linspace(0, room, num=count)})
    return [prefix + ids[o : o + take] for o in offsets]


def looks_random(perplexity_reference: float, vocab_size: int) -> bool:
    """A reference perplexity above a tenth of the vocabulary: the model has not learned the text's language, its
    distributions are near flat, and a perplexity change on it is noise."""
    return perplexity_reference > vocab_size / 10


def window_logits(engine, window: np.ndarray) -> np.ndarray:
    """[T, V] logits of one window (one row, no padding) from a runtime Engine."""
    ids = np.asarray(window, dtype=np.int64)[None]
    mask = np.ones_like(ids)
    logits, _ = engine.forward(ids, mask, np.arange(ids.shape[1])[None], engine.empty_past(1), logits_to_keep=0)
    return logits[0]


def greedy_tokens(engine, prompts: list, new_tokens: int, eos_token_id=None, pad_id: int = 0) -> np.ndarray:
    """[N, new_tokens] greedy continuations from a runtime Engine, batched, exactly new_tokens each (end-of-text
    is never picked before then)."""
    from ..batching.step import id_steps
    from ..generation_config import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=eos_token_id)
    steps = [tokens for tokens, _ in id_steps(engine, prompts, config, pad_id)]
    return np.stack(steps, axis=1)


def cache_path_logits(engine, ids, mask, steps: int = 4) -> np.ndarray:
    """[B, steps, V]: prefill all but the last `steps` of [B, T] ids (left-padded by `mask`), then feed them one at
    a time through the cache, keeping each step's logits."""
    from ..engine.steps import position_ids_from_mask

    steps = min(steps, ids.shape[1] - 1)
    positions = position_ids_from_mask(mask)
    if steps <= 0:
        logits, _ = engine.forward(ids, mask, positions, engine.empty_past(len(ids)), logits_to_keep=1)
        return logits
    head = ids.shape[1] - steps
    _, past = engine.forward(ids[:, :head], mask[:, :head], positions[:, :head], engine.empty_past(len(ids)))
    collected = []
    for t in range(head, ids.shape[1]):
        logits, past = engine.forward(ids[:, t : t + 1], mask[:, : t + 1], positions[:, t : t + 1], past)
        collected.append(logits[:, -1])
    return np.stack(collected, axis=1)


class EngineSide:
    """A runtime Engine as the reference side of `measure`: window logits a row at a time (an int8 graph
    quantizes activations per pass, so a row's logits would depend on the rows beside it), greedy continuations
    of all prompts as one batch."""

    def __init__(self, engine, eos_token_id=None):
        self.engine, self.eos_token_id = engine, eos_token_id

    def logits(self, windows: np.ndarray) -> np.ndarray:
        """[B, T] ids -> [B, T, V] logits."""
        return np.stack([window_logits(self.engine, w) for w in windows])

    def greedy(self, prompts: list, new_tokens: int) -> np.ndarray:
        """Equal-length prompts -> [N, new_tokens] greedy tokens."""
        return greedy_tokens(self.engine, prompts, new_tokens, self.eos_token_id)


def measure(reference, engine, ids, plan: Plan, eos_token_id=None, prefix=(), progress=None) -> dict:
    """`engine` (a runtime Engine) against `reference` (an EngineSide, or the export's PyTorch side: logits(windows)
    and greedy(prompts, new_tokens)) over the token ids of a text, as `plan` says. Returns the logit figures
    over every window's positions, `cache_path` (the same through the cache) and `greedy`. progress(detail), if
    given, hears where the measurement is (windows done, then the cache path, then the greedy continuations)."""
    report = progress or (lambda detail: None)
    windows = text_windows(ids, plan.window, prefix)
    ours = EngineSide(engine, eos_token_id)
    # The cache path on `cache_windows` full-length windows spread through the text, where its reference logits
    # come from the window passes below.
    full = [i for i, w in enumerate(windows) if len(w) == plan.window]
    cache_at = sorted({full[int(k)] for k in np.linspace(0, len(full) - 1, num=plan.cache_windows)}) if full else []
    steps = min(plan.cache_steps, plan.window - 2)
    overall, cached, tails = LogitAgreement(), LogitAgreement(), {}
    done = 0
    for batch in _batches(windows, engine.vocab_size):
        report(f"windows {done} of {len(windows)} done")
        done += len(batch)
        rows = np.stack([windows[i][:-1] for i in batch])
        reference_logits, logits = reference.logits(rows), ours.logits(rows)
        for j, i in enumerate(batch):
            overall.add(reference_logits[j], logits[j], windows[i][1:])
            if i in cache_at and steps > 0:
                tails[i] = reference_logits[j, -steps:]
        del reference_logits, logits
    if tails:
        report(f"{steps} positions of {len(tails)} windows through the cache")
        rows = np.stack([windows[i][:-1] for i in tails])
        through_cache = cache_path_logits(engine, rows, np.ones_like(rows), steps)
        for j, i in enumerate(tails):
            cached.add(tails[i], through_cache[j], windows[i][-steps:])
    prompts = greedy_prompts(ids, plan.prompts, plan.prompt_tokens, prefix)
    report(f"greedy continuations of {len(prompts)} prompts")
    greedy = greedy_agreement(reference.greedy(prompts, plan.new_tokens), ours.greedy(prompts, plan.new_tokens))
    figures = overall.summary()
    cache_figures = cached.summary()
    return figures | {
        "window": plan.window,
        "perplexity_meaningful": not looks_random(figures["perplexity_reference"], engine.vocab_size),
        "cache_path": {k: cache_figures[k] for k in ("tokens", "mean_kl_divergence", "top1_agreement")},
        "greedy": greedy | {"prompt_tokens": len(prompts[0]) if prompts else 0},
    }


def _batches(windows: list, vocab_size: int) -> list:
    """Indices of windows in runs of equal length whose logits fit LOGITS_BYTES_AT_ONCE (at least one each)."""
    batches = []
    for i, w in enumerate(windows):
        per_batch = max(1, LOGITS_BYTES_AT_ONCE // (len(w) * vocab_size * 4))
        if batches and len(windows[batches[-1][0]]) == len(w) and len(batches[-1]) < per_batch:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def compare_engines(reference, engine, ids, plan: Plan, eos_token_id=None, prefix=()) -> dict:
    """Two runtime Engines over the same token ids: `measure` with the first as the reference."""
    return measure(EngineSide(reference, eos_token_id), engine, ids, plan, eos_token_id, prefix)
