"""Continuous batching (runtime/batching/scheduler.py, runtime/batching/slot_cache.py) on the tiny fp32 package: requests that
join and leave one running batch at different steps each get exactly what Model.generate gives them alone."""

import numpy as np
import pytest
from edgelm.runtime import load
from edgelm.runtime.batching import scheduler as scheduler_module
from edgelm.runtime.batching.scheduler import Scheduler
from scheduler_job import Job, same

# (prompts, options): greedy, seeded, several prompts and n, per-row filters, stop strings, log-probs, lengths
CASES = [
    (["Hello"], dict(do_sample=False, ignore_eos=True, max_new_tokens=24)),
    (["Once upon a time, in a land far away, there lived"], dict(do_sample=False, max_new_tokens=3)),
    (["The quick brown fox jumps over"], dict(do_sample=True, seed=1, top_k=0, max_new_tokens=20)),
    (["Once", "import numpy as np\n"], dict(do_sample=True, seed=5, num_return_sequences=2, max_new_tokens=9)),
    (["Numbers: 0 1 2"], dict(do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=2, max_new_tokens=15)),
    (["The quick"], dict(do_sample=True, seed=3, temperature=0.7, top_p=0.9, stop=["e"], max_new_tokens=30)),
    (["Émile a visité"], dict(do_sample=False, logprobs=3, max_new_tokens=6)),
    (["A"], dict(do_sample=True, seed=9, min_new_tokens=4, max_new_tokens=5)),
    (
        ["Hello there"],
        dict(do_sample=True, seed=4, top_k=0, temperature=1.3, repetition_penalty=1.2, max_new_tokens=12),
    ),
]


def each_gets_what_it_gets_alone(model, jobs, options) -> None:
    """Every job ends without an error, with what Model.generate gives its prompts alone under `options`."""
    for job in jobs:
        assert job.wait().error is None
        same(job.batch.completions, model.generate(list(job.batch.prompts), **options))


def test_requests_joining_at_different_steps_get_what_they_get_alone(model):
    scheduler = Scheduler(model, max_rows=6)
    scheduler.cache.column_step = 4  # capacities in steps of 4: the buffers grow, and compact as rows come and go
    jobs = [Job(model.batch(prompts, **options)) for prompts, options in CASES]

    def stagger(count):  # job i arrives at the first job's (3i - 2)-th step boundary
        for i in range(1, len(jobs)):
            if count == 3 * i - 2:
                scheduler.submit(jobs[i])

    jobs[0].at_boundary = stagger
    scheduler.submit(jobs[0])
    try:
        for job, (prompts, options) in zip(jobs, CASES):
            assert job.wait().error is None
            same(job.batch.completions, model.generate(list(prompts), **options))
            texts = ["".join(p.text for p in job.pieces if p.index == row) for row in range(len(job.batch.rows))]
            assert texts == [c.text for c in job.batch.completions]  # the pieces add up to each text
    finally:
        scheduler.close()
    assert scheduler.cache.rows == [] and scheduler.cache.buffers is None  # an empty batch holds no memory


def test_a_stopped_job_leaves_at_once_and_the_others_go_on(model):
    scheduler = Scheduler(model, max_rows=2)
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=20)
    stopped = Job(model.batch(["The quick"], **options))
    kept = Job(model.batch(["Hello"], **options))
    late = Job(model.batch(["Once"], **options))  # waits for a slot: the stopped job's

    def stop_at(count):
        if count == 4:
            stopped.stop = "the client went away"
            scheduler.submit(late)

    stopped.at_boundary = stop_at
    scheduler.submit(stopped)
    scheduler.submit(kept)
    try:
        assert str(stopped.wait().error) == "the client went away"
        assert len(stopped.pieces) < 20
        each_gets_what_it_gets_alone(model, (kept, late), options)
        assert late.boundaries < kept.boundaries + 3  # it joined when the slot was freed, not when `kept` ended
    finally:
        scheduler.close()


def test_rows_wait_in_arrival_order_for_a_free_slot(model):
    """One slot: three rows of one request, then a second request; each starts once the previous row ended."""
    scheduler = Scheduler(model, max_rows=1)
    options = dict(do_sample=True, seed=2, num_return_sequences=3, max_new_tokens=4, ignore_eos=True)
    first = Job(model.batch(["Hi"], **options))
    second = Job(model.batch(["Hello"], do_sample=False, max_new_tokens=4, ignore_eos=True))
    order = []
    original = scheduler.cache.join

    def join(row, source, length, **where):
        order.append((row.entry.job is first, row.index))
        original(row, source, length, **where)

    scheduler.cache.join = join
    scheduler.submit(first)
    scheduler.submit(second)
    try:
        assert first.wait().error is None and second.wait().error is None
    finally:
        scheduler.close()
    assert order == [(True, 0), (True, 1), (True, 2), (False, 0)]
    same(first.batch.completions, model.generate("Hi", **options))


