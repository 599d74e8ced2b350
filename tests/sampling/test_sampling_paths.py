"""The sampler chain's shortcuts against the plain algorithms they stand for.

top_k's block-maximum threshold against a partition of the whole row; the chain's draw among top_k's tokens, and
its draw when no filter bans a token, against filtering then picking; the chain's per-row tallies against
counting each step's whole history. Each on the rows where a shortcut could go wrong: ties at the k-th value,
-inf and NaN, all-equal rows, k at or past the number of blocks or the vocabulary.
"""

import functools
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from edgelm.runtime import sampling
from edgelm.runtime.errors import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.sampling import chain as chain_module
from edgelm.runtime.sampling import draw, topk
from edgelm.runtime.sampling.tally import SeenTally, Tallies, Tally

V = 50_257


def partitioned_top_k(logits, k):
    """top_k as one partition of each whole row finds it: every logit below the k-th largest becomes -inf."""
    out = logits.copy()
    if k >= out.shape[-1]:
        return out
    kth = np.partition(out, out.shape[-1] - k, axis=-1)[:, out.shape[-1] - k, None]
    out[out < kth] = -np.inf
    return out


def hard_rows(n_vocab, seed=0):
    # [8, n_vocab]: flat, peaked, ties everywhere, mostly -inf, all equal, all -inf but a few, NaN, +inf
    rng = np.random.default_rng(seed)
    rows = (rng.standard_normal((8, n_vocab)) * [[0.02], [5.0], [1.0], [1.0], [0], [1.0], [1.0], [1.0]]).astype(
        np.float32
    )
    rows[2] = np.round(rows[2] * 2)  # a handful of distinct values: ties at the k-th largest
    rows[3, rng.random(n_vocab) < 0.9] = -np.inf
    rows[5, 30:] = -np.inf
    rows[6, rng.integers(0, n_vocab, 3)] = np.nan
    rows[7, n_vocab - 1] = np.inf  # in the tail past the last whole block
    return rows


@pytest.mark.parametrize("k", [1, 2, 50, 196, 197, 500, 3000, 4000, V - 1, V, V + 5])
def test_top_k_equals_a_partition_of_the_whole_row(k):
    logits = hard_rows(V)
    np.testing.assert_array_equal(sampling.top_k(logits, k), partitioned_top_k(logits, k))


@pytest.mark.parametrize("n_vocab", [10, 300, 4099])
def test_top_k_on_small_vocabularies_and_a_nan_in_the_tail(n_vocab):
    logits = hard_rows(n_vocab, seed=1)
    logits[0, -1] = np.nan  # past the last whole block: must still send the row to the partition
    for k in (1, 3, 17, n_vocab - 1):
        np.testing.assert_array_equal(sampling.top_k(logits, k), partitioned_top_k(logits, k))


def test_candidates_hold_every_kept_token_and_few_others():
    row = (np.random.default_rng(2).standard_normal(V) * 0.02).astype(np.float32)
    ids = topk.candidates(row, 50)
    assert np.isin(np.flatnonzero(np.isfinite(partitioned_top_k(row[None], 50)[0])), ids).all()
    assert 50 <= ids.size < 200  # a little over k: the partition runs over these only
    assert topk.candidates(row, V // topk.MIN_BLOCK + 1) is None  # more than the blocks: the whole row is partitioned


@pytest.mark.parametrize("k", [1, 50, 300, 5000, V + 1])
def test_chain_with_top_k_last_picks_what_filtering_then_picking_picks(k):
    logits = hard_rows(V, seed=3)[[0, 1, 2, 3, 5, 7]]  # every row but the all-equal and NaN ones (below)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=k, temperature=0.7), V)
    assert chain.filters[-1][0] is sampling.top_k
    filtered = chain.process(logits, [[]] * 6, [[]] * 6)
    for draw_index in range(5):
        rngs = lambda: [np.random.default_rng([draw_index, r]) for r in range(6)]  # noqa: E731
        np.testing.assert_array_equal(chain(logits, [[]] * 6, [[]] * 6, rngs()), draw.pick(filtered, True, rngs()))


def test_top_k_draw_on_equal_and_nan_rows_matches_the_pick():
    logits = hard_rows(V, seed=4)[[4, 6]]
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=50), V)
    filtered = sampling.top_k(logits, 50)
    assert np.isfinite(filtered[0]).sum() == V  # all equal: every token ties with the 50th
    for seed in range(3):
        rngs = lambda: [np.random.default_rng([seed, r]) for r in range(2)]  # noqa: E731
        np.testing.assert_array_equal(chain(logits, [[]] * 2, [[]] * 2, rngs()), draw.pick(filtered, True, rngs()))


