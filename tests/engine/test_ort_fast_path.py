"""onnxruntime's private Python API, the decode loop's fast path (runtime/engine/fast_path.py): every private name
is there and gives what the public API gives, and without it the public IO binding gives the same tokens."""

import edgelm.runtime as rt
import numpy as np
import onnxruntime as ort
import pytest
from edgelm.runtime.engine import fast_path as ort_fast_path
from edgelm.runtime.engine.fast_path import BindingRunner, PrivateRunner, private_api_missing, runner
from edgelm.runtime.errors import InferenceError
from onnx import TensorProto, helper, numpy_helper

PRIVATE = [True, False]  # the fast path, then the public IO binding


@pytest.fixture(scope="module")
def tiny_graph():
    """y = x * scale + 1 [N, 3] and z = reshape(x, shape); `scale` is an overridable initializer (default 2),
    as the decoder's logits_to_keep is."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "one"], ["y"]),
        helper.make_node("Reshape", ["x", "shape"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.array(2, dtype=np.float32), "scale"),
            numpy_helper.from_array(np.array(1, dtype=np.float32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def feeds(x, shape=(3, -1), scale=3.0) -> dict:
    return {
        "x": np.asarray(x, dtype=np.float32),
        "shape": np.array(shape, dtype=np.int64),
        "scale": np.array(scale, dtype=np.float32),
    }


def test_this_onnxruntime_has_every_private_name_the_fast_path_uses(tiny_graph):
    missing = private_api_missing(tiny_graph)
    assert not missing, (
        f"onnxruntime {ort.__version__} no longer has {missing}: edgelm now runs through the slower public IO "
        "binding. Adapt runtime/engine/fast_path.py's PrivateRunner to the new names."
    )
    assert isinstance(runner(tiny_graph), PrivateRunner)  # the fast path is the default


@pytest.mark.parametrize("private", PRIVATE)
def test_a_run_gives_what_the_public_api_gives(tiny_graph, private):
    run = runner(tiny_graph, "tiny.onnx", private=private)
    arrays = feeds(np.arange(6).reshape(2, 3))
    expected = tiny_graph.run(["y", "z"], arrays)
    outputs = run.run({name: run.value(a) for name, a in arrays.items()}, ["y", "z"])
    assert len(outputs) == 2
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(outputs[0].numpy(), np.arange(6).reshape(2, 3) * 3 + 1)  # the override counts
    # an output fed back as an input, as the cache is from one step to the next
    again = run.run({"x": outputs[0], "shape": run.value(arrays["shape"]), "scale": run.value(arrays["scale"])}, ["y"])
    np.testing.assert_array_equal(again[0].numpy(), (np.arange(6).reshape(2, 3) * 3 + 1) * 3 + 1)


@pytest.mark.parametrize("private", PRIVATE)
def test_a_bound_run_writes_into_the_given_arrays(tiny_graph, private):
    run = runner(tiny_graph, private=private)
    y, z = np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)
    bound = run.bind(["x", "shape", "scale"], {"y": y, "z": z})
    for step in range(3):  # the same arrays, refilled by every run
        arrays = feeds(np.arange(6).reshape(2, 3) + step, scale=step)
        bound([run.value(arrays[name]) for name in ("x", "shape", "scale")])
        expected = tiny_graph.run(["y", "z"], arrays)
        np.testing.assert_array_equal(y, expected[0])
        np.testing.assert_array_equal(z, expected[1])


@pytest.mark.parametrize("private", PRIVATE)
def test_an_onnxruntime_error_during_a_run_is_one_line(tiny_graph, private):
    run = runner(tiny_graph, "tiny.onnx", private=private)
    arrays = feeds(np.ones((2, 3)), shape=(4, 4))  # 6 values cannot become 4 x 4
    with pytest.raises(InferenceError, match=r"onnxruntime failed while running tiny\.onnx: .*Reshape") as failed:
        run.run({name: run.value(a) for name, a in arrays.items()}, ["z"])
    assert "\n" not in str(failed.value) and "export it again" in str(failed.value)
    bound = run.bind(["x", "shape", "scale"], {"y": np.zeros((2, 3), np.float32)})
    with pytest.raises(InferenceError, match="Reshape"):
        bound([run.value(arrays[name]) for name in ("x", "shape", "scale")])


def test_a_missing_private_name_means_the_public_binding(tiny_graph, monkeypatch):
    monkeypatch.delattr(ort_fast_path.ort_c, "OrtValueVector")
    assert private_api_missing(tiny_graph) == ["OrtValueVector.push_back"]
    assert isinstance(runner(tiny_graph), BindingRunner)


def load_without_private_api(folder, monkeypatch, **options):
    """Load as on an onnxruntime without the private names: the engine picks the public binding by itself."""
    with monkeypatch.context() as patched:
        patched.delattr(ort_fast_path.ort_c, "OrtValueVector")
        model = rt.load(folder, **options)
    assert isinstance(model.engine.runner, BindingRunner)
    return model


@pytest.fixture
def optimum_folder(tiny_package, tmp_path):
    """The tiny package as an optimum-style folder: no manifest, so the cache grows step by step."""
    import shutil

    for name in ("model.onnx", "model.onnx.data", "config.json", "tokenizer.json"):
        shutil.copy(tiny_package / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize(
    "fixture, decoder",
    [
        ("tiny_package", "InPlaceDecoder"),
        ("tiny_package_int8", "InPlaceDecoder"),
        ("tiny_package_int8_kv8", "InPlaceDecoder"),
        ("optimum_folder", "GrowingDecoder"),
    ],
)
def test_the_public_binding_generates_the_same_tokens(fixture, decoder, request, monkeypatch):
    folder = request.getfixturevalue(fixture)
    fast, public = rt.load(folder), load_without_private_api(folder, monkeypatch)
    assert isinstance(fast.engine.runner, PrivateRunner)
    assert type(fast.engine.decoder(1, 8)).__name__ == type(public.engine.decoder(1, 8)).__name__ == decoder
    prompts = ["Hello, my name is", "the", "A longer prompt that spans a few more tokens than the others"]
    for options in (
        {"max_new_tokens": 20, "do_sample": False},
        {"max_new_tokens": 20, "do_sample": True, "seed": 7, "num_return_sequences": 2},
    ):
        ids = [c.token_ids for c in fast.generate(prompts, **options)]
        assert ids == [c.token_ids for c in public.generate(prompts, **options)], options
        assert any(ids)
    one = fast.generate(prompts[0], max_new_tokens=12, do_sample=False)
    assert one.token_ids == public.generate(prompts[0], max_new_tokens=12, do_sample=False).token_ids
    np.testing.assert_allclose(fast.score(prompts[2]).logprobs, public.score(prompts[2]).logprobs, rtol=1e-6)