def test_a_failing_job_ends_with_its_error_alone(model):
    scheduler = Scheduler(model, max_rows=4)
    bad = Job(model.batch(["Hi"], do_sample=False, max_new_tokens=5))
    good = Job(model.batch(["Hello"], do_sample=False, max_new_tokens=5))

    def broken(piece):
        raise ValueError("the listener broke")

    bad.piece = broken
    scheduler.submit(bad)
    scheduler.submit(good)
    try:
        assert isinstance(bad.wait().error, ValueError)
        assert good.wait().error is None
        same(good.batch.completions, model.generate(["Hello"], do_sample=False, max_new_tokens=5))
    finally:
        scheduler.close()


def test_slot_cache_keeps_each_row_right_aligned(model):
    """join / leave / step at the cache level: masks and positions follow each row's own length."""
    scheduler = Scheduler(model, max_rows=3)
    cache = scheduler.cache
    cache.column_step = 4
    engine = model.engine
    rows = []
    for ids in ([5, 6, 7], [8], [9, 10, 11, 12, 13]):
        decoder = engine.decoder(1, len(ids))
        arr = np.asarray([ids])
        decoder.run(arr, np.ones_like(arr), np.arange(len(ids))[None])
        cache.join(ids, decoder.buffers, len(ids))
        rows.append(ids)
    assert cache.width == 5 and cache.lengths == [3, 1, 5]
    cache.leave(0)  # the last row moves into slot 0
    assert cache.rows == [rows[2], rows[1]] and cache.lengths == [5, 1]
    logits = cache.step(np.array([1, 2]))
    assert logits.shape == (2, model.arch.vocab_size) and cache.width == 6 and cache.lengths == [6, 2]


def test_every_row_keeps_its_own_cache_as_rows_join_and_leave_in_any_order(model):
    """A leaving row's slot takes the last row, with its cache and length: every row's positions hold what it
    joined with, whatever left before it."""
    scheduler = Scheduler(model, max_rows=6)
    cache, engine = scheduler.cache, model.engine
    cache.column_step = 4
    rng = np.random.default_rng(0)
    shape = (1, engine.kv_heads, 0, engine.head_size)
    tensors = engine.cache_tensors
    live, made = [], 0
    for _ in range(60):
        if live and (len(live) == 6 or rng.random() < 0.45):
            cache.leave(int(rng.integers(len(cache.rows))))
        else:
            length, made = int(rng.integers(1, 9)), made + 1
            source = [np.full(shape[:2] + (length,) + shape[3:], made, dtype=np.float32) for _ in range(tensors)]
            cache.join((made, length), source, length)
        live = list(cache.rows)
        assert [length for _, length in live] == cache.lengths
        for slot, (value, _) in enumerate(live):
            held = [b[slot, :, cache.width - cache.lengths[slot] : cache.width] for b in cache.buffers]
            assert all(np.all(h == value) for h in held), slot
    assert made > 20


def test_a_fault_of_the_scheduler_ends_every_job_and_the_next_ones_run(model):
    scheduler = Scheduler(model, max_rows=4)
    options = dict(do_sample=False, max_new_tokens=6, ignore_eos=True)
    jobs = [Job(model.batch([p], **options)) for p in ("Hi", "Hello")]
    step = scheduler._step

    def broken():
        raise IndexError("a bug in the scheduler")

    scheduler._step = broken
    for job in jobs:
        scheduler.submit(job)
    try:
        assert all(isinstance(job.wait().error, IndexError) for job in jobs)
        scheduler._step = step
        after = Job(model.batch(["Once"], **options))
        scheduler.submit(after)
        assert after.wait().error is None
        same(after.batch.completions, model.generate(["Once"], **options))
    finally:
        scheduler.close()


def test_running_batch_decoders_bypass_the_prefix_cache(tiny_package):
    """Batch-1 prefills of joining rows may restore rows from the prefix cache; a decoder over the running batch's
    own buffers (one row or more) never reads or stores there."""
    model = load(tiny_package, prefix_cache_mb=1)
    engine = model.engine
    assert engine.decoder(1, 8).prefix_cache is engine.prefix_cache is not None
    scheduler = Scheduler(model, max_rows=2)
    job = Job(model.batch(["Hello"], do_sample=False, max_new_tokens=3, ignore_eos=True))
    decoders = []
    make = engine.decoder
    engine.decoder = lambda *args, **options: decoders.append(make(*args, **options)) or decoders[-1]
    scheduler.submit(job)
    try:
        assert job.wait().error is None
    finally:
        scheduler.close()
    assert [d.prefix_cache is None for d in decoders] == [False, True]  # the prefill, then the batch's decoder