def test_top_k_draw_of_a_row_with_nothing_left_raises():
    logits = np.full((1, V), -np.inf, dtype=np.float32)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=50), V)
    with pytest.raises(GenerationOptionError, match="every token was banned"):
        chain(logits, [[]], [[]], [np.random.default_rng(0)])


def test_dense_draw_picks_what_the_plain_pick_picks():
    # no filter bans a token: the chain skips looking for rows with few tokens left; the token must not change
    logits = hard_rows(V, seed=5)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, temperature=1.3), V)
    assert chain.dense
    filtered = chain.process(logits, [[]] * 8, [[]] * 8)
    for seed in range(4):
        rngs = lambda: [np.random.default_rng([seed, r]) for r in range(8)]  # noqa: E731
        np.testing.assert_array_equal(chain(logits, [[]] * 8, [[]] * 8, rngs()), draw.pick(filtered, True, rngs()))


@pytest.mark.parametrize("n_vocab", [V, 4096, 300])
def test_the_batch_draw_finds_the_token_the_row_search_finds_at_every_block_boundary(n_vocab):
    # the whole-batch draw (many rows) against search() row by row, at the uniforms that put the target exactly on,
    # just below and just above each block's end: where a block's own sum and the running sum round differently
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal((6, n_vocab)) * [[0.02], [4.0], [1.0], [1.0], [30.0], [1.0]]).astype(np.float32)
    logits[2, : n_vocab // 2] = -np.inf  # zero weight in the first blocks
    logits[3, draw.BLOCK :] = -np.inf  # all the weight in the first block
    logits[5, : n_vocab - 3] = -np.inf  # all of it in the padded last block
    padded = draw.weights(logits)
    ends = draw.block_ends(padded)
    sums = draw.block_sums(padded)
    for b in range(len(ends[0])):
        for nudge in (-1, 0, 1):
            u = np.array([min(np.nextafter(row[b] / row[-1], 2.0 * nudge), 1 - 2**-53) for row in ends])
            u = np.maximum(u, 0.0)
            expected = [draw.search(padded[r], ends[r], u[r], n_vocab) for r in range(len(u))]
            assert draw.draw_many(padded, sums, u, n_vocab).tolist() == expected, (b, nudge)


def test_many_rows_draw_what_one_float64_cumulative_sum_draws():
    # the chain's dense draw of a batch (two threads, whole-batch search) against one float64 cumsum per row
    logits = (np.random.default_rng(9).standard_normal((draw.MANY_ROWS * 3, V)) * 2.0).astype(np.float32)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0), V)
    rows = len(logits)
    for seed in range(6):
        picks = chain(logits, [[]] * rows, [[]] * rows, [np.random.default_rng([seed, r]) for r in range(rows)])
        for r, (row, token) in enumerate(zip(logits, picks.tolist())):
            weights = np.exp(row - row.max())
            cdf = np.cumsum(weights, dtype=np.float64)
            u = np.random.default_rng([seed, r]).random()
            assert token == int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def _draw_in_child(queue):
    logits = np.zeros((draw.MANY_ROWS, 1000), dtype=np.float32)
    queue.put(draw.pick(logits, True, [np.random.default_rng(r) for r in range(len(logits))], dense=True).tolist())


def test_a_forked_process_draws_many_rows_too():
    # the second thread does not survive a fork: the child must make its own, not wait on the parent's forever
    import multiprocessing

    logits = np.zeros((draw.MANY_ROWS, 1000), dtype=np.float32)
    draw.pick(logits, True, [np.random.default_rng(r) for r in range(len(logits))], dense=True)  # the thread exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_draw_in_child, args=(queue,))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    assert len(queue.get(timeout=5)) == draw.MANY_ROWS


@pytest.mark.parametrize("options", [{"top_k": 50}, {"top_k": 0, "top_p": 0.9}, {"top_k": 0, "top_p": 0.3}])
def test_a_chain_that_draws_from_the_kept_tokens_leaves_the_logits_alone(options):
    logits = hard_rows(V, seed=7)[[0, 1, 2]]
    before = logits.copy()
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, **options), V)
    chain(logits, [[]] * 3, [[]] * 3, [np.random.default_rng(r) for r in range(3)])
    np.testing.assert_array_equal(logits, before)  # the caller's logits: the model's raw scores, yielded after


