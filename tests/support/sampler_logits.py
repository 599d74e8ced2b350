"""Hand-made logits and ids for the sampler tests, and transformers' logits processors run on the same arrays."""

import numpy as np
import torch

SEEDS = [0, 1, 2, 3]
VOCABS = [50, 257, 1000]
B = 3


def random_logits(seed, n_vocab, scale=3.0):
    return (np.random.default_rng(seed).standard_normal((B, n_vocab)) * scale).astype(np.float32)


def random_ids(seed, n_vocab, length=12, high=None):
    # few distinct ids (high) make repeats, n-gram matches and bad-word matches likely
    return np.random.default_rng(seed + 100).integers(0, high or n_vocab, size=(B, length))


def reference(processor, logits, input_ids=None):
    """transformers' processor on the same logits; input_ids [B, L] (a dummy when the processor ignores it)."""
    ids = (
        torch.zeros((logits.shape[0], 1), dtype=torch.long)
        if input_ids is None
        else torch.as_tensor(input_ids, dtype=torch.long)
    )
    return processor(ids, torch.from_numpy(logits.copy())).numpy()


def assert_same(ours, theirs):
    """Same kept set (-inf where transformers has -inf) and the same values elsewhere."""
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def rngs(seed, n=B):
    """One generator per row, each from the seed and the row's index."""
    return [np.random.default_rng([seed, r]) for r in range(n)]
