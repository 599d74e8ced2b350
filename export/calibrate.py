"""Scales for an int8 KV cache, measured on the PyTorch reference: `cache_scales` runs it over these rows and
records the largest |K| and |V| per channel, the same run for every family (each family's kv_cache_scales
names the modules whose outputs are its keys and values).

GroupQueryAttention stores K and V as int8 with fixed scales, one per head and channel: scale = HEADROOM x
the largest |value| the calibration run produced in that channel / 127. Larger values at run time are
clipped, and clipping costs far more than a coarser step: the run covers every position (rows of random
tokens up to the position limit) as well as prose, code and numbers, and keeps 1.5x headroom. On the tiny
test model (through-the-cache KL on held-out text; float32 cache 0.0036): 2 rows, no headroom 0.036;
8 rows 0.0085; 8 rows and 1.5x 0.0035. The calibration text is not the held-out text the quality report
scores, so that report stays honest.
"""

import numpy as np

CALIBRATION = (
    "Rain had fallen all night on the harbour town, and by morning the gutters ran like small rivers. "
    "She checked the forecast twice, packed two sandwiches and a thermos, and left before seven.\n"
    "def mean(values):\n    return sum(values) / len(values) if values else 0.0\n"
    "Order #48213 shipped on 2024-03-17: 12 items, total $1,284.50 (VAT 20%).\n"
    "« Il fait beau aujourd'hui », dit-elle. Das Wetter ist schön. 今日はいい天気です。"
)


RANDOM_ROWS = 8
HEADROOM = 1.5


def calibration_rows(tokenizer, arch, seed: int = 1) -> list:
    """The prose-and-code text, and rows of random tokens filling every position."""
    rng = np.random.default_rng(seed)
    return [tokenizer.encode(CALIBRATION).ids[: arch.n_positions]] + [
        rng.integers(0, arch.vocab_size, size=arch.n_positions).tolist() for _ in range(RANDOM_ROWS)
    ]


def channel_scales(absmax: np.ndarray) -> np.ndarray:
    """The int8 cache's fixed scale of each channel: HEADROOM x the largest |value| seen in it / 127, as float32
    (a channel never seen non-zero keeps a tiny scale)."""
    return (np.maximum(absmax, 1e-6) * HEADROOM / 127).astype(np.float32)


def cache_scales(model, rows: list, taps: list, arch) -> dict:
    """Run the PyTorch reference over `rows` (token id lists) and record the largest |K| and |V| per channel.
    taps: (layer, kind, module, measure): a forward hook on `module` records measure(its output, float32) ->
    |values| [kv_heads, head_size] for kind 0 (keys), 1 (values), or slice(0, 2) for [2, kv_heads, head_size]
    (a module that outputs both). -> layer -> (key scale, value scale), float32 [kv_heads, head_size] each."""
    import torch

    absmax = np.zeros((arch.n_layer, 2, arch.kv_heads, arch.head_size), dtype=np.float32)

    def record(layer, kind, measure):
        def hook(_module, _inputs, output):
            seen = absmax[layer, kind]  # a view: updated in place
            np.maximum(seen, measure(output.detach().float()).numpy(), out=seen)

        return hook

    hooks = [module.register_forward_hook(record(layer, kind, measure)) for layer, kind, module, measure in taps]
    try:
        with torch.no_grad():
            for row in rows:
                model(input_ids=torch.tensor([row]))
    finally:
        for h in hooks:
            h.remove()
    return {i: (channel_scales(a[0]), channel_scales(a[1])) for i, a in enumerate(absmax)}
