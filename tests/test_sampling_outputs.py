"""The graph's sampling outputs (docs/package-format.md) and the sampler's draws from them (draw.Prepared).

The graph computes softmax(logits / temperature) and its block sums in the step; the chain draws from them
where only the penalties and the temperature write before the pick. These tests check the outputs against NumPy
for every recipe and family, the draws against the exact distribution (the penalties' rejection draw) or draw for
draw against the path that computes from the logits, and that anything the outputs cannot serve falls back.
"""

import re

import numpy as np
import pytest
from edgelm.runtime import sampling
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.model import load
from edgelm.runtime.package.format import sampling_blocks
from edgelm.runtime.sampling import draw
from edgelm.runtime.sampling.draw import BLOCK, Prepared


def prepared_from(logits, temperature=1.0) -> Prepared:
    """What the graph computes, in NumPy: weights softmax(logits / t) padded to whole blocks, their block sums."""
    rows, n_vocab = logits.shape
    weights = np.zeros((rows, sampling_blocks(n_vocab) * BLOCK), dtype=np.float32)
    with np.errstate(invalid="ignore"):
        tempered = logits / np.float32(temperature)
        e = np.exp(tempered - tempered.max(axis=-1, keepdims=True))
        weights[:, :n_vocab] = e / e.sum(axis=-1, keepdims=True)
    sums = weights.reshape(rows, -1, BLOCK).sum(axis=-1, dtype=np.float32)
    return Prepared(weights, sums, (float(np.float32(temperature)),) * rows)


def peaked_rows(rows, n_vocab, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal((rows, n_vocab)) * scale).astype(np.float32)


def chain_picks(options, logits, seen, generated, seeds, prepared=None):
    """One pick per seed, as a decode loop's first step would make it (a fresh chain, one generator per row)."""
    picks = []
    for seed in seeds:
        chain = sampling.SamplerChain(GenerationConfig(**options), logits.shape[-1])
        rngs = [np.random.default_rng([seed, r]) for r in range(len(logits))]
        given = None if prepared is None else prepared(logits)
        picks.append(chain(logits, [list(s) for s in seen], [list(g) for g in generated], rngs, given).tolist())
    return np.array(picks)


# ---- the graph's outputs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "package", ["tiny_package", "tiny_package_int8", "tiny_package_int4", "llama_package", "qwen2_package"]
)
def test_the_graph_computes_the_weights_and_block_sums_the_sampler_would(request, package):
    model = load(request.getfixturevalue(package))
    assert model.engine.io.has_sampling
    decoder = model.engine.decoder(2, 16)
    decoder.set_temperatures([1.0, 0.7])
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    logits = decoder.run(ids, np.ones_like(ids), np.tile(np.arange(3), (2, 1)))[:, -1, :]
    prepared = decoder.prepared()
    expected = prepared_from(logits[:1]), prepared_from(logits[1:], 0.7)
    weights = np.concatenate([e.weights for e in expected])
    np.testing.assert_allclose(prepared.weights, weights, rtol=2e-6, atol=1e-30)
    assert not prepared.weights[:, model.arch.vocab_size :].any()  # the padding weighs nothing
    np.testing.assert_allclose(prepared.block_sums, np.concatenate([e.block_sums for e in expected]), rtol=1e-5)
    assert prepared.temperatures == (1.0, float(np.float32(0.7)))


def test_greedy_passes_make_no_sampling_outputs(tiny_package):
    engine = load(tiny_package).engine
    ids = np.array([[5, 6], [8, 9]])
    greedy, sampled = engine.decoder(2, 16), engine.decoder(2, 16)
    sampled.set_temperatures(1.0)
    run = lambda decoder: decoder.run(ids, np.ones_like(ids), np.tile(np.arange(2), (2, 1))).copy()  # noqa: E731
    np.testing.assert_array_equal(run(greedy), run(sampled))  # the same logits either way
    # greedy's pass made zero rows: its outputs are bound to [0, 1, ...] arrays, which any row would not fit
    assert greedy.prepared() is None and greedy.runs[0][2][0].shape == (0, 1, 512)
    assert sampled.prepared().weights.shape == (2, 512) and sampled.prepared([1]).weights.shape == (1, 512)
    sampled.set_temperatures(0.25)
    assert sampled.prepared() is None  # the last pass's were made at 1: none until a pass makes them at 0.25
    run(sampled)
    assert sampled.prepared().temperatures == (0.25, 0.25)
    sampled.set_temperatures(None)
    run(sampled)
    assert sampled.prepared() is None


