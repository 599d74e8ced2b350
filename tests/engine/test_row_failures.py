"""A row's failure is that row's alone: its constraint's mask or matcher, the sampler on its row or its text fails,
in Model.batch, in the running batch or in the server with other clients; it ends with its own error, and every
other row gets the tokens it gets alone and never sees that error's text."""

import json
import threading
import time

import llguidance.numpy
import numpy as np
import pytest
from edgelm.runtime import load
from edgelm.runtime.batching.rows import Rows
from edgelm.runtime.batching.scheduler import Scheduler
from edgelm.runtime.batching.step import Step
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling.constraint import Grammar
from edgelm.runtime.server.api.requests import Limits
from scheduler_job import Job
from server_harness import HTTP, InProcessServer, gate

LETTERS = "[a-z]{60,80}"  # a constraint no row can finish within these tests' lengths: every row reaches its fault
PROMPTS = ["Hi", "The quick brown", "Once", "A", "import numpy"]
TOO_MANY = "too many expressions constructed"  # what llguidance says when a step passes its limits


class MaskFaults:
    """llguidance's mask computation failing for chosen rows' matchers from their `step`th mask on (the first mask
    is the first token's): raised by the fill, as a step over llguidance's limits raises, or (raises=False) with
    the matcher left in llguidance's own error state, as a matcher that fails inside a step is."""

    def __init__(self, monkeypatch, forbidden: int, raises: bool = True):
        self.due, self.counts, self.failed = {}, {}, set()  # id(matcher) -> (matcher, step); masks so far; failed
        fill_all, fill_one = llguidance.numpy.fill_next_token_bitmask_par, llguidance.numpy.fill_next_token_bitmask

        def fill_par(executor, pairs, bitmask):
            for matcher, _ in pairs:
                if id(matcher) not in self.due:  # counted only while held in `due`: a freed matcher's id is reused
                    continue
                self.counts[id(matcher)] = count = self.counts.get(id(matcher), 0) + 1
                if count == self.due[id(matcher)][1]:
                    self.failed.add(id(matcher))
                    if not raises:
                        matcher.consume_token(forbidden)  # not allowed: llguidance's error state
            if raises and any(id(matcher) in self.failed for matcher, _ in pairs):
                raise ValueError(TOO_MANY)
            return fill_all(executor, pairs, bitmask)

        def fill(matcher, bitmask, index=0):
            if raises and id(matcher) in self.failed:
                raise ValueError(TOO_MANY)
            return fill_one(matcher, bitmask, index)

        monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask_par", fill_par)
        monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask", fill)

    def fail(self, monkeypatch, rows: Rows, index: int, step: int) -> None:
        """Row `index` of `rows` (a constrained row) fails at its `step`th mask."""
        make = rows.constraint

        def constraint(row):
            made = make(row)
            if row == index:
                self.due[id(made.matcher)] = (made.matcher, step)
            return made

        monkeypatch.setattr(rows, "constraint", constraint)


def fail_text(monkeypatch, rows: Rows, index: int, step: int, error: Exception) -> None:
    """Row `index`'s text fails at its `step`th token (a detokenizer, a tool-call reader)."""
    take, seen = rows.take, []

    def failing(row, *args):
        if row == index:
            seen.append(1)
            if len(seen) == step:
                raise error
        return take(row, *args)

    monkeypatch.setattr(rows, "take", failing)


def forbidden(model) -> int:
    return model.encode("0")[0]  # a digit: never allowed by LETTERS


def same_tokens(got, alone) -> None:
    assert got.error is None
    assert (got.token_ids, got.text, got.finish_reason) == (alone.token_ids, alone.text, alone.finish_reason)