def test_short_prompts_arriving_together_share_one_prefill_and_get_what_they_get_alone(model, monkeypatch):
    """One-prompt jobs with short prompts that wait at the same boundary are prefilled in one left-padded pass
    (so the last does not wait for the others' prefills one by one), and each still gets what it gets alone."""
    cases = [c for c in CASES if len(c[0]) == 1]
    scheduler = Scheduler(model, max_rows=16)
    passes = []
    decoder = scheduler.engine.decoder
    monkeypatch.setattr(
        scheduler.engine, "decoder", lambda batch, *a, **k: passes.append(batch) or decoder(batch, *a, **k)
    )
    jobs = [Job(model.batch(prompts, **options)) for prompts, options in cases]
    with scheduler._wake:  # every job queued before the scheduler's first boundary: they arrive together
        scheduler._new.extend(jobs)
    scheduler._thread.start()
    for job, (prompts, options) in zip(jobs, cases):
        assert job.wait().error is None
        same(job.batch.completions, model.batch(prompts, **options).run())
    scheduler.close()
    assert passes[0] == len(cases)  # one prefill pass for all of them, before any decode step


def test_requests_arriving_during_a_prefill_join_before_the_next_step(model, monkeypatch):
    """A request that arrives while rows are prefilled joins in another round before the batch steps (its first
    token waits for no decode step), for up to JOIN_ROUNDS rounds a boundary; each gets what it gets alone."""
    monkeypatch.setattr(scheduler_module, "JOIN_ROUNDS", 3)
    prompts = ["Hi", "Hello", "Once", "The quick", "A", "Numbers"]
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=4)
    jobs = [Job(model.batch([p], **options)) for p in prompts]
    scheduler = Scheduler(model, max_rows=8)
    arrivals, steps = iter(jobs[1:]), []
    decoder, step = scheduler.engine.decoder, scheduler.cache.step

    def prefill_while_one_arrives(batch, capacity, buffers=None, **options):
        if buffers is None:  # a joining row's prefill (the running batch's decoder gets the slots' buffers)
            arriving = next(arrivals, None)
            if arriving is not None:
                scheduler.submit(arriving)
        return decoder(batch, capacity, buffers=buffers, **options)

    monkeypatch.setattr(scheduler.engine, "decoder", prefill_while_one_arrives)
    monkeypatch.setattr(scheduler.cache, "step", lambda ids, *more: steps.append(len(ids)) or step(ids, *more))
    scheduler.submit(jobs[0])
    try:
        each_gets_what_it_gets_alone(model, jobs, options)
    finally:
        scheduler.close()
    assert steps[:2] == [
        3,
        6,
    ]  # three prefills (one arrival during each) before the first step, three more before the second


def test_a_shared_prefill_picks_every_first_token_before_its_rows_join_and_grows_the_cache_once(model, monkeypatch):
    """Rows prefilled in one pass all get their first token (and send its text) before any is copied into the
    batch, which makes room for all of them in one reallocation, not one per doubling."""
    prompts = ["Hi", "Hello", "Once", "The quick", "A"]
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=3)
    jobs = [Job(model.batch([p], **options)) for p in prompts]
    scheduler = Scheduler(model, max_rows=8)
    events, buffers = [], []
    pick, join = scheduler._pick, scheduler.cache.join

    def joined(*args, **kwargs):
        join(*args, **kwargs)
        events.append("join")
        buffers.append(id(scheduler.cache.buffers[0]))

    monkeypatch.setattr(scheduler, "_pick", lambda entry, rows, *a: events.append(len(rows)) or pick(entry, rows, *a))
    monkeypatch.setattr(scheduler.cache, "join", joined)
    with scheduler._wake:  # every job queued before the first boundary: one shared prefill
        scheduler._new.extend(jobs)
    scheduler._thread.start()
    try:
        each_gets_what_it_gets_alone(model, jobs, options)
    finally:
        scheduler.close()
    assert events[:10] == [1] * 5 + ["join"] * 5  # five first tokens, then five rows into the batch
    assert len(set(buffers)) == 1


@pytest.mark.parametrize("spinning", [True, False])
def test_the_running_batch_draws_on_one_thread_where_the_workers_spin(tiny_package, spinning):
    """A job's sampler takes the second thread only where onnxruntime's workers sleep after a run (as for Model.batch)."""
    model = load(tiny_package, spinning=spinning)
    entry = scheduler_module.Entry(Job(model.batch(["Hi"], do_sample=True, max_new_tokens=2)), model.engine.vocab_size)
    assert entry.step.sampler.scratch.second_thread is not spinning
