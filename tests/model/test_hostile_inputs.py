"""Hostile inputs found by probing the whole tree, one test each: text that is not Unicode (a lone surrogate,
or a command-line argument that was not UTF-8), a negative top_logprobs, an absurd thread count, and a link
inside a package to a file its manifest does not list. Each gets one typed error line, never a traceback."""

import os
import shutil
import subprocess
import sys

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import DeviceError, GenerationOptionError, PackageError, PromptError


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.generate("a\ud800b", max_new_tokens=2),
        lambda m: list(m.stream("a\ud800b", max_new_tokens=2)),
        lambda m: m.score("a\udfffb"),
        lambda m: m.chat([{"role": "user", "content": "a\ud800b"}], max_new_tokens=2),
    ],
    ids=["generate", "stream", "score", "chat"],
)
def test_a_lone_surrogate_in_text_is_a_prompt_error(model, call):
    with pytest.raises(PromptError, match=r"lone surrogate \\ud[89a-f][0-9a-f]{2} at character"):
        call(model)


def test_a_command_line_prompt_that_is_not_utf8_gets_one_line(tiny_package):
    # Python turns an argument's undecodable bytes into lone surrogates (surrogateescape)
    result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "hi\udcff", "--max-new-tokens", "2"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "lone surrogate \\udcff" in result.output and "Traceback" not in result.output


@pytest.mark.skipif(sys.platform == "win32", reason="argv bytes are a POSIX notion")
def test_a_non_utf8_argument_in_a_real_process_gets_one_line(tiny_package):
    command = [sys.executable, "-c", "from edgelm.runtime.cli.main import main; main()", "generate"]
    done = subprocess.run(
        [*command, "-m", str(tiny_package), b"hi\xff\xfe", "--max-new-tokens", "2"], capture_output=True, timeout=120
    )
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr and b"lone surrogate" in done.stderr, done.stderr


@pytest.mark.parametrize("value", [-1, True, "3", 2.5])
def test_score_refuses_a_top_logprobs_that_is_no_count(model, value):
    with pytest.raises(GenerationOptionError, match="top_logprobs must be") as caught:
        model.score("hello there", top_logprobs=value)
    assert caught.value.param == "top_logprobs"


def test_score_top_logprobs_zero_and_more_than_the_vocabulary_still_work(model):
    assert model.score("hello there", top_logprobs=0).top_logprobs[-1] == []
    assert len(model.score("hello there", top_logprobs=10**6).top_logprobs[-1]) == model.arch.vocab_size


@pytest.mark.parametrize("threads", [100_000, 0, True])
def test_an_absurd_thread_count_is_refused_before_onnxruntime_starts_them(tiny_package, threads):
    with pytest.raises(DeviceError, match="threads must be an integer from 1 to"):
        rt.load(tiny_package, threads=threads)


def test_generate_threads_option_far_past_the_cores_gets_one_line(tiny_package):
    result = CliRunner().invoke(main, ["generate", "-m", str(tiny_package), "hi", "--threads", "100000"])
    # a usage error (exit code 2) naming --threads, in load()'s own words
    assert result.exit_code == 2 and "--threads" in result.output, result.output
    assert "threads must be an integer from 1 to" in result.output and "Traceback" not in result.output


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_a_link_inside_the_package_to_an_unlisted_file_is_refused_by_name(tiny_package, tmp_path):
    folder = shutil.copytree(tiny_package, tmp_path / "pkg")
    os.rename(folder / "tokenizer.json", folder / "other.json")
    os.symlink("other.json", folder / "tokenizer.json")
    with pytest.raises(PackageError, match="other.json is not one of the files the manifest lists"):
        rt.load(folder)


def test_a_system_message_with_keys_json_cannot_sort_still_chats(model):
    # the conversation start is remembered by a JSON digest of the system messages; keys of mixed types (the Python
    # API takes any dict) cannot be sorted: the chat goes on without remembering that start
    messages = [{"role": "system", "content": "Be brief.", 1: "x"}, {"role": "user", "content": "Hi"}]
    assert model.chat(messages, max_new_tokens=2, do_sample=False).token_ids