def test_a_pass_makes_the_sampling_outputs_of_its_first_rows_only(tiny_package):
    # a running batch puts the rows that sample first: the graph makes their outputs, not the greedy rows' after them
    engine = load(tiny_package).engine
    ids = np.array([[5, 6], [8, 9], [3, 4]])
    every, first = engine.decoder(3, 16), engine.decoder(3, 16)
    every.set_temperatures([0.7, 0.7, 1.0])
    first.set_temperatures([0.7])
    run = lambda decoder: decoder.run(ids, np.ones_like(ids), np.tile(np.arange(2), (3, 1))).copy()  # noqa: E731
    np.testing.assert_array_equal(run(every), run(first))
    made = first.prepared()
    assert made.weights.shape == (1, 512) and made.temperatures == (float(np.float32(0.7)),)
    np.testing.assert_array_equal(made.weights, every.prepared([0]).weights)  # row 0's are the same either way
    assert not first.held[0][1:].any()  # nothing written for the rows after it
    assert first.prepared([0]).block_sums.shape == (1, 2)
    with pytest.raises(ValueError, match="4 temperatures for a decoder of 3 rows"):
        first.set_temperatures([1.0] * 4)
    first.set_temperatures([])
    run(first)
    assert first.prepared() is None


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda g: _dims(g.output, "sampling_weights")[0].__setattr__("dim_value", 1), "has sampling_weights of"),
        (lambda g: _dims(g.input, "sampling_temperature")[0].__setattr__("dim_value", 1), "has sampling_temperature"),
        (
            _required_temperature := lambda g: g.initializer.remove(
                next(t for t in g.initializer if t.name == "sampling_temperature")
            ),
            "takes sampling_temperature as a required input",
        ),
    ],
)
def test_a_graph_whose_sampling_tensors_fix_what_the_runtime_chooses_is_refused(tiny_package, tmp_path, edit, message):
    """Rows are the caller's to choose (a fixed count fails every other pass); the temperature must have a default."""
    import shutil

    import onnx
    from edgelm.runtime.errors import PackageError

    folder = tmp_path / "package"
    shutil.copytree(tiny_package, folder)
    graph = onnx.load(folder / "model.onnx", load_external_data=False)
    edit(graph.graph)
    onnx.save(graph, folder / "model.onnx")
    with pytest.raises(PackageError, match=re.escape(message)):
        load(folder, verify=False)


def _dims(values, name):
    return next(v for v in values if v.name == name).type.tensor_type.shape.dim


def test_a_graph_whose_sampling_outputs_do_not_fit_the_vocabulary_is_refused(tiny_package, tmp_path):
    import shutil

    import onnx
    from edgelm.runtime.errors import PackageError

    folder = tmp_path / "package"
    shutil.copytree(tiny_package, folder)
    graph = onnx.load(folder / "model.onnx", load_external_data=False)
    output = next(o for o in graph.graph.output if o.name == "sampling_weights")
    output.type.tensor_type.shape.dim[-1].dim_value = 320  # the vocabulary, not whole blocks of it
    onnx.save(graph, folder / "model.onnx")
    with pytest.raises(PackageError, match=re.escape("['sampled', 1, 320], not float32 ['rows', 1, 512] for a vocab")):
        load(folder, verify=False)
    output.type.tensor_type.shape.dim[-1].dim_value = 512
    sums = next(o for o in graph.graph.output if o.name == "sampling_block_sums")
    next(n for n in graph.graph.node if n.output[0] == sums.name).output[0] = "float_sums"
    graph.graph.node.append(onnx.helper.make_node("Cast", ["float_sums"], [sums.name], to=onnx.TensorProto.DOUBLE))
    sums.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE  # a graph that runs, with sums of another type
    onnx.save(graph, folder / "model.onnx")
    with pytest.raises(PackageError, match=re.escape("has sampling_block_sums of tensor(double) ['sampled', 1, 2]")):
        load(folder, verify=False)


