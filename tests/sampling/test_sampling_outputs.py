"""Packages of older releases have graphs with "sampling outputs" (docs/package-format.md): the runtime never reads
them and feeds their temperature zero rows, so such a graph makes none and decodes the tokens a graph without them
decodes, greedy and seeded, at batch 1, in a batch and in the running batch."""

import json
import shutil

import numpy as np
import onnx
import pytest
from edgelm.runtime import load
from edgelm.runtime.batching.scheduler import Scheduler
from edgelm.runtime.package.format import SAMPLING_TEMPERATURE
from edgelm.runtime.package.open import file_record
from onnx import TensorProto, helper, numpy_helper
from scheduler_job import Job

BLOCK = 256  # tokens per block of the older graphs' weights


def with_sampling_outputs(package, folder):
    """A copy of `package` whose graph also makes the older sampling outputs: softmax(last logits / t) padded to
    whole blocks, and each block's sum, for the rows of the overridable [R, 1] temperature (default [[1]])."""
    shutil.copytree(package, folder)
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    graph, vocab = model.graph, next(o for o in model.graph.output if o.name == "logits")
    vocab = vocab.type.tensor_type.shape.dim[2].dim_value
    blocks = -(-vocab // BLOCK)
    consts = {
        "legacy_starts": [0, -1],
        "legacy_axes": [0, 1],
        "legacy_end": [np.iinfo(np.int64).max],
        "legacy_two": [2],
        "legacy_pad": [0, 0, 0, 0, 0, blocks * BLOCK - vocab],
        "legacy_shape": [0, 0, blocks, BLOCK],
    }
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items())
    graph.initializer.append(numpy_helper.from_array(np.ones((1, 1), np.float32), SAMPLING_TEMPERATURE))
    graph.input.append(helper.make_tensor_value_info(SAMPLING_TEMPERATURE, TensorProto.FLOAT, ["sampled", 1]))
    graph.node.extend(
        [
            helper.make_node("Shape", [SAMPLING_TEMPERATURE], ["legacy_rows"], start=0, end=1),
            helper.make_node("Concat", ["legacy_rows", "legacy_end"], ["legacy_ends"], axis=0),
            helper.make_node("Slice", ["logits", "legacy_starts", "legacy_ends", "legacy_axes"], ["legacy_last"]),
            helper.make_node("Unsqueeze", [SAMPLING_TEMPERATURE, "legacy_two"], ["legacy_t"]),
            helper.make_node("Div", ["legacy_last", "legacy_t"], ["legacy_tempered"]),
            helper.make_node("Softmax", ["legacy_tempered"], ["legacy_softmax"], axis=-1),
            helper.make_node("Pad", ["legacy_softmax", "legacy_pad"], ["sampling_weights"]),
            helper.make_node("Reshape", ["sampling_weights", "legacy_shape"], ["legacy_blocks"]),
            helper.make_node("Einsum", ["legacy_blocks"], ["sampling_block_sums"], equation="rokb->rok"),
        ]
    )
    graph.output.extend(
        [
            helper.make_tensor_value_info("sampling_weights", TensorProto.FLOAT, ["sampled", 1, blocks * BLOCK]),
            helper.make_tensor_value_info("sampling_block_sums", TensorProto.FLOAT, ["sampled", 1, blocks]),
        ]
    )
    onnx.save(model, str(folder / "model.onnx"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["model.onnx"] = file_record(folder / "model.onnx")
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


@pytest.fixture(scope="module")
def models(tiny_package, tmp_path_factory):
    older = with_sampling_outputs(tiny_package, tmp_path_factory.mktemp("older") / "package")
    return load(tiny_package), load(older)


def test_the_runtime_feeds_an_older_graphs_sampling_temperature_zero_rows(models):
    plain, older = models
    assert plain.engine.idle_inputs == {}
    ((name, value),) = older.engine.idle_inputs.items()
    assert name == SAMPLING_TEMPERATURE and value.shape() == [0, 1]
    feeds = {n: older.engine.runner.value(a) for n, a in zip(("input_ids", "attention_mask", "position_ids"),
             (np.array([[1, 2]]), np.ones((1, 2), np.int64), np.array([[0, 1]])))}  # fmt: skip
    feeds |= dict(zip(older.engine._past_names, older.engine.empty_past(1))) | older.engine.idle_inputs
    weights = older.engine.runner.run(feeds, ["sampling_weights"])[0].numpy()
    assert weights.shape[0] == 0  # the graph made none


@pytest.mark.parametrize(
    "options",
    [
        dict(max_new_tokens=12),
        dict(max_new_tokens=12, do_sample=True, seed=3, top_k=0),
        dict(max_new_tokens=12, do_sample=True, seed=5, temperature=0.7, top_p=0.9, repetition_penalty=1.2),
    ],
)
def test_an_older_graph_decodes_what_a_graph_without_the_outputs_decodes(models, options):
    plain, older = models
    prompts = ["Hi", "The quick brown fox"]
    n = 2 if options.get("do_sample") else 1
    expected = plain.generate(prompts, **options, num_return_sequences=n)
    assert [c.token_ids for c in older.generate(prompts, **options, num_return_sequences=n)] == [
        c.token_ids for c in expected
    ]
    scheduler = Scheduler(older, max_rows=4)
    jobs = [Job(older.batch([p], **options)) for p in prompts]
    for job in jobs:
        scheduler.submit(job)
    try:
        for job, prompt in zip(jobs, prompts):
            assert job.wait().error is None
            assert job.batch.completions[0].token_ids == plain.generate([prompt], **options)[0].token_ids
    finally:
        scheduler.close()
