"""Several tokens per pass in the running batch (runtime/batching/scheduler.py with runtime/speculative/): a row
speculates while the batch holds at most `speculative_rows` rows, every row decodes one token per pass above that,
and each request's greedy output is token-identical to the same request with speculation off, alone or with
others joining and leaving, on fp32, int8 and int4 packages of the GPT-2 and Llama families."""

import pytest
from edgelm.runtime import load
from edgelm.runtime.batching import scheduler as scheduler_module
from edgelm.runtime.batching.scheduler import Scheduler
from edgelm.runtime.speculative import decode as speculative_decode

from scheduler_job import Job, same

# Prompts that repeat themselves (prompt lookup has spans to propose) and one that does not.
PROMPTS = [
    "one two three four one two three four one two",
    "the cat sat on the mat. the cat sat on",
    "Hello, my name is",
]
PACKAGES = ["tiny_package", "tiny_package_int8", "llama_package", "llama_package_int4"]


@pytest.fixture(scope="module", params=PACKAGES)
def any_model(request):
    return load(request.getfixturevalue(request.param))


@pytest.fixture(scope="module")
def model(tiny_package):
    return load(tiny_package)


def run(scheduler, jobs: list) -> list:
    """Submit every job at once and wait for all of them."""
    for job in jobs:
        scheduler.submit(job)
    for job in jobs:
        assert job.wait().error is None, job.error
    return jobs


def counting_rounds(monkeypatch) -> list:
    """The rows the scheduler's speculative rounds run for: one entry per round."""
    rounds, real = [], speculative_decode.speculative_round

    def counted(step, index, *args, **kwargs):
        rounds.append(index)
        return real(step, index, *args, **kwargs)

    monkeypatch.setattr(scheduler_module.speculative, "speculative_round", counted)
    return rounds


