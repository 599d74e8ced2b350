"""Next-token selection, pure NumPy: the filters (filters.py) in one fixed order, the chain that runs a request's
active ones (chain.py), and the pick (draw.py), with top_p's and top_k's selection (nucleus.py, topk.py), the
penalties' tallies (tally.py)."""

from .chain import SamplerChain, process_logits
from .draw import pick
from .filters import (
    bad_words,
    frequency_presence_penalty,
    log_softmax,
    logit_bias,
    logits_filter,
    min_new_tokens,
    min_p,
    no_repeat_ngram,
    repetition_penalty,
    temperature,
    top_k,
    top_logprobs,
    top_p,
    typical_p,
)

__all__ = [
    "SamplerChain",
    "process_logits",
    "pick",
    "logits_filter",
    "repetition_penalty",
    "frequency_presence_penalty",
    "logit_bias",
    "no_repeat_ngram",
    "bad_words",
    "min_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "log_softmax",
    "top_logprobs",
]