def test_a_banning_filter_keeps_the_few_token_check():
    config = GenerationConfig(do_sample=True, top_k=0, min_p=0.1)
    assert not sampling.SamplerChain(config, V).dense
    assert sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, repetition_penalty=1.2), V).dense


def test_the_chain_follows_growing_rows_as_a_fresh_count_would():
    n_vocab = 300
    rng = np.random.default_rng(6)
    config = GenerationConfig(
        do_sample=True, top_k=0, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6
    )
    chain = sampling.SamplerChain(config, n_vocab)
    seen = [list(rng.integers(0, 20, 12)), list(rng.integers(0, 20, 3))]
    generated = [[], []]
    for step in range(30):
        logits = (rng.standard_normal((2, n_vocab)) * 3).astype(np.float32)
        fresh = sampling.SamplerChain(config, n_vocab).process(
            logits, [list(s) for s in seen], [list(g) for g in generated]
        )
        np.testing.assert_array_equal(chain.process(logits, seen, generated), fresh)
        for s, g in zip(seen, generated):
            token = int(rng.integers(0, 20))
            s.append(token)
            g.append(token)
        if step == 10:
            seen[0][-2] = (seen[0][-2] + 1) % 20  # its last counted id rewritten in place: counted again
        if step == 20:
            del generated[1][-3:]  # shrunk: counted again
            del seen[1][-3:]


def test_tallies_count_every_id_and_drop_rows_no_longer_passed():
    tallies = Tallies()
    a, b = [5, 3, 5], [7]
    (ids_a, counts_a), (ids_b, counts_b), _ = tallies.update([a, b, a])
    assert dict(zip(ids_a.tolist(), counts_a.tolist())) == {5: 2, 3: 1}
    a += [3] * 100  # past the first capacity of the tally's arrays
    ((ids, counts),) = tallies.update([a])
    assert dict(zip(ids.tolist(), counts.tolist())) == {5: 2, 3: 101}
    assert list(tallies.by_list) == [(id(a),)]


def penalty_rows(n_vocab, seed):
    # [4, n_vocab] with what the penalties must carry through: huge logits, -0, -inf, +inf and NaN among seen ids
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((4, n_vocab)) * 3).astype(np.float32)
    logits[1, :7] = [3e38, -3e38, -0.0, 0.0, -np.inf, np.inf, -3.3e38]
    logits[2, :3] = [np.nan, 1e-45, -1e-45]
    seen = [list(rng.integers(0, 40, n)) for n in (12, 30, 5, 0)]
    seen[1] += list(range(7))
    seen[2] += [0, 1, 2]
    generated = [s[len(s) // 2 :] for s in seen]  # the first half of each row is its prompt: seen, not generated
    return logits, seen, generated


PENALTY_SETTINGS = [
    {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5},
    {"repetition_penalty": 0.7, "frequency_penalty": -2.0, "presence_penalty": 2.0},
    {"repetition_penalty": 1e-42, "frequency_penalty": 0.3},  # below float32's range: stays float64
    {"repetition_penalty": 1e300, "presence_penalty": -1.5},  # past float32's range
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 1.25, "presence_penalty": -0.5},
    {"presence_penalty": 0.5},
]


def sequential_penalties(logits, seen, generated, options):
    out = sampling.repetition_penalty(logits, seen, options.get("repetition_penalty", 1.0))
    return sampling.frequency_presence_penalty(
        out, generated, options.get("frequency_penalty", 0.0), options.get("presence_penalty", 0.0)
    )


@pytest.mark.parametrize("few_ids", [draw.FEW_ALIVE, -1])  # on Python floats, or on NumPy arrays
@pytest.mark.parametrize("options", PENALTY_SETTINGS)
def test_the_chain_applies_both_penalties_at_once_bit_for_bit_as_one_after_the_other(monkeypatch, few_ids, options):
    monkeypatch.setattr(chain_module, "FEW_IDS", few_ids)
    n_vocab = 64
    logits, seen, generated = penalty_rows(n_vocab, seed=8)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, **options), n_vocab)
    for step in range(6):  # the chain's tallies follow the rows as they grow
        with np.errstate(over="ignore", invalid="ignore"):
            expected = sequential_penalties(logits, seen, generated, options)
        np.testing.assert_array_equal(chain.process(logits, seen, generated).view(np.uint32), expected.view(np.uint32))
        for r, (s, g) in enumerate(zip(seen, generated)):
            s.append(step * 7 % 50 + r)
            g.append(s[-1])


