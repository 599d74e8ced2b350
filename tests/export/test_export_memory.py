"""What keeps a large export's memory near one copy of its weights, checked on tiny checkpoints: tensors are read
from the file one at a time, the float32 graph and the PyTorch reference read the checkpoint's own arrays (no
copies of their own), and onnxruntime's float32 validation session makes no packed copy of the weights. The
figures on gpt2-xl and Llama-3.2-1B shapes are in benchmarks/results/2026-11-30-large-exports.md."""

import weakref
from pathlib import Path

import numpy as np
import pytest
import torch


def _load(folder):
    from edgelm.export.load import load_checkpoint

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
    from edgelm.export.families import family_for

    loaded = _load(request.getfixturevalue(checkpoint))
    decoder = family_for(loaded.arch.model_type).build_decoder(loaded.arch, loaded.weights, "none")
    copied = [name for name, a in decoder.arrays.items() if a.ndim == 2 and not _shares(a, loaded.weights.values())]
    assert copied == (["rope.cos_cache", "rope.sin_cache"] if loaded.arch.positions == "rope" else [])


@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "llama_checkpoint", "untied_llama_checkpoint"])
def test_pytorch_reference_reads_the_checkpoint_arrays(request, checkpoint):
    """The validation reference is built on the meta device and given the arrays, not initialised and copied."""
    from edgelm.export.families import family_for

    loaded = _load(request.getfixturevalue(checkpoint))
    model = family_for(loaded.arch.model_type).reference_model(loaded)
    arrays = list(loaded.weights.values())
    own = [name for name, p in model.named_parameters() if not _shares(p.detach().numpy(), arrays)]
    assert own == []


def test_llama_packing_gives_the_matrices_read_and_equals_packing_copies(untied_llama_checkpoint):
    from edgelm.export.families.llama.packing import pack_weights

    loaded = _load(untied_llama_checkpoint)
    packed = pack_weights(loaded.arch, loaded.weights)
    copies = pack_weights(loaded.arch, {name: np.array(a) for name, a in loaded.weights.items()})
    for name, matrix in packed.items():
        np.testing.assert_array_equal(matrix, copies[name])
        assert not np.may_share_memory(copies[name], matrix)
    qkv = packed["model.layers.1.self_attn.qkv_proj.weight"]
    assert qkv.flags.c_contiguous and np.may_share_memory(qkv, loaded.weights["model.layers.1.self_attn.v_proj.weight"])


def test_checkpoint_tensors_are_read_one_at_a_time(llama_checkpoint, monkeypatch, tmp_path):
    """Each tensor is placed and gone before the file gives the next one, and none stays mapped from the file."""
    import shutil

    from edgelm.export import checkpoint as checkpoint_module
    from edgelm.export.families.llama import weights as llama_module

    read, alive_when_asked = checkpoint_module.tensors, []

    def watched(path):
        previous = None
        for name, tensor in read(path):
            alive_when_asked.append(previous is not None and previous() is not None)
            previous = weakref.ref(tensor)
            yield name, tensor
            del tensor

    monkeypatch.setattr(llama_module, "tensors", watched)
    folder = shutil.copytree(llama_checkpoint, tmp_path / "copy")  # a file no other test has open
    loaded = _load(folder)
    assert len(alive_when_asked) >= len(loaded.weights) and not any(alive_when_asked)
    maps = open("/proc/self/maps").read() if Path("/proc/self/maps").exists() else ""
    assert str(loaded.folder / "model.safetensors") not in maps


def test_float32_check_computes_on_the_arrays_in_place(llama_checkpoint, monkeypatch):
    """Handed over as initializers, the weights would be copied into the session (and prepacked): the float32
    check feeds them as inputs, and gets transformers' logits through both of the engine's paths."""
    import onnx
    from edgelm.export import validate
    from edgelm.export.families import family_for
    from edgelm.export.weights_file import split_weights

    asked, make_engine = [], validate._engine

    class Built(Exception):
        pass

    def engine(graph, arch, **options):
        asked.append(options)
        raise Built  # what it asked for is the point; nothing needs to run

    monkeypatch.setattr(validate, "_engine", engine)
    with pytest.raises(Built):
        validate.check_fp32(None, None, None, None)
    assert asked == [{"in_place": True}]
    monkeypatch.undo()

    loaded = _load(llama_checkpoint)
    decoder = family_for(loaded.arch.model_type).build_decoder(loaded.arch, loaded.weights, "none")
    graph = split_weights(decoder.model.SerializeToString(), decoder.arrays)
    given, session_class = [], validate.ort.InferenceSession

    def session(model, sess_options, **kwargs):
        given.append([t.name for t in onnx.load_model_from_string(model).graph.initializer if t.name in graph.weights])
        return session_class(model, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(validate.ort, "InferenceSession", session)
    fed = make_engine(graph, loaded.arch, in_place=True)
    assert given == [[]]
    ids = np.array([[3, 5, 7, 9]])
    model = family_for(loaded.arch.model_type).reference_model(loaded)
    reference = model(input_ids=torch.from_numpy(ids)).logits.detach().numpy()
    logits, _ = fed.forward(ids, np.ones_like(ids), np.arange(4)[None], fed.empty_past(1), logits_to_keep=0)
    assert np.abs(logits - reference).max() <= 1e-5 * np.abs(reference).max()
    steps = validate._ours_greedy(fed, [ids[0].tolist()], 4, loaded.arch)  # the bound decode path
    assert steps.tolist() == validate._torch_greedy(model, [ids[0].tolist()], 4, loaded.arch.eos_token_id).tolist()


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
    zeros = np.zeros((1, 3, 7), np.float32)  # a token whose embedding is zero: both sides give zero logits
    assert _relative_error(zeros, zeros, np.ones((1, 3))) == 0.0
    assert _relative_error(zeros + 1e-3, zeros, np.ones((1, 3))) == float("inf")
