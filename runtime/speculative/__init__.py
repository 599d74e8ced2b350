"""Several tokens per pass over the weights, with the output of one token per pass.

    ngram.py    propose: prompt lookup, with an adaptive draft length and an off-switch
    draft.py    propose: a smaller package of the same tokenizer guesses, with a rolled-back cache of its own
    verify.py   accept: the rules that keep the output the model's own (pure NumPy)
    decode.py   the row's loop: propose, verify in one pass (engine/verify_pass.py), accept

The `speculative` option (GenerationConfig) picks what is proposed: "auto" the constraint's forced tokens (and a
loaded draft model's guesses; prompt lookup too where AUTO_NGRAM says so), "ngram" those and prompt lookup,
"draft" those and a draft model's guesses (draft.py), "off" nothing. A call of one row speculates; a batch of
several rows decodes one token per pass (uses() says which); the running batch speculates while it holds few
rows (runtime/batching/scheduler.py).
"""

from .decode import Speculation, speculative_round, speculative_steps
from .ngram import NgramProposer

__all__ = ["AUTO_NGRAM", "NgramProposer", "Speculation", "speculative_round", "speculative_steps", "uses", "proposer"]

# Whether "auto" adds prompt lookup (with its off-switch) to the forced tokens. The rule: only where open-ended
# text costs at most 3% of one token per pass with it (benchmarks/speculative.py --tasks open), and where it keeps
# the tokens of one token per pass: off, since a verify pass of several positions flips near-ties of int8 and int4
# packages (docs/speculative.md), so "auto" proposes only what wastes no work and changes no token.
AUTO_NGRAM = False


def uses(config, rows: int, constraints: list, draft=None) -> bool:
    """Whether a call of `rows` rows with these settings and constraints decodes by speculative_steps: one row,
    speculative not "off", and something to propose (prompt lookup, a draft model, a constraint's forced tokens)."""
    if rows != 1 or config.speculative == "off":
        return False
    return config.speculative != "auto" or constraints[0] is not None or draft is not None or AUTO_NGRAM


def proposer(config, draft=None, prompt_length: int = 0, rng=None):
    """The row's proposer for these settings: an NgramProposer for "ngram", a DraftProposer for "draft" (draft:
    the draft Model, see load(..., draft=); rng: the row's generator), as for "auto" when a draft is loaded; an
    NgramProposer for "ngram" (and "auto" with AUTO_NGRAM); else None (forced tokens only)."""
    if config.speculative == "draft" or (config.speculative == "auto" and draft is not None):
        from .draft import DraftProposer

        return DraftProposer(draft.engine, config, prompt_length, config.vocab_size, draft.arch.n_positions, rng)
    ngram = config.speculative == "ngram" or (config.speculative == "auto" and AUTO_NGRAM)
    return NgramProposer(no_repeat=config.no_repeat_ngram_size) if ngram else None
