"""A draft model's proposals: a smaller edgelm package of the same tokenizer guesses the next tokens, one cheap
pass each, and the target verifies them all in one pass (Leviathan et al. 2023; transformers' assistant_model).

The draft keeps a key/value cache of its own and rolls it back to the tokens both models agree on (in place: a
length reset, no copy). A greedy row's draft proposes its greedy picks under the request's filters: a fixed
sequence, which verify.py's first rule accepts exactly. A sampled row's draft draws each token from its own
distribution after the same filters (q), and the target accepts by speculative rejection sampling.

Where prompt lookup has a match (ngram.py), its proposal is taken instead: it costs no pass of the draft, and
copying a span of the prompt or of a repeating run is accepted at least as long as the draft's guesses would be.
It is a fixed sequence (q is None for it), accepted by verify.py's first rule; each proposer keeps its own draft
length and off-switch, so the draft still guesses while lookup is paused or finds nothing.
"""

import hashlib
from dataclasses import replace

import numpy as np

from ..engine.steps import prefill_inputs
from ..engine.verify_pass import VerifyPasses
from ..errors import PackageError
from ..sampling import SamplerChain
from .ngram import Adaptive, NgramProposer
from .verify import probabilities

# The draft's off-switch (ngram.Adaptive). Each guess costs a pass of the draft: a one-token draft a quarter of
# the target's cost pays for itself only when it is accepted about half the time, where prompt lookup's cost
# nothing to make. So the draft starts at one token, is judged over a shorter window, needs half its tokens
# accepted, and pauses twice as long after each window that fails again (on varied text it rarely pays).
MIN_ACCEPTANCE = 0.5
WINDOW = 12
MAX_PAUSE = 384
START_DRAFT = 1
MAX_DRAFT = 8  # guesses per pass at most: each costs a pass of the draft, and a longer run is less often right

class DraftProposer:
    """One row's draft-model proposer: propose(seen, limit) -> ids, then accepted(drafted, accepted)."""

    def __init__(self, engine, config, prompt_length: int, target_vocab: int, context: int, rng=None):
        """engine: the draft's; context: the draft model's positions (it proposes nothing past them); rng: the
        row's generator, which a sampled row's draft draws from."""
        self.engine, self.prompt_length, self.target_vocab, self.rng = engine, prompt_length, target_vocab, rng
        # its cache: the prompt, the output, and the draft's own guesses (MAX_DRAFT at most past the output)
        self.capacity = min(context, prompt_length + config.max_new_tokens + MAX_DRAFT + 1)
        self.decoder = engine.decoder(1, capacity=self.capacity)
        self.passes = VerifyPasses(self.decoder)
        self.sampled = config.do_sample
        self.chain = SamplerChain(_unconstrained(config), engine.vocab_size)
        self.fed: list = []  # the ids whose rows the draft's cache holds, in order
        # its draft length and off-switch, as prompt lookup's (ngram.py); while paused its cache falls behind and
        # catches up in one pass when it proposes again
        self.adapt = Adaptive(
            start=START_DRAFT,
            draft=START_DRAFT,
            max_draft=MAX_DRAFT,
            grow=1,
            min_acceptance=MIN_ACCEPTANCE,
            window=WINDOW,
            max_pause=MAX_PAUSE,
        )
        self.lookup = NgramProposer(no_repeat=config.no_repeat_ngram_size)  # tried first, as draft.py's docstring says
        self.source = self.adapt  # whose proposal the last pass verified: the draft's or lookup's
        # Sampled rows: the draft's distribution at each proposed position ([target V] float64), for
        # verify.rejection_sample; None for greedy rows, whose proposals are fixed.
        self.q: list | None = None

    def propose(self, seen: list, limit: int) -> list:
        copied = self.lookup.propose(seen, limit)
        if copied:
            self.source, self.q = self.lookup, None
            return copied
        self.source = self.adapt
        limit = min(limit, self.adapt.draft, self.capacity - len(seen))
        if self.adapt.pausing() or limit <= 0:
            return []
        logits = self._catch_up(seen)
        ids = list(seen)
        out, self.q = [], [] if self.sampled else None
        while True:
            if self.sampled:  # a draw from q, the draft's distribution after every filter of the chain
                q = self._distribution(logits, ids)
                self.q.append(q)
                cumulative = np.cumsum(q)
                token = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
            else:
                token = int(self.chain(logits[None], [ids], [ids[self.prompt_length :]], [None])[0])
                if token >= self.target_vocab:  # an id the target does not have (a padded draft vocabulary)
                    break
            out.append(token)
            ids.append(token)
            if len(out) == limit:
                break
            logits = self.passes.run([token], len(self.fed))[-1]
            self.fed.append(token)
        return out

    def _distribution(self, logits: np.ndarray, ids: list) -> np.ndarray:
        """q over the target's vocabulary: the chain's filters on the draft's logits, ids the target lacks at 0."""
        # [V_draft] -> [target V] float64
        filtered = self.chain.process(logits[None], [ids], [ids[self.prompt_length :]])[0][: self.target_vocab]
        q = np.zeros(self.target_vocab)
        q[: len(filtered)] = probabilities(filtered)
        return q

    def accepted(self, drafted: int, accepted: int) -> None:
        """Grow the draft of the proposer that made it (the draft model or lookup) while it is accepted whole, shrink
        it to what was; pause that proposer after low acceptance."""
        self.source.accepted(drafted, accepted)

    def _catch_up(self, seen: list) -> np.ndarray:
        """Roll the cache back to the ids `seen` shares with it, feed the rest; the last position's logits [V]."""
        common = 0
        for a, b in zip(self.fed, seen):
            if a != b:
                break
            common += 1
        common = min(common, len(seen) - 1)  # at least one id is fed: its logits are the next guess's
        if common == 0:  # the prompt: in the decoder's chunks, the last position's logits only
            input_ids, attention_mask, position_ids = prefill_inputs([seen], 0)
            self.fed, self.passes.length = list(seen), len(seen)
            return self.decoder.run(input_ids, attention_mask, position_ids)[0, -1]
        self.passes.rewind(common)
        logits = self.passes.run(seen[common:], common)[-1]
        self.fed = list(seen)
        return logits


def _unconstrained(config):
    """The settings the draft picks or draws under: the request's filters without its constraint (the target's
    verification applies the grammar)."""
    return replace(config, num_return_sequences=1, greedy_copies=False, json_schema=None, json_object=False,
                   regex=None, grammar=None, choices=None, vocab_size=None)  # fmt: skip


def check_same_tokenizer(target, draft) -> None:
    """A draft package must share the target's tokenizer, so that its ids mean the same: tokenizer.json's sha256
    (target, draft: open packages); PackageError in one line otherwise."""
    digests = [hashlib.sha256(p.tokenizer_text().encode()).hexdigest() for p in (target, draft)]
    if digests[0] != digests[1]:
        raise PackageError(
            f"the draft model {draft.folder} has another tokenizer than {target.folder} (tokenizer.json sha256 "
            f"{digests[1][:12]} against {digests[0][:12]}): a draft must share the target's tokenizer; pick a "
            "smaller model of the same family."
        )