@pytest.mark.parametrize("raises", [True, False])
def test_a_rows_mask_failing_at_a_later_step_ends_that_row_only_in_model_batch(model, monkeypatch, raises):
    options = [{}, {"regex": LETTERS}, {"regex": LETTERS}, {}]
    configs = [model.settings(max_new_tokens=10, **o) for o in options]
    solo = [model.generate([p], config=c)[0] for p, c in zip(PROMPTS, configs)]
    faults = MaskFaults(monkeypatch, forbidden(model), raises)
    batch = model.batch(PROMPTS[:4], config=configs)
    faults.fail(monkeypatch, batch.rows, 1, step=3)
    completions = batch.run()
    failed = completions[1]
    assert failed.finish_reason == "error" and isinstance(failed.error, GenerationOptionError)
    assert str(failed.error).startswith("the regex constraint failed") and "row" not in str(failed.error)
    assert failed.token_ids == solo[1].token_ids[:2]  # its first two tokens, then the third mask failed
    assert batch.error is failed.error and failed.to_dict()["error"] == str(failed.error)
    for k in (0, 2, 3):
        same_tokens(completions[k], solo[k])


def fail_every_matcher(monkeypatch, faults: MaskFaults, step: int) -> None:
    """Every row matcher made from now on fails at its `step`th mask."""
    make = Grammar.row

    def row(grammar):
        made = make(grammar)
        faults.due[id(made.matcher)] = (made.matcher, step)
        return made

    monkeypatch.setattr(Grammar, "row", row)


def test_a_call_of_one_row_raises_the_error_that_ended_it(model, monkeypatch):
    fail_every_matcher(monkeypatch, MaskFaults(monkeypatch, forbidden(model)), step=2)
    with pytest.raises(GenerationOptionError, match=TOO_MANY):
        model.generate("Hi", regex=LETTERS, max_new_tokens=8)
    with pytest.raises(GenerationOptionError, match=TOO_MANY):
        list(model.stream("Hi", regex=LETTERS, max_new_tokens=8))


def test_a_row_whose_sampler_fails_ends_alone_and_the_others_draw_what_they_draw_without_it(model, monkeypatch):
    """The sampler fails on one row of a call's batched pick: each row is picked again alone, from its generator
    as it was, so a seeded survivor draws the same tokens."""
    config = GenerationConfig(do_sample=True, seed=3, top_k=0, num_return_sequences=3, max_new_tokens=6)
    prompts = [model.encode("Once upon")]
    rows = np.random.default_rng(0).standard_normal((3, model.arch.vocab_size)).astype(np.float32)
    clean = Step(Rows(None, prompts, config), model.arch.vocab_size)
    broken = Step(Rows(None, prompts, config), model.arch.vocab_size)
    bad_seen = broken.states[1].seen

    class Failing:  # draws for every row, then fails for row 1
        def __init__(self, chain):
            self.chain = chain

        def __call__(self, logits, seen, *args):
            picks = self.chain(logits, seen, *args)
            if any(s is bad_seen for s in seen):
                raise GenerationOptionError("every token was banned")
            return picks

        def __getattr__(self, name):
            return getattr(self.chain, name)

    broken.sampler = Failing(broken.sampler)
    for step in range(3):
        clean([0, 1, 2], rows + step)
        broken([k for k in range(3) if not broken.states[k].finished], rows[[0, 2] if step else [0, 1, 2]] + step)
    assert broken.states[1].finish_reason == "error" and str(broken.error) == "every token was banned"
    for k in (0, 2):
        assert len(broken.states[k].generated) == 3
        assert broken.states[k].generated == clean.states[k].generated


def test_a_failing_request_in_the_servers_running_batch_ends_alone(tiny_package, monkeypatch):
    """Five clients in one running batch, one with a schema whose mask computation fails at its third token: that
    client gets its own error; the others get what each gets alone, and none sees the failing one's error."""
    model = load(tiny_package)
    fail_every_matcher(monkeypatch, MaskFaults(monkeypatch, forbidden(model)), step=3)  # one request is constrained
    engine = gate(model, free=0)
    server = InProcessServer(model, Limits(max_tokens=50), max_batch=8)
    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{60,80}$"}}}
    bodies = [{"prompt": p, "max_tokens": 10, "temperature": 0} for p in PROMPTS]
    bodies[2]["response_format"] = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    try:
        engine.hold()
        answers = [None] * len(bodies)

        def send(k):
            answers[k] = HTTP.post(server.url + "/v1/completions", json=bodies[k])

        clients = [threading.Thread(target=send, args=(k,)) for k in range(len(bodies))]
        for client in clients:
            client.start()
        for _ in range(200):  # every request holds its place in the batch before the first pass runs
            if server.health()["active"] == len(bodies):
                break
            time.sleep(0.05)
        engine.release()
        for client in clients:
            client.join(60)
        alone = [HTTP.post(server.url + "/v1/completions", json=body) for k, body in enumerate(bodies) if k != 2]
    finally:
        server.stop()
    assert answers[2].status_code == 400 and "json_schema constraint failed" in answers[2].text
    assert TOO_MANY in answers[2].text
    survivors = [answer for k, answer in enumerate(answers) if k != 2]
    for got, expected in zip(survivors, alone):
        assert got.status_code == 200 and "constraint" not in got.text
        assert got.json()["choices"][0]["text"] == expected.json()["choices"][0]["text"]