@pytest.mark.parametrize("options", PENALTY_SETTINGS[:2] + PENALTY_SETTINGS[-2:])
@pytest.mark.parametrize("last", [{"top_k": 0}, {"top_k": 5}, {"top_k": 0, "top_p": 0.8}, {"top_k": 0, "top_p": 0.99}])
def test_penalties_written_into_the_logits_draw_the_same_token_and_are_taken_back(options, last):
    logits, seen, generated = penalty_rows(V, seed=9)
    logits = logits[[0, 3]]  # finite rows: the pick handles the others by their own paths
    seen, generated = [seen[0], seen[3]], [generated[0], generated[3]]
    before = logits.copy()
    config = GenerationConfig(do_sample=True, **options, **last)
    chain = sampling.SamplerChain(config, V)
    assert chain.restores
    plain = sampling.SamplerChain(
        replace(config, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0), V
    )
    for step in range(4):
        penalized = sequential_penalties(logits, seen, generated, options)  # a copy
        rngs = lambda: [np.random.default_rng([step, r]) for r in range(2)]  # noqa: E731
        expected = plain(penalized, [[]] * 2, [[]] * 2, rngs())  # the same chain, penalties left out
        tokens = chain(logits, seen, generated, rngs())
        np.testing.assert_array_equal(tokens, expected)
        np.testing.assert_array_equal(logits.view(np.uint32), before.view(np.uint32))  # the caller's raw logits
        for s, g, token in zip(seen, generated, tokens.tolist()):
            s.append(token)
            g.append(token)


def test_a_penalty_that_fails_on_a_later_row_gives_the_earlier_rows_their_logits_back():
    logits = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    before = logits.copy()
    config = GenerationConfig(do_sample=True, top_k=0, repetition_penalty=1.3, frequency_penalty=0.5)
    chain = sampling.SamplerChain(config, 64)
    with pytest.raises(IndexError):  # row 1 holds an id past the vocabulary
        chain(logits, [[1, 2], [3, 69]], [[2], [69]], [np.random.default_rng(r) for r in range(2)])
    np.testing.assert_array_equal(logits.view(np.uint32), before.view(np.uint32))


def test_generated_ids_missing_from_the_seen_ones_get_the_filters_one_after_the_other():
    logits = np.arange(8, dtype=np.float32)[None] - 3
    options = {"repetition_penalty": 1.5, "frequency_penalty": 0.5, "presence_penalty": 0.25}
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, **options), 8)
    seen, generated = [[1, 2, 1]], [[2, 5, 5]]  # 5 generated but never seen: the two filters differ in what they touch
    expected = sequential_penalties(logits, seen, generated, options)
    np.testing.assert_array_equal(chain.process(logits, seen, generated), expected)
    rngs = lambda: [np.random.default_rng(3)]  # noqa: E731
    np.testing.assert_array_equal(chain(logits, seen, generated, rngs()), draw.pick(expected, True, rngs()))
    np.testing.assert_array_equal(logits, np.arange(8, dtype=np.float32)[None] - 3)


def test_top_k_draw_with_nan_or_infinity_in_the_tail_matches_the_pick():
    logits = hard_rows(V, seed=10)[[0, 1]]
    logits[0, -1], logits[1, -2] = np.nan, -np.inf  # past the last whole block of the block maxima
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=50), V)
    filtered = sampling.top_k(logits, 50)
    for seed in range(3):
        rngs = lambda: [np.random.default_rng([seed, r]) for r in range(2)]  # noqa: E731
        np.testing.assert_array_equal(chain(logits, [[]] * 2, [[]] * 2, rngs()), draw.pick(filtered, True, rngs()))


def test_a_seen_tally_keeps_each_generated_ids_value_beside_its_seen_id():
    weigh = lambda count: 0.1 * count + 1  # noqa: E731
    tallies = Tallies(functools.partial(SeenTally, weigh=weigh))
    seen, generated = [9, 8], []

    def check():
        ((ids, values),) = tallies.update([seen], [generated])
        counted = {i: float(np.float32(weigh(generated.count(i)))) if i in generated else 0.0 for i in seen}
        assert dict(zip(ids.tolist(), values.tolist())) == counted and len(ids) == len(counted)

    for token in [*range(100), 8, 8, 5]:  # past the first capacity of the tally's arrays
        seen.append(token)
        generated.append(token)
        check()
    del seen[-2:], generated[-2:]  # shrunk: counted again
    check()
    generated.append(1000)  # generated, never seen: nothing to align its value with
    assert tallies.update([seen], [generated]) == [None]


