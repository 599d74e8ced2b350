"""Several end-of-text ids (Llama 3's and Qwen2.5's generation configs list two or three): generation stops at
any of them, min_new_tokens bans all of them, and the export keeps the whole list."""

import json
import shutil

import edgelm.runtime as rt
import pytest
from edgelm.export.errors import ExportError
from edgelm.export.stages import export_model
from edgelm.runtime import GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig
from edgelm.runtime.package.open import open_package

EOS = 0  # the tiny tokenizer's <|endoftext|>
OTHER = 11  # a second end-of-text id in these tests


@pytest.mark.parametrize(
    "given, held",
    [(None, None), (7, (7,)), ([7], (7,)), ([7, 3, 7], (7, 3)), ((3, 9), (3, 9)), ([], None)],
)
def test_one_id_or_a_list_is_held_as_a_tuple(given, held):
    assert GenerationConfig(eos_token_id=given).eos_token_id == held


@pytest.mark.parametrize("given", ["7", [7, "3"], [7, None], [1.5], {"a": 1}, [True], [[7]]])
def test_anything_else_is_refused(given):
    with pytest.raises(GenerationOptionError, match="eos_token_id must be a token id or a list") as error:
        GenerationConfig(eos_token_id=given)
    assert error.value.param == "eos_token_id"


def test_every_id_is_checked_against_the_vocabulary():
    with pytest.raises(GenerationOptionError, match=r"eos_token_id names token id\(s\) \[100\]"):
        GenerationConfig(eos_token_id=[5, 100], vocab_size=100)


def test_generation_config_json_lists_are_kept():
    config = GenerationConfig.from_generation_config_json({"eos_token_id": [128001, 128009]}, eos_token_id=1)
    assert config.eos_token_id == (128001, 128009)
    assert GenerationConfig.from_generation_config_json({}, eos_token_id=1).eos_token_id == (1,)


def test_generation_stops_at_any_end_of_text_id(model):
    options = dict(max_new_tokens=12, logit_bias={OTHER: 100})
    alone = model.generate("Hello", **options)
    assert alone.finish_reason == "length" and alone.token_ids == [OTHER] * 12  # one id: OTHER is a plain token
    stopped = model.generate("Hello", eos_token_id=[EOS, OTHER], **options)
    assert stopped.finish_reason == "stop" and stopped.token_ids == []
    # min_new_tokens bans every id of the list, not only the first
    later = model.generate("Hello", eos_token_id=[EOS, OTHER], min_new_tokens=3, **options)
    assert later.finish_reason == "stop" and later.completion_tokens == 3 and OTHER not in later.token_ids


def test_a_running_batch_stops_at_any_end_of_text_id(model):
    from edgelm.runtime.batching.scheduler import Scheduler
    from scheduler_job import Job

    options = dict(eos_token_id=[EOS, OTHER], logit_bias={OTHER: 100}, min_new_tokens=2, max_new_tokens=12)
    scheduler = Scheduler(model, max_rows=2)
    try:
        job = Job(model.batch(["Hello", "Once upon"], **options))
        scheduler.submit(job)
        assert job.wait().error is None
    finally:
        scheduler.close()
    alone = model.generate(["Hello", "Once upon"], **options)
    assert [c.token_ids for c in job.batch.completions] == [c.token_ids for c in alone]
    assert [c.finish_reason for c in job.batch.completions] == ["stop", "stop"]
    assert all(len(c.token_ids) == 2 for c in alone)


def _checkpoint(llama_checkpoint, tmp_path, config_eos=None, generation_config=None):
    """A copy of the tiny Llama checkpoint without generation_config.json, or with the one given, and with
    config.json's eos_token_id replaced where config_eos is given (a function of the original id). Returns the
    folder and the original id."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(llama_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    first = config["eos_token_id"]
    if config_eos is not None:
        (folder / "config.json").write_text(json.dumps(config | {"eos_token_id": config_eos(first)}))
    (folder / "generation_config.json").unlink()
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config(first)))
    return folder, first


def test_export_keeps_every_end_of_text_id_of_config_json(llama_checkpoint, tmp_path):
    folder, first = _checkpoint(llama_checkpoint, tmp_path, config_eos=lambda first: [first, OTHER])
    package = export_model(str(folder), tmp_path / "package", validate=False).path
    assert json.loads((package / "generation_config.json").read_text())["eos_token_id"] == [first, OTHER]
    model = rt.load(package)
    assert model.settings().eos_token_id == (first, OTHER)
    assert f"eos {first}, {OTHER}" in open_package(package).describe()  # what `edgelm info` prints
    assert model.generate("Hello", max_new_tokens=6, logit_bias={OTHER: 100}).finish_reason == "stop"


def test_export_keeps_the_list_of_generation_config_json(llama_checkpoint, tmp_path):
    folder, first = _checkpoint(
        llama_checkpoint, tmp_path, generation_config=lambda first: {"eos_token_id": [OTHER, first]}
    )
    package = export_model(str(folder), tmp_path / "package", validate=False).path
    assert rt.load(package).settings().eos_token_id == (OTHER, first)


@pytest.mark.parametrize(
    "config_eos, generation_config, fragment",
    [
        (lambda first: [first, 10**6], None, "config.json holds a generation setting"),
        (None, lambda first: {"eos_token_id": [first, -1]}, "generation_config.json holds a generation setting"),
        (None, lambda first: {"eos_token_id": [str(first)]}, "eos_token_id must be a token id or a list"),
        (None, lambda first: {"top_p": 7}, "top_p must be in"),
        (None, lambda first: {"temperature": 10**400}, "temperature must be a number"),
        (None, lambda first: [first], "not an object of settings"),
    ],
)
def test_export_refuses_generation_settings_the_runtime_cannot_use(
    llama_checkpoint, tmp_path, config_eos, generation_config, fragment
):
    folder, _ = _checkpoint(llama_checkpoint, tmp_path, config_eos, generation_config)
    with pytest.raises(ExportError, match=fragment):
        export_model(str(folder), tmp_path / "package", validate=False)
    assert not (tmp_path / "package").exists()  # nothing written