@pytest.mark.parametrize("seed", range(5))
def test_random_failing_rows_leave_the_other_rows_of_the_running_batch_as_they_are_alone(model, monkeypatch, seed):
    """Jobs, some constrained, some failing at a random step by their mask or their text, join a running batch of
    fewer slots than rows: every job without a fault gets what it gets alone, every failing one its own error."""
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(int(rng.integers(3, 6))):
        constrained = bool(rng.random() < 0.6)
        fault = rng.choice(["mask", "text", None, None]) if constrained else rng.choice(["text", None, None])
        options = dict(max_new_tokens=int(rng.integers(4, 10)), ignore_eos=True)
        options.update({"regex": LETTERS} if constrained else {})
        cases.append((PROMPTS[int(rng.integers(len(PROMPTS)))], options, fault, int(rng.integers(1, 5))))
    solo = [model.generate([p], **options)[0] for p, options, _, _ in cases]
    faults = MaskFaults(monkeypatch, forbidden(model), raises=bool(seed % 2))
    scheduler = Scheduler(model, max_rows=3)
    jobs = []
    for k, (prompt, options, fault, step) in enumerate(cases):
        job = Job(model.batch([prompt], **options))
        if fault == "mask":
            faults.fail(monkeypatch, job.batch.rows, 0, step)
        elif fault == "text":
            fail_text(monkeypatch, job.batch.rows, 0, step, RuntimeError(f"the text of job {k} failed"))
        jobs.append(job)
        scheduler.submit(job)
    try:
        for k, (job, (_, options, fault, step)) in enumerate(zip(jobs, cases)):
            job.wait()
            if fault is None or step > options["max_new_tokens"]:
                assert job.error is None, (k, job.error)
                same_tokens(job.batch.completions[0], solo[k])
            elif fault == "text":
                assert str(job.error) == f"the text of job {k} failed"
            else:
                assert isinstance(job.error, GenerationOptionError)
                assert str(job.error).startswith("the regex constraint failed")
    finally:
        scheduler.close()


def test_a_prompt_file_line_whose_row_fails_gets_its_error_and_the_others_their_results(
    tiny_package, model, monkeypatch, tmp_path
):
    """Lines that share their options run as one batch: the line whose matcher fails at its second mask is an
    error line, the others are what they are alone."""
    from click.testing import CliRunner
    from edgelm.runtime.cli.main import main

    solo = [model.generate([p], regex=LETTERS, max_new_tokens=8)[0].text for p in ("Hi", "The quick brown")]
    faults, make, made = MaskFaults(monkeypatch, forbidden(model)), Grammar.row, []

    def row(grammar):  # the batch's second row (the second line's) fails
        made.append(make(grammar))
        if len(made) == 2:
            faults.due[id(made[-1].matcher)] = (made[-1].matcher, 2)
        return made[-1]

    monkeypatch.setattr(Grammar, "row", row)
    lines = [{"prompt": p, "regex": LETTERS} for p in ("Hi", "Once", "The quick brown")]
    source, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["generate", "-m", tiny_package, "--input", source, "--output", output, "--max-new-tokens", 8, "--quiet"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 1 and "1 of 3 lines failed (line 2)" in result.output
    out = [json.loads(line) for line in output.read_text().splitlines()]
    assert set(out[1]) >= {"error"} and "text" not in out[1] and TOO_MANY in out[1]["error"]
    assert [out[0]["text"], out[2]["text"]] == solo
