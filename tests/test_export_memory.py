"""What keeps a large export's memory near one copy of its weights, checked on tiny checkpoints: tensors are read
from the file one at a time, the float32 graph and the PyTorch reference read the checkpoint's own arrays (no
copies of their own), and onnxruntime's float32 validation session makes no packed copy of the weights. The
figures on gpt2-xl and Llama-3.2-1B shapes are in benchmarks/results/2026-11-30-large-exports.md."""

import weakref

import numpy as np
import pytest


def _load(folder):
    from edgelm.export.checkpoint import load_checkpoint

    return load_checkpoint(str(folder))


@pytest.fixture(scope="module")
def untied_llama_checkpoint(tmp_path_factory):
    from llama_checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("untied") / "llama-untied", "llama-untied")


def _shares(array, arrays) -> bool:
    return any(np.may_share_memory(array, other) for other in arrays)


@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "llama_checkpoint", "untied_llama_checkpoint"])
def test_float32_graph_holds_no_copy_of_the_weights(request, checkpoint):
    """Every weight matrix of the float32 graph is the checkpoint's own array: the Llama projections were read into
    their packed [in, out] matrices, the matrix the LM head multiplies by into [C, V]."""
    from edgelm.export.stages import _family

    loaded = _load(request.getfixturevalue(checkpoint))
    decoder = _family(loaded.arch).build_decoder(loaded.arch, loaded.weights, "none")
    copied = [name for name, a in decoder.arrays.items() if a.ndim == 2 and not _shares(a, loaded.weights.values())]
    assert copied in ([], ["wpe"], ["rope.cos_cache", "rope.sin_cache"]), copied  # (wpe: too small to go external)
    assert any(name.endswith("qkv_proj.weight") for name in decoder.arrays) or loaded.arch.positions != "rope"


@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "llama_checkpoint", "untied_llama_checkpoint"])
def test_pytorch_reference_reads_the_checkpoint_arrays(request, checkpoint):
    """The validation reference is built on the meta device and given the arrays, not initialised and copied."""
    from edgelm.export.stages import _family

    loaded = _load(request.getfixturevalue(checkpoint))
    model = _family(loaded.arch).reference_model(loaded)
    arrays = list(loaded.weights.values())
    own = [name for name, p in model.named_parameters() if not _shares(p.detach().numpy(), arrays)]
    assert own == []


def test_llama_packing_gives_the_matrices_read_and_equals_packing_copies(untied_llama_checkpoint):
    from edgelm.export.llama_graph import pack_weights

    loaded = _load(untied_llama_checkpoint)
    packed = pack_weights(loaded.arch, loaded.weights)
    copies = pack_weights(loaded.arch, {name: np.array(a) for name, a in loaded.weights.items()})
    for name, matrix in packed.items():
        np.testing.assert_array_equal(matrix, copies[name])
        assert not np.may_share_memory(copies[name], matrix)
    qkv = packed["model.layers.1.self_attn.qkv_proj.weight"]
    assert qkv.flags.c_contiguous and np.may_share_memory(qkv, loaded.weights["model.layers.1.self_attn.v_proj.weight"])


def test_checkpoint_tensors_are_read_one_at_a_time(llama_checkpoint, monkeypatch):
    """When the loader asks the safetensors file for a tensor, the one before it is already placed and gone."""
    import safetensors

    opened, alive_when_asked = safetensors.safe_open, []

    class Watched:
        def __init__(self, *args, **kwargs):
            self.handle, self.previous = opened(*args, **kwargs), None

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def keys(self):
            return self.handle.keys()

        def get_tensor(self, name):
            alive_when_asked.append(self.previous is not None and self.previous() is not None)
            tensor = self.handle.get_tensor(name)
            self.previous = weakref.ref(tensor)
            return tensor

    monkeypatch.setattr(safetensors, "safe_open", Watched)
    loaded = _load(llama_checkpoint)
    assert len(alive_when_asked) >= len(loaded.weights) and not any(alive_when_asked)


def test_float32_validation_session_does_not_prepack(llama_checkpoint, monkeypatch):
    """onnxruntime would otherwise hold a packed copy of every float32 matrix beside the arrays it was handed."""
    from edgelm.export import validate
    from edgelm.export.stages import _family
    from edgelm.export.weights_file import split_weights

    loaded = _load(llama_checkpoint)
    decoder = _family(loaded.arch).build_decoder(loaded.arch, loaded.weights, "none")
    graph = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    created = []

    class Built(Exception):
        pass

    def session(graph, sess_options, **kwargs):
        created.append(sess_options.get_session_config_entry("session.disable_prepacking"))
        raise Built  # the options are the point; nothing needs to run

    monkeypatch.setattr(validate.ort, "InferenceSession", session)
    with pytest.raises(Built):
        validate.check_fp32(graph, None, None, loaded.arch)
    assert created == ["1"]


def test_relative_error_in_pieces_is_the_whole_arrays_figure():
    from edgelm.export.validate import _relative_error

    rng = np.random.default_rng(0)
    reference = rng.standard_normal((2, 150, 7)).astype(np.float32)
    ours = reference + rng.standard_normal(reference.shape).astype(np.float32) * 1e-3
    mask = np.ones((2, 150), dtype=np.int64)
    mask[1, :40] = 0
    ours[1, :40] = 1e6  # padding: not compared
    real = mask.astype(bool)
    whole = np.abs(ours[real] - reference[real]).max() / np.abs(reference[real]).max()
    assert _relative_error(ours, reference, mask, positions_at_once=16) == pytest.approx(float(whole), rel=1e-6)
    ours[0, 149, 3] = np.nan
    assert np.isnan(_relative_error(ours, reference, mask, positions_at_once=16))
