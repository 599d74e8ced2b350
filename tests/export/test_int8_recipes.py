"""The three int8 recipes: int8 (MatMulNBits in 8-bit blocks, activations quantized per row and block; the LM head
scales each row by its own largest value), int8-rows (7-bit weights per output, each row of activations
quantized by its own largest value, MatMulIntegerToFloat) and int8-dynamic (DynamicQuantizeMatMul, one
activation scale per tensor). Each exports a package that loads, generates and scores, and follows the float32
package's greedy tokens; int8's and int8-rows' rows do not depend on each other, so a greedy request gets the
same tokens alone, in one Model.batch with prompts of other lengths, and in the continuous-batching scheduler
beside other jobs."""

import json
import math

import numpy as np
import pytest
from edgelm.export.quantize import int8_block, quantize_int8_blocks
from edgelm.runtime import load
from edgelm.runtime.batching.scheduler import Scheduler
from scheduler_job import Job

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog, and then",
    "Once upon a time",
    "import numpy as np\n",
    "A",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11",
    "É",
    "The capital of France is",
    "def f(x):\n    return",
]
GREEDY = dict(do_sample=False, ignore_eos=True, max_new_tokens=16)


def test_blocks_round_trip_within_half_a_step():
    """[N, K] -> uint8 [N, blocks, 32] around zero point 128, K padded with zeros to whole blocks."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(48, 70)).astype(np.float32)
    weight[5, 40:] *= 30  # an outlier costs its own block only
    w = quantize_int8_blocks(weight)
    assert w.packed.dtype == np.uint8 and w.packed.shape == (48, 3, 32) and w.scale.shape == (48, 3)
    assert w.packed.min() >= 1 and w.packed.max() <= 255  # symmetric: [-127, 127] + 128
    restored = ((w.packed.astype(np.float32) - 128) * w.scale[..., None]).reshape(48, -1)
    assert np.all(restored[:, 70:] == 0)
    step = np.repeat(w.scale, 32, axis=1)[:, :70]
    assert np.all(np.abs(restored[:, :70] - weight) <= step / 2 + 1e-7)
    assert w.scale[5, 0] < w.scale[5, 2] / 10  # the outlier's block has its own scale


@pytest.mark.parametrize("width, block", [(768, 64), (4864, 64), (576, 64), (896, 64), (96, 32), (70, 32)])
def test_the_int8_block_is_64_where_it_divides_a_products_inputs(width, block):
    assert int8_block(width) == block
    assert quantize_int8_blocks(np.ones((2, width), np.float32)).codes.shape[1:] == (-(-width // block), block)


def product_session(g, threads=0):
    """An onnxruntime session of a GraphBuilder's graph, its external weights put inline."""
    import onnx
    import onnxruntime as ort

    model = g.model(17, "")
    stored = [onnx.numpy_helper.from_array(a, name) for name, a in g.arrays.items()]
    kept = [t for t in model.graph.initializer if t.name not in g.arrays]
    model.graph.ClearField("initializer")
    model.graph.initializer.extend(kept + stored)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("n, k", [(2304, 768), (768, 3072), (50257, 768), (4864, 896)])
def test_an_int8_product_gives_a_row_the_same_bits_alone_and_among_other_rows(n, k):
    """The recipe's blocks keep onnxruntime's 8-bit kernel on one order of sums for one row and for many: a
    batch's row, a verify pass's position and a request alone get the same logits (in blocks of 128 its many-row
    path rounds otherwise: int8_block says why the recipe stops at 64)."""
    from edgelm.export.graph.builder import FLOAT, GraphBuilder
    from edgelm.export.graph.matmuls import matmul_nbits

    rng = np.random.default_rng(0)
    w = quantize_int8_blocks(rng.normal(size=(n, k)).astype(np.float32))
    g = GraphBuilder("product", "unused.data")
    stored = [g.weight("w", w.packed), g.weight("s", w.scale)]
    g.output(matmul_nbits(g, g.input("x", FLOAT, ["rows", k]), w, stored), FLOAT, ["rows", n])
    session = product_session(g, threads=2)
    x = rng.normal(size=(9, k)).astype(np.float32)
    together = session.run(None, {"x": x})[0]
    alone = np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])
    np.testing.assert_array_equal(together, alone)


