"""Several tokens per pass for one row: propose, verify in one pass, accept, emit one token at a time.

speculative_steps decodes a batch of one row as decode_steps (runtime/engine/decode.py) with a BatchPick does,
each new token going through the same Step (runtime/batching/step.py: constrain, pick, append, log-probs, text),
so that text, stop strings, log-probs and streaming see each token as without speculation. Each round proposes draft ids (the grammar's forced tokens, then prompt
lookup: ngram.py), feeds the last token and the draft in one verify pass (runtime/engine/verify_pass.py), and
accepts the draft while the sampler chain's picks confirm it, or, for a draft drawn from a distribution, by
speculative rejection sampling (verify.py); the cache keeps the accepted rows.
"""

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..engine.steps import prefill_inputs
from ..engine.verify_pass import VerifyPasses
from .verify import accepted_prefix, probabilities, rejection_sample


@dataclass
class Speculation:
    """What speculation did for one row: tokens proposed, how many of them were accepted, and verify passes."""

    drafted: int = 0
    accepted: int = 0
    forced: int = 0  # of the drafted: the grammar's forced tokens
    passes: int = 0  # forward passes after the prompt's

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict:
        return {**self.__dict__, "acceptance_rate": self.acceptance_rate}


def speculative_steps(engine, step, pad_id: int, proposer=None, stats: Speculation | None = None) -> Iterator[list]:
    """Decode the one row of `step` (a batching.step.Step: the row's sampler chain, state and text) several tokens
    per pass; yield the text pieces of each new token, as a fixed batch yields them. proposer: an
    ngram.NgramProposer, a draft.DraftProposer or None (the constraint's forced tokens only); stats: a Speculation
    to count into."""
    stats = Speculation() if stats is None else stats
    state, config, rng = step.states[0], step.rows.config, step.rngs[0]

    # Prefill: the prompt into the cache, the last position's logits.
    prompt = list(state.seen)
    input_ids, attention_mask, position_ids = prefill_inputs([prompt], pad_id)
    decoder = engine.decoder(1, capacity=len(prompt) + config.max_new_tokens)
    passes = VerifyPasses(decoder)
    logits, draft, forced, drawn = decoder.run(input_ids, attention_mask, position_ids)[0, -1:], [], 0, None
    while True:
        # Accept: position i's pick (the Step's: constrain, pick, append, text), after the i draft ids before it
        # were accepted; the draft ends at the first mismatch. A token drawn from a draft model is verified by
        # speculative rejection sampling instead of the chain's pick.
        picks, before = [], len(state.generated)
        for i, row in enumerate(logits):
            choose = None
            if drawn is not None and forced <= i < len(draft):
                choose = _rejection(drawn[i - forced], draft[i], rng)
            yield step([0], row[None], choose=choose)
            picks = state.generated[before:]  # the token it appended (none if the row failed)
            if state.finished or accepted_prefix(picks, draft) < len(picks) or len(picks) > len(draft):
                break
        accepted = accepted_prefix(picks, draft)
        stats.accepted += accepted
        if proposer is not None:
            proposer.accepted(len(draft) - forced, max(0, accepted - forced))
        if state.finished:
            return
        # Propose, then verify: the last token and the draft in one pass over the cache of the rows before them.
        cached = len(state.seen) - 1
        passes.rewind(cached)
        draft, forced = propose(state, proposer, config.max_new_tokens - len(state.generated) - 1)
        drawn = getattr(proposer, "q", None)  # a sampled draft's distributions, one per proposed id after the forced
        stats.drafted, stats.forced, stats.passes = stats.drafted + len(draft), stats.forced + forced, stats.passes + 1
        logits = passes.run([state.seen[-1], *draft], cached)


def _rejection(q: np.ndarray, token: int, rng):
    """The Step's choice for a draft token drawn from q: speculative rejection sampling against the chain's p."""

    def choose(sampler, logits, seen, generated) -> int:
        p = probabilities(sampler.process(logits, [seen], [generated])[0])
        return rejection_sample(p, q, token, rng)[1]

    return choose


def propose(state, proposer, limit: int) -> tuple[list, int]:
    """(draft ids, how many of them the grammar forces): the constraint's forced tokens, then the proposer's ids
    after them (prompt lookup's or a draft model's), cut to what the grammar accepts; at most `limit` ids."""
    forced, draft = [], []
    if limit <= 0:
        return [], 0
    if state.constraint is not None:
        forced = state.constraint.forced_tokens(limit)
    if proposer is not None and len(forced) < limit:
        draft = proposer.propose(state.seen + forced, limit - len(forced))
        # cut where the grammar refuses (a drawn draft is not cut: its verification must see each draw)
        if state.constraint is not None and draft and getattr(proposer, "q", None) is None:
            draft = draft[: max(0, state.constraint.valid_prefix(forced + draft) - len(forced))]
    return forced + draft, len(forced)