def test_the_second_thread_has_written_its_rows_before_an_error_in_the_first_half_leaves(monkeypatch):
    # an interrupt in the calling thread's half must not leave the second thread writing into the arrays after
    finished = []
    real_exp = np.exp

    def exp(x, out=None):
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt
        time.sleep(0.2)  # the second thread is slower than the interrupt
        finished.append(True)
        return real_exp(x, out=out)

    monkeypatch.setattr(draw.np, "exp", exp)
    logits = np.zeros((draw.MANY_ROWS, 1000), dtype=np.float32)
    with pytest.raises(KeyboardInterrupt):
        draw.weights_and_sums(logits, draw.Scratch(), logits.max(axis=-1))
    assert finished == [True]


def block_search(padded_row, ends, u, n_vocab):
    """draw.search as whole-array arithmetic: the block's float64 running sums by np.cumsum, the offset added to
    each, the first one above the target."""
    target = u * ends[-1]
    block = min(int(np.searchsorted(ends, target, side="right")), len(ends) - 1)
    inner = np.cumsum(padded_row[block * draw.BLOCK : (block + 1) * draw.BLOCK], dtype=np.float64)
    inner += ends[block - 1] if block else 0.0
    above = inner > target
    token = block * draw.BLOCK + (int(above.argmax()) if above.any() else draw.BLOCK)
    if token >= min((block + 1) * draw.BLOCK, n_vocab):
        token = draw.last_weighted(padded_row, block, n_vocab)
    return token


@pytest.mark.parametrize("n_vocab", [V, 300])
def test_the_search_on_python_floats_finds_what_whole_array_sums_find_at_every_block_boundary(n_vocab):
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal((4, n_vocab)) * [[0.02], [4.0], [30.0], [1.0]]).astype(np.float32)
    logits[3, : n_vocab - 3] = -np.inf  # all the weight in the padded last block
    padded = draw.weights(logits)
    for row, ends in zip(padded, draw.block_ends(padded)):
        for b in range(len(ends)):
            for nudge in (-1, 0, 1):
                u = max(min(np.nextafter(ends[b] / ends[-1], 2.0 * nudge), 1 - 2**-53), 0.0)
                assert draw.search(row, ends, u, n_vocab) == block_search(row, ends, u, n_vocab), (b, nudge)
        for u in rng.random(50):
            assert draw.search(row, ends, u, n_vocab) == block_search(row, ends, u, n_vocab)


@pytest.mark.parametrize("options", [{"top_k": 0}, {"top_k": 0, "temperature": 1.3}, {"top_k": 50}, {"top_k": 3000}])
def test_one_row_at_a_time_draws_what_filtering_then_picking_picks(options):
    # a batch of one row takes the sampler's one-row paths (fewer NumPy calls): each of the hard rows alone
    logits = hard_rows(V, seed=13)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, **options), V)
    for r in range(len(logits)):
        row = logits[r : r + 1]
        filtered = chain.process(row, [[]], [[]])
        for seed in range(4):
            expected = draw.pick(filtered, True, [np.random.default_rng([seed, r])])
            np.testing.assert_array_equal(chain(row, [[]], [[]], [np.random.default_rng([seed, r])]), expected)


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_one_row_draws_from_the_nucleus_what_a_batch_draws_for_it(p):
    # top_p's rejection draw of one row (its one-row path) against the same row in a batch of two (the batch's path)
    logits = hard_rows(V, seed=15)
    chain = sampling.SamplerChain(GenerationConfig(do_sample=True, top_k=0, top_p=p), V)
    for r in range(len(logits)):
        pair = logits[[r, r]]
        for seed in range(4):
            expected = chain(pair, [[]] * 2, [[]] * 2, [np.random.default_rng([seed, r])] * 2)[0]
            assert chain(pair[:1], [[]], [[]], [np.random.default_rng([seed, r])])[0] == expected


def test_a_tally_that_does_not_count_keeps_the_same_ids():
    ids = [5, 3, 5, 9, 3, 3, 7]
    counting, not_counting = Tally(ids), Tally(ids, counting=False)
    for token in [1, 5, 1, *range(100)]:  # past the first capacity of the tally's arrays
        ids.append(token)
        (a, counts), (b, none) = counting.update(), not_counting.update()
        assert a.tolist() == b.tolist() == list(dict.fromkeys(ids)) and none is None
        assert counts.tolist() == [ids.count(i) for i in a.tolist()]
