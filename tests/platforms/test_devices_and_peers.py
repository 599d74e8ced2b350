"""Provider selection (CUDA paths tested by simulating onnxruntime's answers), a real optimum-cli export
loaded by the runtime, and the distilgpt2-shaped package sizes the export stage promises."""

import json

import edgelm.runtime as rt
import numpy as np
import pytest
from edgelm.runtime import DeviceError
from edgelm.runtime.engine import session
from edgelm.runtime.engine.session import CPU, CUDA, CUDA_OPTIONS


class FakeSession:
    """Stands in for an onnxruntime session that ended up on the given providers."""

    def __init__(self, providers):
        self._providers = providers

    def get_providers(self):
        return self._providers


def _pretend(monkeypatch, available, started_on=None):
    """started_on None: the session starts on every provider it is given."""
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: available)
    asked = []

    def fake_session(path, sess_options=None, providers=None):
        asked.append(providers)
        names = [p if isinstance(p, str) else p[0] for p in providers]
        return FakeSession(names if started_on is None else started_on)

    monkeypatch.setattr(session.ort, "InferenceSession", fake_session)
    return asked


def test_auto_picks_cuda_when_onnxruntime_gpu_and_a_gpu_are_present(monkeypatch):
    asked = _pretend(monkeypatch, [CUDA, CPU], [CUDA, CPU])
    _, device = session.create_session("model.onnx", "auto")
    assert device == "cuda" and asked == [[(CUDA, {"use_tf32": "0"}), CPU]]
    assert CUDA_OPTIONS == {"use_tf32": "0"}  # float32 products stay float32 (no TF32)


def test_auto_keeps_a_quantized_graph_on_the_cpu_and_cuda_runs_it_when_asked(monkeypatch, caplog):
    asked = _pretend(monkeypatch, [CUDA, CPU])
    assert session.create_session("model.onnx", "auto", quantized=True)[1] == "cpu" and asked == [[CPU]]
    assert session.create_session("model.onnx", "cuda", quantized=True)[1] == "cuda"
    assert asked[1] == [(CUDA, CUDA_OPTIONS), CPU] and "--device cpu is faster" in caplog.text


def test_load_tells_the_session_whether_the_weights_are_quantized(monkeypatch, tiny_package, tiny_package_int8):
    seen = []
    real = session.create_session

    def spy(model_file, device="auto", threads=None, quantized=False, spinning=True):
        seen.append(quantized)
        return real(model_file, "cpu", threads, quantized, spinning)

    monkeypatch.setattr("edgelm.runtime.model.session_start.create_session", spy)
    rt.load(tiny_package)
    rt.load(tiny_package_int8)
    assert seen == [False, True]


def test_auto_falls_back_to_cpu_when_cuda_cannot_start(monkeypatch):
    _pretend(monkeypatch, [CUDA, CPU], [CPU])  # onnxruntime-gpu installed, but no GPU: it starts on CPU
    _, device = session.create_session("model.onnx", "auto")
    assert device == "cpu"


def test_cuda_asked_for_but_cannot_start_is_an_error_not_a_silent_fallback(monkeypatch):
    _pretend(monkeypatch, [CUDA, CPU], [CPU])
    with pytest.raises(DeviceError, match="could not start CUDA here"):
        session.create_session("model.onnx", "cuda")


def test_cpu_only_onnxruntime(monkeypatch):
    asked = _pretend(monkeypatch, [CPU], [CPU])
    assert session.create_session("model.onnx", "auto")[1] == "cpu" and asked == [[CPU]]
    with pytest.raises(DeviceError, match=r"has no CUDA provider.*pip install 'onnxruntime-gpu>=1\.22'"):
        session.create_session("model.onnx", "cuda")


def test_the_loaded_model_says_which_device_it_chose(tiny_package):
    model = rt.load(tiny_package, device="auto")
    assert model.device == ("cuda" if session.cuda_available() else "cpu")


@pytest.mark.skipif(not session.cuda_available(), reason="needs onnxruntime-gpu and an NVIDIA GPU")
def test_cuda_generation_equals_cpu(tiny_package):
    prompt = "Once upon a time"
    cpu = rt.load(tiny_package, device="cpu").generate(prompt, max_new_tokens=20)
    cuda = rt.load(tiny_package, device="cuda").generate(prompt, max_new_tokens=20)
    assert cuda.token_ids == cpu.token_ids


