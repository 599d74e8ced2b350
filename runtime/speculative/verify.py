"""Accepting proposed tokens so that the output is the model's own: pure NumPy, the random generator passed in.

Two rules, both exact:

- A proposal that is one fixed sequence (prompt lookup, a grammar's forced tokens, a greedy draft model): at each
  position the sampler chain picks as it would without speculation (every filter, the penalties updated by each
  accepted token, the constraint's mask), and the proposal is accepted while the picks equal it. The emitted
  token is the chain's pick whatever the proposal was, so greedy output is token-identical to decoding one token
  per pass, and a seeded sampled output draws the same tokens as without speculation wherever the logits agree.
  As speculative rejection sampling with a one-hot draft distribution, it accepts token d with probability p(d)
  and otherwise draws from p without d, renormalized: the same law (tests/engine/test_speculative_verify.py checks it).
- A proposal drawn from a draft distribution q (a draft model sampling): speculative rejection sampling
  (Leviathan et al. 2023, Chen et al. 2023): accept the draft token d with probability min(1, p(d) / q(d)), else
  draw from max(p - q, 0) renormalized. p and q are the distributions after every filter of the chain, applied to
  target and draft alike (probabilities()).
"""

import numpy as np


def accepted_prefix(picks: list, draft: list) -> int:
    """How many leading draft ids the picks confirm (picks[i] is the pick at draft[i]'s position)."""
    count = 0
    for pick, proposed in zip(picks, draft):
        if pick != proposed:
            break
        count += 1
    return count


def probabilities(filtered_logits: np.ndarray) -> np.ndarray:
    """The distribution the chain draws from: softmax of the filtered logits (-inf: probability 0)."""
    # [..., V] -> [..., V] float64
    logits = np.asarray(filtered_logits, dtype=np.float64)
    top = np.max(logits, axis=-1, keepdims=True)
    weights = np.exp(logits - np.where(np.isfinite(top), top, 0))
    return weights / weights.sum(axis=-1, keepdims=True)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(p - q, 0) renormalized: what a rejected draft token is replaced from. Where q covers p everywhere
    (p == q), nothing is left and p itself is returned (that case is never reached: p == q accepts always)."""
    # [V], [V] -> [V]
    left = np.maximum(np.asarray(p, dtype=np.float64) - q, 0.0)
    total = left.sum()
    return left / total if total > 0 else np.asarray(p, dtype=np.float64)


def rejection_sample(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator) -> tuple[bool, int]:
    """One position of speculative rejection sampling: (accepted, the token to emit). p: the target's
    distribution, q: the draft's, token: the draft's draw from q. The emitted token is distributed as p."""
    # [V], [V], id -> (bool, id)
    if q[token] <= 0:  # q could not have drawn it: reject
        accept = False
    else:
        accept = p[token] >= q[token] or rng.random() < p[token] / q[token]
    if accept:
        return True, int(token)
    left = residual(p, q)
    return False, int(min(np.searchsorted(np.cumsum(left), rng.random() * left.sum(), side="right"), len(p) - 1))