# ---- the plain draw and top_p's draw, draw for draw ---------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"do_sample": True, "top_k": 0},
        {"do_sample": True, "top_k": 0, "temperature": 0.6},
        {"do_sample": True, "top_k": 0, "top_p": 0.9},
        {"do_sample": True, "top_k": 0, "top_p": 0.7, "temperature": 1.4},
        {"do_sample": True, "top_k": 0, "top_p": 0.9, "repetition_penalty": 1.3, "presence_penalty": 0.4},
        {"do_sample": True, "top_k": 0, "repetition_penalty": 0.8},  # raises logits: reweighed, not rejected
        {"do_sample": True, "top_k": 0, "presence_penalty": -1.0, "frequency_penalty": 0.5},
    ],
)
@pytest.mark.parametrize("n_vocab", [300, 1000, 4096 + 17])
def test_draws_from_prepared_weights_are_the_draws_from_the_logits(options, n_vocab):
    logits = peaked_rows(2, n_vocab, seed=n_vocab)
    seen = [[1, 2, 3, 2, 1, 40], [7, 7, 8]]
    generated = [[2, 1, 40], [8]]
    t = options.get("temperature", 1.0)
    before = logits.copy()
    ours = chain_picks(options, logits, seen, generated, range(300), lambda x: prepared_from(x, t))
    plain = chain_picks(options, logits, seen, generated, range(300))
    np.testing.assert_array_equal(logits, before)  # the caller's logits are as they were
    # the same uniforms over weights that differ only in rounding (and the float32 block sums): the same tokens,
    # but for a draw that lands within rounding of a boundary
    assert (ours == plain).mean() >= 0.99


@pytest.mark.parametrize("force", ["keeps", "the cut"])
def test_top_p_at_a_temperature_decides_the_cut_on_the_tempered_row(monkeypatch, force):
    # the verdict reads the weights only; a token at the cut (keeps) and a row out of tries (the cut found and drawn
    # from) need the tempered logits, which the chain makes for that row alone
    from edgelm.runtime.sampling import nucleus

    if force == "keeps":
        monkeypatch.setattr(nucleus, "verdict", lambda *args: None)
    else:
        monkeypatch.setattr(nucleus.draw, "REJECTION_TRIES", 0)
    options = {"do_sample": True, "top_k": 0, "top_p": 0.8, "temperature": 1.5}
    logits = peaked_rows(2, 1000, seed=5)
    before = logits.copy()
    ours = chain_picks(options, logits, [[1], [2]], [[], []], range(300), lambda x: prepared_from(x, 1.5))
    plain = chain_picks(options, logits, [[1], [2]], [[], []], range(300))
    np.testing.assert_array_equal(logits, before)
    assert (ours == plain).mean() >= 0.99


def test_top_p_with_penalties_at_a_temperature_near_a_tie_at_the_cut():
    # The graph's weight of a penalized token comes from float32(logit / t) plus the penalty's change in float64;
    # the cut orders it by float32(penalized / t). Around |logit / t| = 128 the two differ by up to 1.5e-5, more
    # than the verdict's own slack: here token 1 (penalized) and token 0 tie by the cut's order, their weights
    # differ by 1.3e-5, and top_p is set so that token 1 is just kept. The draws must be the plain path's.
    t, factor, rng = np.float32(0.7), 1.1, np.random.default_rng(0)
    for _ in range(100_000):
        original = np.float32(rng.uniform(-110, -80))
        penalized = np.float32(np.float64(original) * np.float64(np.float32(factor)))
        as_drawn = float(original / t) + (float(penalized) - float(original)) / float(t)
        if float(penalized / t) - as_drawn < 1.25e-5:
            continue
        start = np.float32((penalized / t) * t)
        tied = [np.float32(start + k * np.spacing(start)) for k in range(-3, 4)]
        tied = [x for x in tied if x / t == penalized / t]
        if tied:
            break
    else:
        pytest.fail("no near-tie found")
    top = float(penalized / t)
    tempered = np.full(64, top - 60.0)
    tempered[[0, 1]] = top
    tempered[2:22] = top + np.log(0.048 / 20 / 0.05)
    tempered[22:32] = top + np.log(0.852 / 10 / 0.05)
    logits = (tempered * float(t)).astype(np.float32)
    logits[0], logits[1] = tied[0], original
    row = logits.copy()
    row[1] = penalized
    probs = np.exp(row / t - (row / t).max())
    probs /= probs.sum()
    top_p = float(1 - (probs[2:22].sum() + probs[1] + 0.0013))
    options = dict(do_sample=True, top_k=0, top_p=top_p, temperature=float(t), repetition_penalty=factor)
    plain = chain_picks(options, logits[None], [[1]], [[1]], range(1500))
    ours = chain_picks(options, logits[None], [[1]], [[1]], range(1500), lambda x: prepared_from(x, float(t)))
    assert (plain == 1).sum() > 20  # token 1 is kept by the exact cut...
    np.testing.assert_array_equal(ours, plain)  # ...and drawn as often from the graph's weights


