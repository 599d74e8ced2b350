"""Several tokens per pass for one row: propose, verify in one pass, accept, emit one token at a time.

speculative_steps is decode_steps (runtime/engine/decode.py) for a batch of one row, with the same contract: it
yields (tokens [1], logits [1, V]) per new token, so that text, stop strings, log-probs and streaming above it
see each token as without speculation. Each round proposes draft ids (the grammar's forced tokens, then prompt
lookup: ngram.py), feeds the last token and the draft in one verify pass (runtime/engine/verify_pass.py), and
accepts the draft while the sampler chain's picks confirm it, or, for a draft drawn from a distribution, by
speculative rejection sampling (verify.py); the cache keeps the accepted rows.
"""

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..engine.steps import RowState, prefill_inputs, row_stop_ids
from ..engine.verify_pass import VerifyPasses
from ..generation_config import GenerationConfig
from ..sampling import SamplerChain
from ..sampling.constraint import Masks
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


def speculative_steps(
    engine,
    prompt: list,
    config: GenerationConfig,
    rng,
    pad_id: int,
    finished: dict | None = None,
    constraint=None,
    proposer=None,
    stats: Speculation | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (tokens [1] int64, logits [1, V]) per new token of one row until it finishes (decode_steps' contract:
    `finished` maps 0 -> reason, the caller may add it between yields). proposer: an ngram.NgramProposer, a
    draft.DraftProposer or None (the constraint's forced tokens only); stats: a Speculation to count into."""
    finished = {} if finished is None else finished
    stats = Speculation() if stats is None else stats
    sampler = SamplerChain(config, engine.vocab_size)
    state = RowState(prompt, row_stop_ids(config.stop_ids, constraint), config.max_new_tokens, constraint)
    masks = Masks(1, engine.vocab_size) if constraint is not None else None

    # Prefill: the prompt into the cache, the last position's logits.
    input_ids, attention_mask, position_ids = prefill_inputs([prompt], pad_id)
    decoder = engine.decoder(1, capacity=len(prompt) + config.max_new_tokens)
    passes = VerifyPasses(decoder)
    if masks is not None:
        masks.start([constraint])  # the first position's mask while the pass runs (as in decode_steps)
    logits, draft, forced, drawn = decoder.run(input_ids, attention_mask, position_ids)[0, -1:], [], 0, None
    while True:
        # Accept: position i's pick, after the i draft ids before it were accepted; the draft ends at a mismatch.
        picks = []
        for i, row in enumerate(logits):
            row = row[None]  # [1, V]
            if masks is not None:
                if i:  # the first was started before the pass
                    masks.start([constraint])
                row = sampler.constrain(row, masks.wait())
            if drawn is not None and forced <= i < len(draft):  # a draft token drawn from q: rejection sampling
                p = probabilities(sampler.process(row, [state.seen], [state.generated])[0])
                token = rejection_sample(p, drawn[i - forced], draft[i], rng)[1]
            else:  # the chain's pick: it confirms a fixed proposal or replaces it
                token = int(sampler(row, [state.seen], [state.generated], [rng])[0])
            picks.append(token)
            reason = state.append(token)
            if reason is not None:
                finished[0] = reason
            yield np.array([token], dtype=np.int64), row
            if 0 in finished or accepted_prefix(picks, draft) < len(picks) or len(picks) > len(draft):
                break
        accepted = accepted_prefix(picks, draft)
        stats.accepted += accepted
        if proposer is not None:
            proposer.accepted(len(draft) - forced, max(0, accepted - forced))
        if 0 in finished:
            return
        # Propose, then verify: the last token and the draft in one pass over the cache of the rows before them.
        cached = len(state.seen) - 1
        passes.rewind(cached)
        draft, forced = propose(state, proposer, config.max_new_tokens - len(state.generated) - 1)
        drawn = getattr(proposer, "q", None)  # a sampled draft's distributions, one per proposed id after the forced
        stats.drafted, stats.forced, stats.passes = stats.drafted + len(draft), stats.forced + forced, stats.passes + 1
        if masks is not None:  # after propose(), which reads the same matcher
            masks.start([constraint])
        logits = passes.run([state.seen[-1], *draft], cached)


def propose(state: RowState, proposer, limit: int) -> tuple[list, int]:
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
