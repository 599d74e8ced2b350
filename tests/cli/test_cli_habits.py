"""Command-line habits a user brings from other tools: piped stdin is the prompt; -n above 1 needs sampling (as in
transformers, while the server keeps OpenAI's n at temperature 0); pipeline() applies the checkpoint's
task_specific_params; every option has help text; a quantized export prints its quality figures."""

import hashlib
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import click
import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime import GenerationOptionError, PackageError
from edgelm.runtime.cli.main import main

EDGELM = Path(sys.executable).parent / "edgelm"
GREEDY_N = "Greedy methods without beam search do not support `num_return_sequences` different than 1 (got 3)"


def run(*args, **options) -> subprocess.CompletedProcess:
    return subprocess.run([EDGELM, *map(str, args)], capture_output=True, text=True, timeout=120, **options)


# --- stdin -------------------------------------------------------------------------------------------------


def test_piped_stdin_is_the_prompt(tiny_package, model):
    expected = model.generate("Once upon a time", max_new_tokens=6).text + "\n"
    piped = run("generate", "-m", tiny_package, "--max-new-tokens", 6, input="Once upon a time\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == expected
    # The same command in-process (CliRunner's stdin is a pipe too): '-' still reads it; an argument wins over it.
    dash = CliRunner().invoke(
        main, ["generate", "-m", str(tiny_package), "-", "--max-new-tokens", "6"], input="Once upon a time\n"
    )
    assert dash.exit_code == 0 and dash.stdout == expected, dash.output
    given = CliRunner().invoke(
        main, ["generate", "-m", str(tiny_package), "Once upon a time", "--max-new-tokens", "6"], input="ignored\n"
    )
    assert given.exit_code == 0 and given.stdout == expected, given.output


def test_a_terminal_without_a_prompt_is_a_usage_error_not_a_wait(tiny_package):
    controller, terminal = pty.openpty()
    try:
        done = run("generate", "-m", tiny_package, stdin=terminal)  # the timeout fails the test if it waits
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 2, done.stderr
    assert "no prompt" in done.stderr and "echo Hello | edgelm generate" in done.stderr
    assert "Traceback" not in done.stderr


def test_empty_quotes_still_ask_for_unconditional_text(tiny_package, model):
    result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "", "--max-new-tokens", "4"])
    assert result.exit_code == 0 and result.stdout == model.generate("", max_new_tokens=4).text + "\n"


# --- num_return_sequences without sampling ---------------------------------------------------------------------


def test_several_greedy_sequences_are_refused_as_transformers_does(tiny_package, model):
    with pytest.raises(GenerationOptionError, match="Greedy methods without beam search") as raised:
        model.generate("Hi", max_new_tokens=3, num_return_sequences=3)
    assert raised.value.param == "num_return_sequences" and GREEDY_N in str(raised.value)
    with pytest.raises(GenerationOptionError, match="Greedy methods"):
        model.settings(num_return_sequences=2)
    result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "Hi", "-n", "3"])
    assert result.exit_code == 1 and GREEDY_N in result.output and "--do-sample" in result.output
    sampled = model.generate("Hi", max_new_tokens=3, num_return_sequences=3, do_sample=True, seed=1)
    assert len(sampled) == 3
    for args in (["--do-sample"], ["--temperature", "0.8"], ["--top-p", "0.9"]):  # a sampling option samples
        result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "Hi", "-n", "3", *args])
        assert result.exit_code == 0 and result.stdout.count("\n---\n") == 2, (args, result.output)


def test_the_server_keeps_openais_n_at_temperature_zero(model):
    from edgelm.runtime.server.api.requests import Limits, ModelNames, parse_completion_request

    request = parse_completion_request(
        {"prompt": "Hi", "n": 3, "temperature": 0, "max_tokens": 4}, ModelNames("m"), model.arch.vocab_size, Limits()
    )
    rows = model.generate("Hi", model.settings(**request.options))
    assert len(rows) == 3 and rows[0].token_ids == rows[1].token_ids == rows[2].token_ids
    assert rows[0].token_ids == model.generate("Hi", max_new_tokens=4).token_ids


# --- pipeline() and task_specific_params -----------------------------------------------------------------