def test_the_chain_uses_prepared_weights_only_where_they_serve():
    logits = peaked_rows(1, 600, seed=1)
    poisoned = prepared_from(logits)
    poisoned.weights[:] = 0
    poisoned.weights[0, 599] = 1  # a chain that read these would always pick 599
    poisoned.block_sums[:] = poisoned.weights.reshape(1, -1, BLOCK).sum(axis=-1)
    serves = [
        {"do_sample": True, "top_k": 0},
        {"do_sample": True, "top_k": 0, "repetition_penalty": 1.2},
        {"do_sample": True, "top_k": 0, "temperature": 0.5},
        {"do_sample": True, "top_k": 0, "top_p": 0.9},
        {"do_sample": True, "top_k": 0, "top_p": 0.8, "temperature": 1.5, "frequency_penalty": 0.5},
    ]
    ignores = [
        {"do_sample": True, "top_k": 50},  # top_k draws from its kept tokens
        {"do_sample": True, "top_k": 0, "min_p": 0.1},
        {"do_sample": True, "top_k": 0, "top_p": 0.3},  # under nucleus.REJECT_FROM: the cut is found
        {"do_sample": True, "top_k": 0, "logit_bias": {3: 2.0}},
        {"do_sample": True, "top_k": 0, "repetition_penalty": 0.9},  # raises logits: a weight of 0 would not rise
        {"do_sample": True, "top_k": 0, "presence_penalty": -0.5},
        {"do_sample": False},
    ]

    def made_at(options):  # the poisoned outputs, as made at the temperature the request asks for
        t = float(np.float32(options.get("temperature", 1.0)))
        return lambda x: Prepared(poisoned.weights.copy(), poisoned.block_sums.copy(), (t,))

    for options in serves:
        assert set(chain_picks(options, logits, [[1]], [[]], range(20), made_at(options)).ravel()) == {599}, options
        made_elsewhere = {**options, "temperature": options.get("temperature", 1.0) * 2}  # made at t, asked at 2t
        plain = chain_picks(made_elsewhere, logits, [[1]], [[]], range(20))
        np.testing.assert_array_equal(
            chain_picks(made_elsewhere, logits, [[1]], [[]], range(20), made_at(options)), plain
        )
    for options in ignores:
        plain = chain_picks(options, logits, [[1]], [[]], range(20))
        np.testing.assert_array_equal(chain_picks(options, logits, [[1]], [[]], range(20), made_at(options)), plain)


def test_weights_that_disagree_with_their_sums_are_a_damaged_package():
    from edgelm.runtime.errors import PackageError

    logits = peaked_rows(1, 600, seed=1)
    damaged = prepared_from(logits)
    damaged.weights[:] = -1.0  # every block sum still positive
    with pytest.raises(PackageError, match="sampling_weights do not add up to its sampling_block_sums"):
        chain_picks({"do_sample": True, "top_k": 0}, logits, [[1]], [[]], [0], lambda x: damaged)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rows_whose_prepared_total_is_not_finite_and_positive_are_computed_from_the_logits(bad):
    logits = peaked_rows(2, 700, seed=2)
    if bad == -np.inf:
        logits[1, :] = -np.inf
        logits[1, 5] = 0.0  # one token left
    else:
        logits[1, 10] = bad  # NaN counts as banned; a row with +inf picks among its +inf tokens
    options = {"do_sample": True, "top_k": 0, "repetition_penalty": 1.1}
    given = lambda x: prepared_from(x)  # noqa: E731
    np.testing.assert_array_equal(
        chain_picks(options, logits, [[1], [2]], [[], []], range(50), given),
        chain_picks(options, logits, [[1], [2]], [[], []], range(50)),
    )