def test_a_real_optimum_cli_export_runs(tiny_checkpoint, reference_model, tmp_path):
    """`optimum-cli export onnx --task text-generation-with-past` output (model.onnx, config.json,
    tokenizer.json) loads as a plain folder and gives transformers' greedy tokens."""
    import torch
    from optimum.exporters.onnx import main_export

    folder = tmp_path / "optimum"
    main_export(str(tiny_checkpoint), output=str(folder), task="text-generation-with-past")
    model = rt.load(folder)
    assert model.package.kind == "optimum" and not model.engine.io.has_logits_to_keep
    ids = model.encode("The quick brown fox")
    ours = model.generate([ids], max_new_tokens=12, min_new_tokens=12)[0]
    with torch.no_grad():
        theirs = reference_model.generate(
            torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0
        )
    assert ours.token_ids == theirs[0, len(ids) :].tolist()
    assert np.isfinite(model.score("The quick brown fox").perplexity)


@pytest.mark.slow
def test_distilgpt2_shaped_packages_fit_their_size_budget(shared_folder, tmp_path_factory):
    """A checkpoint of distilgpt2's exact shape (random weights): fp32 <= 335 MB (optimum writes 482 MB),
    int8 <= 90 MB (quantize_dynamic on optimum's export gives ~120 MB), both passing fp32 parity."""
    if not (shared_folder / "distilgpt2-config.json").exists():
        pytest.skip(f"needs {shared_folder}/distilgpt2-config.json and gpt2-tokenizer (../shared is absent)")
    from distilgpt2_checkpoint import build
    from edgelm.export.stages import export_model

    checkpoint = build(tmp_path_factory.mktemp("distilgpt2") / "ckpt", shared_folder)
    budgets = {"none": 335e6, "int8": 90e6}
    for recipe, budget in budgets.items():
        result = export_model(str(checkpoint), tmp_path_factory.mktemp("pkg") / recipe, quantize=recipe)
        size = (
            sum(f["size"] for f in result.manifest["files"].values()) + (result.path / "manifest.json").stat().st_size
        )
        assert size <= budget, f"{recipe}: {size / 1e6:.1f} MB"
        assert result.manifest["validation"]["fp32"]["max_logits_relative_error"] <= 1e-5
        assert result.manifest["architecture"]["n_positions"] == 1024
        assert json.loads((result.path / "config.json").read_text())["n_layer"] == 6


@pytest.mark.parametrize("fixture", ["tiny_package", "tiny_package_int8", "tiny_package_int4"])
def test_loading_at_the_extended_optimization_level_loses_no_fusion(fixture, request, tmp_path):
    """The runtime loads at ORT_ENABLE_EXTENDED to start faster: onnxruntime's ALL level must find nothing more
    in any recipe's graph (same nodes after optimization)."""
    from collections import Counter

    import onnx
    import onnxruntime as ort

    model_file = str(request.getfixturevalue(fixture) / "model.onnx")
    graphs = {}
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        options = ort.SessionOptions()
        options.graph_optimization_level, options.log_severity_level = level, 3
        options.optimized_model_filepath = str(tmp_path / f"{level}.onnx")
        ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
        graphs[level] = Counter(
            node.op_type for node in onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node
        )
    extended, full = graphs.values()
    assert extended == full
    assert (
        session.create_session(model_file, "cpu")[0]._sess_options.graph_optimization_level
        == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    )


def _spinning_entry(options, key="session.intra_op.allow_spinning") -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # not set: onnxruntime's default
        return None


def test_threads_spin_unless_the_caller_shares_its_cores(monkeypatch):
    monkeypatch.setattr(session.ort, "get_available_providers", lambda: [CPU])
    given = []

    def fake_session(path, sess_options=None, providers=None):
        given.append(sess_options)
        return FakeSession([CPU])

    monkeypatch.setattr(session.ort, "InferenceSession", fake_session)
    session.create_session("model.onnx", "cpu")
    session.create_session("model.onnx", "cpu", spinning=False)
    assert [_spinning_entry(o) for o in given] == [None, "0"]
    # a spinning worker sleeps a millisecond after its last work, not onnxruntime's default of tens of ms
    assert [_spinning_entry(o, "session.intra_op.spin_duration_us") for o in given] == [str(session.SPIN_US), None]


def test_load_checks_spinning_and_serve_turns_it_off(tiny_package, monkeypatch):
    from click.testing import CliRunner
    from edgelm.runtime import PackageError, model
    from edgelm.runtime.cli.main import main

    with pytest.raises(DeviceError, match="spinning must be True or False"):
        rt.load(tiny_package, spinning="no")
    assert rt.load(tiny_package, spinning=False).generate("Hi", max_new_tokens=4).token_ids
    asked = []

    def spy(*args, **options):
        asked.append(options)
        raise PackageError("stopped before serving")

    monkeypatch.setattr(model, "load", spy)
    result = CliRunner().invoke(main, ["serve", str(tiny_package), "--port", "0"])
    assert "stopped before serving" in result.output and asked[0]["spinning"] is False