@pytest.fixture(scope="module")
def task_package(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint with distilgpt2's kind of task_specific_params (a shorter max_length), exported."""
    from edgelm.export.stages import export_model

    checkpoint = tmp_path_factory.mktemp("ckpt") / "tiny-task"
    shutil.copytree(tiny_checkpoint, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["task_specific_params"] = {"text-generation": {"do_sample": True, "max_length": 12, "prefix": "x"}}
    (checkpoint / "config.json").write_text(json.dumps(config))
    return export_model(str(checkpoint), tmp_path_factory.mktemp("pkg") / "tiny-task", validate=False).path


def test_pipeline_applies_the_checkpoints_task_params(task_package):
    model = rt.load(task_package)
    generator = rt.pipeline("text-generation", model=model)
    prompt = "The quick brown"
    room = 12 - len(model.encode(prompt))  # max_length counts the prompt, as in transformers
    sampled = model.generate(prompt, do_sample=True, max_new_tokens=room, seed=5, ignore_eos=True)
    assert generator(prompt, seed=5, ignore_eos=True) == [{"generated_text": prompt + sampled.text}]
    assert generator(prompt, seed=5, do_sample=False, max_new_tokens=3, return_full_text=False) == [
        {"generated_text": model.generate(prompt, max_new_tokens=3).text}  # the call's options win
    ]
    length = len(model.encode(prompt))
    five = generator(prompt, max_length=length + 4, num_return_sequences=5, seed=2)  # the tutorial's call
    rows = model.generate(prompt, do_sample=True, max_new_tokens=4, num_return_sequences=5, seed=2)
    assert five == [{"generated_text": prompt + row.text} for row in rows]
    with pytest.raises(GenerationOptionError, match=f"Input length of input_ids is {length}, but `max_length` is set"):
        generator(prompt, max_length=length)
    with pytest.raises(GenerationOptionError, match="max_length must be an integer"):
        generator(prompt, max_length="10")


def test_pipeline_without_task_params_keeps_the_package_defaults(tiny_package, model):
    generator = rt.pipeline(model=model)
    assert generator("Hi") == [{"generated_text": "Hi" + model.generate("Hi").text}]  # greedy, the package's length
    with pytest.raises(GenerationOptionError, match="Greedy methods"):
        generator("Hi", num_return_sequences=5)


def test_task_params_are_read_only_from_a_listed_config(task_package, tmp_path):
    unlisted = tmp_path / "unlisted"
    shutil.copytree(task_package, unlisted)
    manifest = json.loads((unlisted / "manifest.json").read_text())
    del manifest["files"]["config.json"]  # config.json stays in the folder, but the manifest no longer lists it
    (unlisted / "manifest.json").write_text(json.dumps(manifest))
    model = rt.load(unlisted)
    assert rt.pipeline(model=model)("Hi") == [{"generated_text": "Hi" + model.generate("Hi").text}]


def test_unusable_task_params_are_one_clear_error(task_package, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(task_package, broken)
    config = json.loads((broken / "config.json").read_text())
    config["task_specific_params"]["text-generation"]["do_sample"] = "yes"
    data = json.dumps(config).encode()
    (broken / "config.json").write_bytes(data)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["files"]["config.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=r"config.json: task_specific_params\['text-generation'\] .*do_sample"):
        rt.pipeline(model=rt.load(broken))


# --- help text and the export's report ---------------------------------------------------------------------


def test_every_option_of_every_command_has_help_text():
    missing = []
    for name in main.list_commands(None):
        command = main.get_command(None, name)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip():
                missing.append(f"edgelm {name} {param.opts[0]}")
    assert missing == []


def test_a_quantized_export_prints_its_quality_figures(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(
        main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "q8"), "--quantize", "int8"]
    )
    assert result.exit_code == 0, result.output
    for stage in ("load", "export", "optimize", "quantize", "validate", "save"):  # a line of progress per stage
        assert any(line.startswith(f"✓ {stage} ") for line in result.stderr.splitlines()), result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("  eval text     persuasion-chapters-1-4.txt") for line in lines), result.stdout
    quality = [line.split()[0] for line in lines[lines.index(next(x for x in lines if "int8 quality" in x)) + 1 :]]
    assert quality[:5] == ["mean", "top-1", "cache", "greedy", "perplexity"], result.stdout