class Oracle:
    """A proposer that knows each greedy output (prompt ids + output ids in `fulls`) and gets every `wrong`-th
    draft's middle id wrong: the verify passes accept whole drafts and reject at known places."""

    def __init__(self, fulls: list, wrong: int = 0, length: int = 5):
        self.fulls, self.wrong, self.length, self.calls = fulls, wrong, length, 0

    def propose(self, seen: list, limit: int) -> list:
        self.calls += 1
        full = next(f for f in self.fulls if f[: len(seen)] == seen)
        draft = full[len(seen) : len(seen) + min(limit, self.length)]
        if self.wrong and self.calls % self.wrong == 0 and draft:
            draft[len(draft) // 2] = (draft[len(draft) // 2] + 1) % 100
        return draft

    def accepted(self, drafted: int, accepted: int) -> None:
        pass


def with_oracle(monkeypatch, model, prompts: list, outputs: list, wrong: int = 0) -> None:
    """Every row's proposer becomes an Oracle of these greedy outputs."""
    fulls = [model.encode(p) + list(o.token_ids) for p, o in zip(prompts, outputs)]
    monkeypatch.setattr(scheduler_module.speculative, "proposer", lambda *args: Oracle(fulls, wrong))


@pytest.mark.parametrize("proposer", ["ngram", "oracle", "oracle-wrong"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_row_alone_speculates_and_gets_its_output_without_speculation(any_model, prompt, proposer, monkeypatch):
    rounds = counting_rounds(monkeypatch)
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=30)
    plain = any_model.generate([prompt], speculative="off", **options)
    if proposer != "ngram":
        with_oracle(monkeypatch, any_model, [prompt], plain, wrong=3 if proposer == "oracle-wrong" else 0)
    scheduler = Scheduler(any_model, max_rows=4)
    try:
        (job,) = run(scheduler, [Job(any_model.batch([prompt], speculative="ngram", **options))])
    finally:
        scheduler.close()
    same(job.batch.completions, plain)
    assert "".join(p.text for p in job.pieces) == plain[0].text  # the pieces add up to the text
    stats = job.batch.completions[0].speculation
    assert stats["passes"] == len(rounds) > 0 and stats["accepted"] <= stats["drafted"]
    if proposer != "ngram":  # drafts accepted: fewer passes than tokens
        assert stats["accepted"] > 0 and stats["passes"] < plain[0].completion_tokens - 1
        assert (stats["accepted"] < stats["drafted"]) == (proposer == "oracle-wrong")


def test_concurrent_requests_get_their_output_without_speculation(model, monkeypatch):
    """Requests that join while one speculates, leave, and leave one row behind, which speculates again: each
    greedy output as with speculation off, the pieces adding up to each text."""
    rounds = counting_rounds(monkeypatch)
    lengths = [28, 6, 12, 3]
    prompts = [PROMPTS[i % 3] for i in range(4)]
    options = dict(do_sample=False, ignore_eos=True)
    plain = [model.generate([p], speculative="off", max_new_tokens=n, **options)[0] for p, n in zip(prompts, lengths)]
    with_oracle(monkeypatch, model, prompts[:3], plain[:3], wrong=3)  # the fourth's output begins the first's
    scheduler = Scheduler(model, max_rows=3)
    scheduler.cache.column_step = 4  # the buffers grow and compact while rows speculate
    jobs = [
        Job(model.batch([PROMPTS[i % 3]], speculative="ngram", do_sample=False, ignore_eos=True, max_new_tokens=n))
        for i, n in enumerate(lengths)
    ]

    def arrive(count):  # the others arrive after the first has speculated a few rounds
        if count == 3:
            for job in jobs[1:]:
                scheduler.submit(job)

    jobs[0].at_boundary = arrive
    scheduler.submit(jobs[0])
    try:
        for job in jobs:
            assert job.wait().error is None
    finally:
        scheduler.close()
    for job, alone in zip(jobs, plain):
        same(job.batch.completions, [alone])
        assert "".join(p.text for p in job.pieces) == alone.text
    stats = jobs[0].batch.completions[0].speculation
    # the long one speculated alone, before the others came and after they left
    assert set(rounds) == {0} and stats["accepted"] > 0 and stats["passes"] + 12 < 28
    assert scheduler.cache.rows == [] and scheduler.cache.buffers is None


def test_above_the_row_limit_every_row_decodes_one_token_per_pass(model, monkeypatch):
    """Two rows from the first step on (the second joins before it): neither speculates until the short one has
    left; then the long one, alone, does."""
    rounds = counting_rounds(monkeypatch)
    scheduler = Scheduler(model, max_rows=4, speculative_rows=1)
    options = dict(speculative="ngram", do_sample=False, ignore_eos=True)
    jobs = [Job(model.batch([PROMPTS[0]], max_new_tokens=n, **options)) for n in (30, 8)]
    plain = [model.generate([PROMPTS[0]], max_new_tokens=n, **{**options, "speculative": "off"}) for n in (30, 8)]
    with_oracle(monkeypatch, model, PROMPTS[:1], plain[0])

    def arrive(count):  # at the first job's start: the second joins in the same boundary, before the first step
        if count == 1:
            scheduler.submit(jobs[1])

    jobs[0].at_boundary = arrive
    scheduler.submit(jobs[0])
    try:
        for job in jobs:
            assert job.wait().error is None
    finally:
        scheduler.close()
    for job, alone in zip(jobs, plain):
        same(job.batch.completions, alone)
    assert jobs[1].batch.completions[0].speculation is None  # never alone: no round ran for it, nothing to report
    long = jobs[0].batch.completions[0].speculation
    assert long["passes"] == len(rounds) > 0  # alone after the short one left
    assert long["passes"] + 8 < 30  # the 8 steps with two rows gave one token each; the rest came several a pass


def test_several_rows_speculate_under_a_higher_limit_and_stay_aligned(model):
    """speculative_rows=3: each of three rows takes its own verify pass and keeps a different count of tokens;
    the slot cache realigns them and every output is as without speculation."""
    scheduler = Scheduler(model, max_rows=3, speculative_rows=3)
    lengths = [25, 18, 30]
    jobs = [
        Job(model.batch([p], speculative="ngram", do_sample=False, ignore_eos=True, max_new_tokens=n))
        for p, n in zip(PROMPTS, lengths)
    ]
    try:
        run(scheduler, jobs)
    finally:
        scheduler.close()
    for job, prompt, n in zip(jobs, PROMPTS, lengths):
        same(job.batch.completions, model.generate([prompt], speculative="off", do_sample=False, ignore_eos=True,
                                                   max_new_tokens=n))  # fmt: skip
        assert job.batch.completions[0].speculation["passes"] > 0


def test_a_constrained_row_feeds_its_forced_tokens_in_one_pass(model, monkeypatch):
    rounds = counting_rounds(monkeypatch)
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["crimson red", "ocean blue"]}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    options = dict(do_sample=False, max_new_tokens=40, json_schema=schema)
    scheduler = Scheduler(model, max_rows=2)
    try:
        (job,) = run(scheduler, [Job(model.batch(["Answer:"], speculative="auto", **options))])
    finally:
        scheduler.close()
    same(job.batch.completions, model.generate(["Answer:"], speculative="off", **options))
    stats = job.batch.completions[0].speculation
    assert rounds and stats["forced"] > 0 and stats["passes"] < job.batch.completions[0].completion_tokens


def test_speculation_off_runs_no_round(model, monkeypatch):
    rounds = counting_rounds(monkeypatch)
    scheduler = Scheduler(model, max_rows=2)
    try:
        (job,) = run(scheduler, [Job(model.batch([PROMPTS[0]], speculative="off", max_new_tokens=10))])
    finally:
        scheduler.close()
    assert rounds == [] and job.batch.completions[0].speculation is None


def test_auto_adds_prompt_lookup_only_where_its_constant_says(model, monkeypatch):
    from edgelm.runtime import speculative

    config = model.settings(speculative="auto")
    assert not speculative.uses(config, 1, [None]) and speculative.proposer(config) is None
    assert model.generate(PROMPTS[0], max_new_tokens=8).speculation is None  # auto, nothing forced: one per pass
    monkeypatch.setattr(speculative, "AUTO_NGRAM", True)
    assert speculative.uses(config, 1, [None]) and isinstance(speculative.proposer(config), speculative.NgramProposer)
    assert model.generate(PROMPTS[0], max_new_tokens=8).speculation["passes"] > 0


def test_a_draft_model_proposes_in_the_running_batch(tiny_package):
    """The package as its own draft: its greedy guesses are the target's, so nearly all are accepted; two
    requests, one after the other, get their output without speculation."""
    model = load(tiny_package, draft=tiny_package)
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=20)
    scheduler = Scheduler(model, max_rows=2)
    jobs = [Job(model.batch([prompt], speculative="draft", **options)) for prompt in PROMPTS[1:]]
    try:
        run(scheduler, jobs[:1])
        run(scheduler, jobs[1:])
    finally:
        scheduler.close()
    for job, prompt in zip(jobs, PROMPTS[1:]):
        same(job.batch.completions, model.generate([prompt], speculative="off", **options))
        stats = job.batch.completions[0].speculation
        assert stats["accepted"] > 0 and stats["passes"] < 19
