"""The export's architecture families (edgelm.export.families): the one place a checkpoint's family is chosen
from its config.json's model_type, and what that choice answers for a model_type edgelm does not export."""

import json

import pytest
from edgelm.export.errors import ExportError
from edgelm.export.families import FAMILIES, SUPPORTED, family_for
from edgelm.export.load import read_config


def test_each_model_type_is_exported_by_one_family_validated_against_a_transformers_class():
    import transformers

    claimed = [model_type for family in FAMILIES for model_type in family.reference_classes]
    assert sorted(claimed) == ["gpt2", "llama", "qwen2"] and len(set(claimed)) == len(claimed)
    for family in FAMILIES:
        for model_type, reference in family.reference_classes.items():
            assert family_for(model_type) is family and family.reference_class(model_type) == reference
            assert hasattr(transformers, reference), reference
        assert family.described in SUPPORTED


def test_qwen2_is_the_llama_family(qwen2_checkpoint, llama_checkpoint):
    (_, qwen2), (_, llama) = read_config(qwen2_checkpoint), read_config(llama_checkpoint)
    assert family_for(qwen2.model_type) is family_for(llama.model_type) is not family_for("gpt2")
    assert tuple(qwen2.biases) == ("q_proj", "k_proj", "v_proj") and not llama.biases


@pytest.mark.parametrize("model_type", [["gpt2"], {"name": "llama"}, 2, None, "GPT2", "mistral"])
def test_a_model_type_no_family_exports_is_one_line_naming_what_edgelm_exports(tmp_path, model_type):
    """Not a TypeError for a model_type that cannot be looked up (a list, an object), nor a guess for a near miss."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    with pytest.raises(ExportError) as error:
        read_config(tmp_path)
    message = str(error.value)
    assert f"is a '{model_type}' model (X); edgelm exports {SUPPORTED}." in message and "\n" not in message
