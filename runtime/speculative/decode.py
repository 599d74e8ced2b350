"""Several tokens per pass for one row: propose, verify in one pass, accept, emit one token at a time.

speculative_steps decodes a batch of one row as decode_steps (runtime/engine/decode.py) with a BatchPick does,
each new token going through the same Step (runtime/batching/step.py: constrain, pick, append, log-probs, text),
so that text, stop strings, log-probs and streaming see each token as without speculation. Each round
(speculative_round, also what the running batch runs for a row: runtime/batching/scheduler.py) proposes draft ids
(the grammar's forced tokens, then prompt lookup: ngram.py, or a draft model's: draft.py), feeds the last token
and the draft in one verify pass (runtime/engine/verify_pass.py), and accepts the draft while the sampler chain's
picks confirm it, or, for a draft drawn from a distribution, by speculative rejection sampling (verify.py); the
cache keeps the accepted rows.
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
    per pass; yield the text pieces of each round, as a fixed batch yields them per step. proposer: an
    ngram.NgramProposer, a draft.DraftProposer or None (the constraint's forced tokens only); stats: a Speculation
    to count into."""
    stats = Speculation() if stats is None else stats
    state, config = step.states[0], step.rows.config

    # Prefill: the prompt into the cache, the first token from the last position's logits.
    prompt = list(state.seen)
    input_ids, attention_mask, position_ids = prefill_inputs([prompt], pad_id)
    decoder = engine.decoder(1, capacity=len(prompt) + config.max_new_tokens)
    passes = VerifyPasses(decoder)
    yield step([0], decoder.run(input_ids, attention_mask, position_ids)[0, -1:])
    # Decode: rounds of propose, verify, accept over the cache of the rows accepted so far.
    while not state.finished:
        cached = len(state.seen) - 1  # the last token is fed by the next pass
        passes.rewind(cached)
        yield speculative_round(step, 0, proposer, stats, lambda tokens: passes.run(tokens, cached))


def speculative_round(step, index: int, proposer, stats: Speculation, verify, limit: int | None = None) -> list:
    """One round for row `index` of `step`: propose, verify in one pass, accept; the text pieces of the accepted
    tokens. verify(tokens) -> logits [len(tokens), V]: the row's last token and the draft in one pass over the
    cache of the row's other tokens (a VerifyPasses over a batch-1 decoder, or the running batch's slot:
    runtime/batching/slot_cache.py). limit: draft ids at most (default: what max_new_tokens leaves)."""
    state = step.states[index]
    left = step.rows.config.max_new_tokens - len(state.generated) - 1
    draft, forced = propose(state, proposer, left if limit is None else min(limit, left))
    drawn = getattr(proposer, "q", None)  # a sampled draft's distributions, one per proposed id after the forced
    stats.drafted, stats.forced, stats.passes = stats.drafted + len(draft), stats.forced + forced, stats.passes + 1
    logits = verify([state.seen[-1], *draft])
    pieces, accepted = accept(step, index, logits, draft, forced, drawn)
    stats.accepted += accepted
    if proposer is not None:
        proposer.accepted(len(draft) - forced, max(0, accepted - forced))
    return pieces


def accept(step, index: int, logits: np.ndarray, draft: list, forced: int, drawn) -> tuple[list, int]:
    """Position i's pick (the Step's: constrain, pick, append, text), after the i draft ids before it were
    accepted; the draft ends at the first mismatch. A token drawn from a draft model (drawn: its distributions)
    is verified by speculative rejection sampling instead of the chain's pick. (text pieces, draft ids accepted)."""
    # logits [k + 1, V]: position i's distribution of the token after draft[:i]
    state, rng = step.states[index], step.rngs[index]
    pieces, picks, before = [], [], len(state.generated)
    for i, row in enumerate(logits):
        choose = None
        if drawn is not None and forced <= i < len(draft):
            choose = _rejection(drawn[i - forced], draft[i], rng)
        pieces += step([index], row[None], choose=choose)
        picks = state.generated[before:]  # the tokens it appended (none if the row failed)
        if state.finished or accepted_prefix(picks, draft) < len(picks) or len(picks) > len(draft):
            break
    return pieces, accepted_prefix(picks, draft)


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