# ---- the penalties' rejection draw: the exact distribution -------------------------------------------------------


def exact_probabilities(options, logits, seen, generated):
    processed = sampling.process_logits(logits, GenerationConfig(**options), seen, generated)
    return np.exp(sampling.log_softmax(processed)[0].astype(np.float64))


@pytest.mark.parametrize("tries", [draw.REJECTION_TRIES, 0])  # 0: every row is reweighed at once
@pytest.mark.parametrize(
    "options",
    [
        {"do_sample": True, "top_k": 0, "repetition_penalty": 1.5},
        {"do_sample": True, "top_k": 0, "frequency_penalty": 1.0, "presence_penalty": 0.5},
        {"do_sample": True, "top_k": 0, "repetition_penalty": 2.0, "frequency_penalty": 0.5, "temperature": 0.8},
    ],
)
def test_the_penalties_rejection_draw_has_the_penalized_distribution(options, tries, monkeypatch):
    monkeypatch.setattr(draw, "REJECTION_TRIES", tries)
    n_vocab = 40
    logits = np.linspace(4, -4, n_vocab, dtype=np.float32)[None]  # the most likely tokens are the penalized ones
    seen, generated = [[0, 1, 2, 1, 0, 3, 0]], [[0, 1, 0, 3, 0]]
    t = options.get("temperature", 1.0)
    chain = sampling.SamplerChain(GenerationConfig(**options), n_vocab)
    rng, n = np.random.default_rng(0), 16_000
    picks = [int(chain(logits, seen, generated, [rng], prepared_from(logits, t))[0]) for _ in range(n)]
    frequency = np.bincount(picks, minlength=n_vocab) / n
    expected = exact_probabilities(options, logits, seen, generated)
    assert np.abs(frequency - expected).max() < 0.015  # 4 standard deviations of the largest cell's frequency
    unpenalized = exact_probabilities({"do_sample": True, "top_k": 0, "temperature": t}, logits, seen, generated)
    assert np.abs(frequency - unpenalized).max() > 0.05  # what a draw that ignored the penalties would miss by


@pytest.mark.parametrize(
    "logits, options, seen",
    [
        # the largest logit penalized far down at a low temperature: the rest of the row is under float32's range
        # relative to it, so the graph's weights cannot say how the rest divides (from the logits instead)
        # (weights e**-102.5, e**-103.2, e**-103.9 of the largest: 2, 1 and 1 float32 steps above 0)
        ([20.0, 9.75, 9.68, 9.61], {"repetition_penalty": 3.0, "temperature": 0.1}, [0]),
        # a token raised to the largest logit from a weight the graph made 0 (e**-110): not served
        ([10.0, 8.9], {"repetition_penalty": 0.89, "temperature": 0.01}, [1]),
        ([10.0, 8.9], {"presence_penalty": -1.1, "temperature": 0.01}, [1]),
    ],
)
def test_penalties_at_the_edge_of_float32_draw_from_the_penalized_distribution(logits, options, seen):
    options = {"do_sample": True, "top_k": 0, **options}
    row = np.zeros((1, 300), dtype=np.float32)
    row[0, :] = -30.0
    row[0, : len(logits)] = logits
    chain = sampling.SamplerChain(GenerationConfig(**options), 300)
    rng, n, t = np.random.default_rng(5), 8_000, options["temperature"]
    picks = [int(chain(row, [list(seen)], [list(seen)], [rng], prepared_from(row, t))[0]) for _ in range(n)]
    expected = exact_probabilities(options, row, [seen], [seen])
    assert np.abs(np.bincount(picks, minlength=300) / n - expected).max() < 0.02  # 4 standard deviations


def test_the_rejection_draw_keeps_an_unchanged_token_with_one_uniform():
    """A drawn token the penalties left alone (seen, but with no offset) costs no second uniform."""
    logits = np.zeros((1, 512), dtype=np.float32)
    options = {"do_sample": True, "top_k": 0, "presence_penalty": 1.0}
    chain = sampling.SamplerChain(GenerationConfig(**options), 512)
    rng = np.random.default_rng(3)
    expected = np.random.default_rng(3)
    seen = [list(range(512))]  # every token seen (in the prompt), none generated: nothing changes
    for _ in range(20):
        chain(logits, seen, [[]], [rng], prepared_from(logits))
        expected.random()
    assert rng.random() == expected.random()