def test_a_row_product_depends_on_its_row_alone():
    """int8-rows' product: the same row gives the same bits alone, beside other rows, and beside a row of zeros, and
    comes within the weights' and the row's rounding of the float product."""
    import onnx
    import onnxruntime as ort
    from edgelm.export.graph.builder import FLOAT, GraphBuilder
    from edgelm.export.graph.matmuls import int8_row_matmul

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(48, 40)).astype(np.float32)
    g = GraphBuilder("product", "unused.data")
    g.output(int8_row_matmul(g, g.input("x", FLOAT, ["rows", 48]), {"p.weight": weight}, "p"), FLOAT, ["rows", 40])
    assert {n.op_type for n in g.nodes} >= {"MatMulIntegerToFloat", "QuantizeLinear"}
    session = product_session(g)
    rows = rng.normal(size=(6, 48)).astype(np.float32) * np.array([[1], [100], [1e-3], [1], [7], [0.5]], np.float32)
    rows[3] = 0
    together = session.run(None, {"x": rows})[0]
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(session.run(None, {"x": row[None]})[0][0], together[i])
    assert np.all(together[3] == 0)
    exact = rows @ weight
    largest = np.abs(rows).max(axis=1, keepdims=True)  # each row's step is largest / 127, its error half that
    row_error = largest / 254 * np.abs(weight).sum(axis=0)
    weight_error = (np.abs(rows).sum(axis=1, keepdims=True) + 48 * largest / 254) * np.abs(weight).max(axis=0) / 126
    bound = row_error + weight_error
    assert np.all(np.abs(together - exact) <= bound * 1.001 + 1e-6)
    assert np.abs(together - exact).max() > 0  # it is the integer product, not a float one


@pytest.mark.parametrize(
    "fixture, recipe",
    [
        ("validated_package_int8", "int8"),
        ("validated_package_int8_rows", "int8-rows"),
        ("validated_package_int8_dynamic", "int8-dynamic"),
    ],
)
def test_each_recipe_generates_scores_and_follows_float32(request, tiny_package, fixture, recipe):
    package = request.getfixturevalue(fixture)
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["weights"]["quantization"]["method"] == recipe
    assert manifest["graph"]["min_onnxruntime"] == "1.22"  # tools/ci/onnxruntime_matrix.sh runs it there
    reported = manifest["validation"][recipe]["greedy"]["prefix_agreement"]
    model, fp32 = load(package), load(tiny_package)
    agreement = []
    for prompt in PROMPTS:
        ours = model.generate(prompt, **GREEDY).token_ids
        theirs = fp32.generate(prompt, **GREEDY).token_ids
        assert len(ours) == 16 and all(0 <= t < model.arch.vocab_size for t in ours)
        agreement.append(next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), 16) / 16)
    # the export's figure is against transformers on its own prompts: these prompts agree about as well
    assert np.mean(agreement) >= reported / 2, (agreement, reported)
    score = model.score(PROMPTS[1])
    assert all(math.isfinite(x) and x <= 0 for x in score.logprobs)
    assert score.perplexity == pytest.approx(fp32.score(PROMPTS[1]).perplexity, rel=0.1)


@pytest.fixture(scope="module")
def int8_models(tiny_package_int8, tiny_package_int8_rows, llama_untied_package_int8, llama_untied_package_int8_rows):
    """GPT-2 with its tied head (int8: MatMulNBits over the token table's blocks; int8-rows: QGemm over the token
    rows) and Llama with an untied one (int8: MatMulNBits; int8-rows: QGemm over rows of its own), in both
    batch-invariant recipes."""
    packages = (tiny_package_int8, tiny_package_int8_rows, llama_untied_package_int8, llama_untied_package_int8_rows)
    return [load(package) for package in packages]


@pytest.fixture(scope="module")
def llama_untied_checkpoint(tmp_path_factory):
    from llama_checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("llama-untied") / "checkpoint", "llama-untied", seed=2)


@pytest.fixture(scope="module")
def llama_untied_package_int8(llama_untied_checkpoint, tmp_path_factory):
    from edgelm.export.stages import export_model

    folder = tmp_path_factory.mktemp("llama-untied-int8")
    return export_model(str(llama_untied_checkpoint), folder / "package", quantize="int8", validate=False).path


@pytest.fixture(scope="module")
def llama_untied_package_int8_rows(llama_untied_checkpoint, tmp_path_factory):
    from edgelm.export.stages import export_model

    folder = tmp_path_factory.mktemp("llama-untied-int8-rows")
    return export_model(str(llama_untied_checkpoint), folder / "package", quantize="int8-rows", validate=False).path


