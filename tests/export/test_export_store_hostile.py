"""Hostile checkpoints and a tampered store, found by probing: a config.json nested 100,000 deep, a
pytorch_model.bin that pickles code rather than tensors, and store records nested too deep to read. Each gets
one typed line (or, for the store's own records, is passed over), never a traceback or torch's advice."""

import json
import os
import pickle
import shutil
import warnings

import pytest
from edgelm.export.errors import ExportError
from edgelm.export.families import family_for
from edgelm.export.load import read_config
from edgelm.runtime.store import local as store
from store_support import invoke, make_store

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_config_nested_too_deep_is_one_export_error(tiny_checkpoint, tmp_path):
    folder = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    (folder / "config.json").write_text(DEEP)
    with pytest.raises(ExportError, match="nested too deeply to be a checkpoint config"):
        read_config(folder)


class RunsCode:
    def __reduce__(self):
        return (os.system, ("exit 0",))


def test_a_pickle_that_is_not_tensors_is_refused_without_torchs_advice(tiny_checkpoint, tmp_path):
    folder = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    _, arch = read_config(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(RunsCode()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ExportError, match="pickled objects other than tensors") as error:
            family_for(arch.model_type).read_weights(folder, arch)
    assert "weights_only" not in str(error.value) and "\n" not in str(error.value)
    assert not [w for w in caught if "pickle" in str(w.message).lower()], [str(w.message) for w in caught]


def test_store_records_nested_too_deep_are_passed_over(tmp_path, monkeypatch, tiny_package):
    root = make_store(tmp_path, monkeypatch)
    shutil.copytree(tiny_package, root / "tiny")
    (root / store.META).mkdir()
    (root / store.META / "config.json").write_text(DEEP)
    (root / store.META / "tiny.json").write_text(DEEP)
    assert store.get_default() is None
    result = invoke("list")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "tiny" in result.output
    assert json.loads((tiny_package / "manifest.json").read_text())  # the package itself untouched


def test_a_tokenizer_config_nested_too_deep_is_copied_or_refused_in_one_line(tmp_path):
    from edgelm.export.checkpoint_files import tokenizer_config

    (tmp_path / "tokenizer_config.json").write_text(DEEP)
    assert tokenizer_config(tmp_path, None) is None  # copied as it is: the package reads tokenizer.json
    with pytest.raises(ExportError, match="cannot read .*tokenizer_config.json to set its chat template"):
        tokenizer_config(tmp_path, "{{ messages }}")