# ---- through the engine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"do_sample": True, "top_k": 0},
        {"do_sample": True, "top_k": 0, "temperature": 0.7, "top_p": 0.9},
    ],
)
def test_generation_with_the_graphs_outputs_matches_generation_without_them(gpt2_vocab_package, options, monkeypatch):
    from edgelm.runtime.engine import decode as engine

    model = load(gpt2_vocab_package)
    assert model.engine.io.has_sampling
    served = count_served(monkeypatch)
    texts = [model.generate("Hello there", max_new_tokens=12, seed=s, **options).text for s in range(4)]
    assert len(served) == 4 * 11  # every pick after the first (from the prompt's logits) drew from the outputs
    monkeypatch.setattr(engine.InPlaceDecoder, "prepared", lambda self, rows=None: None)
    assert [model.generate("Hello there", max_new_tokens=12, seed=s, **options).text for s in range(4)] == texts
    assert len(served) == 4 * 11


def count_served(monkeypatch) -> list:
    """Each pick the graph's sampling outputs served appends to the list."""
    served, serve = [], sampling.SamplerChain._pick_prepared

    def counted(self, *args):
        picks = serve(self, *args)
        served.extend([] if picks is None else [1])
        return picks

    monkeypatch.setattr(sampling.SamplerChain, "_pick_prepared", counted)
    return served


def test_the_scheduler_serves_its_rows_from_the_graphs_outputs_at_each_rows_temperature(tiny_package, monkeypatch):
    from edgelm.runtime.batching.scheduler import Scheduler
    from test_scheduler import Job, each_gets_what_it_gets_alone

    model = load(tiny_package)
    common = dict(do_sample=True, top_k=0, ignore_eos=True, max_new_tokens=6)
    requests = [
        ("Hi", dict(seed=1, temperature=0.5, **common)),
        ("Hello", dict(seed=2, repetition_penalty=1.3, **common)),
        ("Once", dict(seed=3, temperature=1.5, top_p=0.9, **common)),
    ]
    jobs = [Job(model.batch([prompt], **options)) for prompt, options in requests]
    served = count_served(monkeypatch)
    scheduler = Scheduler(model, max_rows=4)
    try:
        for job in jobs:
            scheduler.submit(job)
        for job in jobs:
            assert job.wait().error is None
    finally:
        scheduler.close()
    assert len(served) >= 3 * 4  # the steps after each row's first token (which its prefill's logits give)
    for job, (_, options) in zip(jobs, requests):
        each_gets_what_it_gets_alone(model, [job], options)


def test_a_running_batchs_decoders_share_one_set_of_sampling_arrays(tiny_package):
    """Each row count gets its own decoder; their sampling outputs are the first rows of the cache's arrays (as
    their key/value buffers are), not arrays of their own: a batch of 16 would otherwise hold 16 sets."""
    from edgelm.runtime.batching.scheduler import Scheduler

    model = load(tiny_package)
    cache = Scheduler(model, max_rows=4).cache
    for ids in ([5, 6, 7], [8], [9, 10]):
        decoder = model.engine.decoder(1, len(ids))
        prompt = np.asarray([ids])
        decoder.run(prompt, np.ones_like(prompt), np.arange(len(ids))[None])
        cache.join(ids, decoder.buffers, len(ids))
    for n in (3, 2, 1):  # rows leave between steps: a decoder for each row count, over the same buffers
        cache.step(np.full(n, 1), [0.5] * n)
        assert cache.prepared.temperatures == (0.5,) * n and cache.prepared.weights.shape[0] == n
        if n > 1:
            cache.leave(0)
    decoders = list(cache._decoders.values())
    assert len(decoders) == 3
    for decoder in decoders[1:]:
        for shared, own in zip(decoders[0].held, decoder.held):  # weights, block sums, temperatures
            assert np.shares_memory(shared, own)
    cache.step(np.full(1, 1))  # no row samples: none made
    assert cache.prepared is None
