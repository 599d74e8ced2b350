"""How far one model's next-token distributions are from another's on the same text.

The figures of a package's quality report (export/validate.py, against the checkpoint in PyTorch) and of a
re-measurement against a float32 package on any text: perplexity of each, the change, mean KL divergence
KL(reference || model), top-1 agreement, and greedy agreement over continuations. Pure NumPy on logits and
token ids; `compare_engines` runs two of the runtime's engines over the same text.

KL and top-1 are the headline: they measure how far the distributions moved and hold on random weights too.
Perplexity only means something where the reference predicts the text: a random-weight model's perplexity is
near its vocabulary size, and a change of it says nothing (`looks_random`).
"""

from dataclasses import dataclass

import numpy as np

POSITIONS_AT_ONCE = 256  # log-softmax over [positions, vocabulary] a slice at a time: 1,024 x 152K floats is 600 MB


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of [T, V] logits, in float32."""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


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


def text_windows(ids, window: int) -> list:
    """Consecutive, non-overlapping windows of at most `window` tokens (the last may be shorter, at least 2)."""
    ids = np.asarray(ids, dtype=np.int64)
    windows = [ids[s : s + window] for s in range(0, len(ids), window)]
    return [w for w in windows if len(w) >= 2]


def greedy_prompts(ids, count: int, prompt_tokens: int) -> list:
    """`count` prompts of `prompt_tokens` tokens taken at even offsets through the text (fewer if it is short)."""
    ids = list(ids)
    room = len(ids) - prompt_tokens
    if room < 0:
        return [ids] if ids else []
    offsets = sorted({int(o) for o in np.linspace(0, room, num=count)})
    return [ids[o : o + prompt_tokens] for o in offsets]


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
    """[N, new_tokens] greedy continuations from a runtime Engine, batched, exactly new_tokens each."""
    from .engine.decode import decode_steps
    from .generation_config import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=eos_token_id)
    steps = [tokens for tokens, _ in decode_steps(engine, prompts, config, [None] * len(prompts), pad_id=pad_id)]
    return np.stack(steps, axis=1)


def compare_engines(reference, engine, ids, window: int, prompts: int = 32, prompt_tokens: int = 32,
                    new_tokens: int = 64, eos_token_id=None) -> dict:  # fmt: skip
    """Both engines over the same token ids: the logit figures over every window, and greedy agreement of
    `prompts` continuations of `new_tokens` from prompts taken through the text."""
    agreement = LogitAgreement()
    for w in text_windows(ids, window):
        agreement.add(window_logits(reference, w[:-1]), window_logits(engine, w[:-1]), w[1:])
    rows = greedy_prompts(ids, prompts, prompt_tokens)
    greedy = greedy_agreement(
        greedy_tokens(reference, rows, new_tokens, eos_token_id), greedy_tokens(engine, rows, new_tokens, eos_token_id)
    )
    return agreement.summary() | {"greedy": greedy}