def test_a_greedy_int8_request_is_the_same_alone_and_in_a_batch(int8_models):
    for model in int8_models:
        alone = [model.generate(prompt, **GREEDY).token_ids for prompt in PROMPTS]
        together = [c.token_ids for c in model.generate(PROMPTS, **GREEDY)]  # one left-padded batch of 9
        assert together == alone
        reordered = [c.token_ids for c in model.generate(PROMPTS[::-1][:5], **GREEDY)]
        assert reordered == alone[::-1][:5]


def test_a_greedy_int8_request_is_the_same_alone_and_in_the_running_batch(int8_models):
    """Jobs join one running batch two steps apart, each with its own length, beside a sampled one."""
    for model in int8_models:
        scheduler = Scheduler(model, max_rows=8)
        first = Job(model.batch(["Hi"], do_sample=True, seed=1, ignore_eos=True, max_new_tokens=40))
        lengths = [10 + k for k in range(len(PROMPTS))]
        jobs = [Job(model.batch([p], **GREEDY | dict(max_new_tokens=n))) for p, n in zip(PROMPTS, lengths)]

        def stagger(count):  # greedy job i arrives at the sampled job's (2i + 1)-th step boundary
            for i, job in enumerate(jobs):
                if count == 2 * i + 1:
                    scheduler.submit(job)

        first.at_boundary = stagger
        scheduler.submit(first)
        try:
            assert first.wait().error is None
            for job, prompt, n in zip(jobs, PROMPTS, lengths):
                assert job.wait().error is None
                expected = model.generate(prompt, **GREEDY | dict(max_new_tokens=n)).token_ids
                assert job.batch.completions[0].token_ids == expected, prompt
        finally:
            scheduler.close()


@pytest.mark.parametrize("width, head", [(128, "MatMulNBits"), (48, "QGemm")])
def test_the_int8_tied_table_in_blocks_serves_the_head_and_the_lookup(width, head):
    """A tied int8 matrix of two blocks a row: the head's MatMulNBits and the runtime's lookup read one table, and
    a lookup row is (code - 128) * its block's scale, block by block; a width 32 does not divide keeps the rows
    and the QGemm head."""
    from edgelm.export.graph.builder import FLOAT, GraphBuilder
    from edgelm.export.graph.embeddings import embedding_and_head
    from edgelm.export.weights_file import _token_section
    from edgelm.runtime.engine.embeddings import TokenEmbeddings
    from edgelm.runtime.package.format import TOKEN_ROWS, TOKEN_SCALE

    rng = np.random.default_rng(0)
    wte = rng.normal(size=(40, width)).astype(np.float32)
    wte[3, 70:] *= 50  # one block's outlier: its own scale
    g = GraphBuilder("head", "model.onnx.data")
    _, lm_head = embedding_and_head(g, wte, None, "int8")
    g.output(lm_head(g.input("x", FLOAT, ["b", "t", width]), "logits"), FLOAT, ["b", "t", 40])
    assert {n.op_type for n in g.nodes} & {"MatMulNBits", "QGemm"} == {head}
    offsets = dict(zip(sorted(g.arrays), range(0, 1 << 30, 1 << 20)))  # any distinct places
    table = _token_section(g.arrays, offsets, set(g.arrays))  # every array here is one the graph names
    if head == "QGemm":
        assert table.block == 0 and table.rows.shape == (40, width)
        return
    codes, scale = g.arrays[f"{TOKEN_ROWS}.0"], g.arrays[f"{TOKEN_SCALE}.0"]
    assert table.block == 64 and table.rows.shape == codes.shape == (40, 2, 64) and table.scale.shape == (40, 2)
    lookup = TokenEmbeddings.from_arrays(codes, scale)
    expected = ((codes.astype(np.float32) - 128) * scale[..., None]).reshape(40, width)
    ids = np.array([[3, 0, 39], [3, 3, 1]])
    np.testing.assert_array_equal(lookup(ids), expected[ids])
    assert np.all(np.abs(expected - wte) <= np.repeat(scale, 64, axis=1) / 2 + 1e-6)
    assert scale[3, 0] < scale[3, 1] / 10
    assert lookup(np.zeros((1, 0), np.int64)).shape == (1, 0, width)  # no tokens, no rows
