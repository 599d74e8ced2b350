"""Model.chat / chat_stream, `edgelm chat` (piped and at a terminal), and `edgelm export --chat-template`."""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.chat import _answer, fit_history
from edgelm.runtime.cli.main import main
from edgelm.runtime.text.chat_template import DEFAULT_STOP

EDGELM = Path(sys.executable).parent / "edgelm"
TERSE = (  # a ChatML-like template short enough for the tiny model's 64-token context
    "{% for message in messages %}{{ message['role'][0] + ': ' + message['content'] + ' ##\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def terse_package(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint exported through `edgelm export --chat-template FILE`."""
    template = tmp_path_factory.mktemp("template") / "terse.jinja"
    template.write_text(TERSE)
    output = tmp_path_factory.mktemp("pkg") / "tiny-terse"
    result = CliRunner().invoke(
        main,
        [
            "export",
            str(tiny_checkpoint),
            "-o",
            str(output),
            "--chat-template",
            str(template),
            "--force",
            "--no-validate",
        ],
    )
    assert result.exit_code == 0, result.output
    return output


def test_chat_is_generate_on_the_rendered_prompt_with_the_template_stop(model):
    prompt = model.chat_template.render(MESSAGES)
    assert prompt == "System: You are terse.\nUser: The quick brown fox\nAssistant:"
    for options in ({"max_new_tokens": 12}, {"max_new_tokens": 12, "do_sample": True, "seed": 5, "stop": ["x"]}):
        expected = model.generate(prompt, **{**options, "stop": [*options.get("stop", []), *DEFAULT_STOP]})
        reply = model.chat(MESSAGES, **options)
        assert (reply.text, reply.token_ids, reply.finish_reason) == (
            expected.text,
            expected.token_ids,
            expected.finish_reason,
        )
        stream = model.chat_stream(MESSAGES, **options)
        assert "".join(stream) == expected.text and stream.completion.token_ids == expected.token_ids


def test_chat_takes_a_config_and_several_sequences(model):
    config = model.settings(max_new_tokens=6, do_sample=True, seed=1, num_return_sequences=2)
    replies = model.chat(MESSAGES, config)
    assert len(replies) == 2 and replies == model.chat(MESSAGES, config)
    assert model.chat_batch(MESSAGES, config).config.stop == DEFAULT_STOP
    with pytest.raises(rt.GenerationOptionError, match="chat_batch"):
        model.chat_stream(MESSAGES, config)
    with pytest.raises(rt.GenerationOptionError, match="not both"):
        model.chat(MESSAGES, config, max_new_tokens=3)


def test_chat_refuses_bad_messages_with_the_field_named(model):
    with pytest.raises(rt.ChatError, match=r"messages\[1\]\.role must be one of") as caught:
        model.chat([MESSAGES[0], {"role": "wizard", "content": "Hi"}])
    assert caught.value.param == "messages[1].role"


def test_export_chat_template_reaches_transformers_and_the_runtime(terse_package):
    from transformers import AutoTokenizer

    config = json.loads((terse_package / "tokenizer_config.json").read_text())
    assert config["chat_template"] == TERSE and config["eos_token"] == "<|endoftext|>"  # the rest is kept
    loaded = rt.load(terse_package)
    reference = AutoTokenizer.from_pretrained(terse_package)
    assert loaded.chat_template.render(MESSAGES) == reference.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert loaded.chat_template.stop == ("##",)
    reply = loaded.chat(MESSAGES, max_new_tokens=6)
    assert reply.text == loaded.generate(loaded.chat_template.render(MESSAGES), max_new_tokens=6, stop=["##"]).text


def test_export_refuses_a_bad_chat_template_before_the_slow_stages(tiny_checkpoint, tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}")
    result = CliRunner().invoke(
        main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out"), "--chat-template", str(template)]
    )
    assert result.exit_code == 1 and "not a valid Jinja template" in result.output
    assert not (tmp_path / "out").exists()


def _copy(checkpoint, folder):
    folder.mkdir()
    for f in checkpoint.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def test_a_checkpoints_chat_template_jinja_goes_into_the_package(tiny_checkpoint, tmp_path):
    """transformers saves a template as chat_template.jinja beside tokenizer_config.json; the package keeps it."""
    from edgelm.export.stages import export_model

    folder = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (folder / "chat_template.jinja").write_text(TERSE)
    package = export_model(str(folder), tmp_path / "pkg", validate=False).path
    assert json.loads((package / "tokenizer_config.json").read_text())["chat_template"] == TERSE
    assert rt.load(package).chat_template.render(MESSAGES[1:]) == "u: The quick brown fox ##\na:"


def test_a_non_string_template_fails_at_chat_time_not_at_load(tiny_checkpoint, tmp_path):
    from edgelm.export.stages import export_model

    folder = _copy(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": {"oops": 1}}))
    package = export_model(str(folder), tmp_path / "pkg", validate=False).path
    loaded = rt.load(package)  # loads and generates as before
    assert loaded.generate("Hi", max_new_tokens=2).completion_tokens >= 1
    with pytest.raises(rt.ChatError, match="is a dict, not a string.*--chat-template"):
        loaded.chat(MESSAGES)
    result = CliRunner().invoke(main, ["chat", "-m", str(package)], input="Hi\n")
    assert result.exit_code == 1 and "is a dict, not a string" in result.output and "Traceback" not in result.output


def test_chat_command_keeps_the_history(model, tiny_package):
    lines = ["The fox", "", "Time"]
    result = CliRunner().invoke(
        main, ["chat", "-m", str(tiny_package), "--max-new-tokens", "4", "--system", "Hi"], input="\n".join(lines)
    )
    assert result.exit_code == 0 and result.stderr == "", result.output
    history, expected = [{"role": "system", "content": "Hi"}], ""
    for line in (lines[0], lines[2]):
        history.append({"role": "user", "content": line})
        text = model.chat(history, max_new_tokens=4).text.lstrip()
        history.append({"role": "assistant", "content": text.strip()})
        expected += text + "\n"
    assert result.stdout == expected


def test_chat_command_drops_the_oldest_turns_and_says_so_once(model, tiny_package):
    lines = ["The quick brown fox jumps over the lazy dog."] * 6
    result = CliRunner().invoke(
        main, ["chat", "-m", str(tiny_package), "--max-new-tokens", "8", "--system", "S"], input="\n".join(lines)
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count("no longer fit the model's 64-token context") == 1
    assert len(result.stdout.splitlines()) == 6


def test_fit_history_keeps_the_system_message_and_the_last_question(model):
    config = model.settings(max_new_tokens=8)
    turn = [{"role": "user", "content": "The quick brown fox"}, {"role": "assistant", "content": "jumps over it"}]
    messages = [{"role": "system", "content": "S"}, *turn * 4, {"role": "user", "content": "Last?"}]
    kept, dropped = fit_history(model, messages, config)
    assert kept[0]["role"] == "system" and kept[-1]["content"] == "Last?" and dropped > 0 and dropped % 2 == 0
    assert len(model.encode(model.chat_template.render(kept))) <= 64 - 8
    with pytest.raises(rt.PromptError, match="Send a shorter message or lower --max-new-tokens"):
        fit_history(model, [{"role": "user", "content": "The quick brown fox " * 20}], config)


def test_ctrl_c_during_an_answer_keeps_what_was_printed(capsys):
    class Interrupted:
        closed = False

        def __iter__(self):
            yield " Hello"
            yield ", wor"
            raise KeyboardInterrupt

        def close(self):
            self.closed = True

    stream = Interrupted()
    model = type("FakeModel", (), {"chat_stream": lambda self, history, config: stream})()
    assert _answer(model, [], None) == "Hello, wor"
    assert stream.closed and capsys.readouterr().out == "Hello, wor\n"


def test_chat_command_refuses_non_utf8_stdin(tiny_package):
    result = CliRunner().invoke(main, ["chat", "-m", str(tiny_package)], input=b"caf\xe9\n")
    assert result.exit_code == 1 and "line 1 of stdin is not valid UTF-8" in result.output


@pytest.mark.parametrize("key", [b"\x04", "sigint"])
def test_ctrl_d_or_ctrl_c_at_the_prompt_exits_cleanly(tiny_package, key):
    """At a terminal: answer one message, then Ctrl-D (or Ctrl-C) at the prompt ends with code 0, no traceback."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [EDGELM, "chat", "-m", tiny_package, "--max-new-tokens", "4"],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    os.close(terminal)
    try:
        _read_until(process.stdout, b"> ")
        os.write(controller, b"The quick brown fox\n")
        _read_until(process.stdout, b"> ")  # the answer, then the next prompt
        if key == "sigint":
            # A signal landing between input()'s prompt and its read() is only seen at the next one (CPython
            # checks for signals when a read is interrupted): it is sent once the read has likely begun, and again
            # if the process is still there 5 s later (sooner, it could land in the exit, where it kills).
            time.sleep(0.5)
            for _ in range(12):
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    pass
        else:
            os.write(controller, key)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
    stderr = process.stderr.read()
    assert code == 0, stderr
    assert b"Traceback" not in stderr and b"Chatting with" in stderr


def _read_until(pipe, marker: bytes, timeout: float = 120) -> bytes:
    seen = b""
    while not seen.endswith(marker):
        ready, _, _ = select.select([pipe], [], [], timeout)
        assert ready, f"no {marker!r} within {timeout} s; got {seen!r}"
        chunk = os.read(pipe.fileno(), 1)
        assert chunk, f"the process ended; got {seen!r}"
        seen += chunk
    return seen


def test_chat_runs_without_torch(model, tiny_package):
    from torch_blocker import run_blocked

    done = run_blocked(
        """
        import sys
        import edgelm.runtime as rt

        print(rt.load(sys.argv[1]).chat([{"role": "user", "content": "The fox"}], max_new_tokens=5).text, end="")
        """,
        tiny_package,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == model.chat([{"role": "user", "content": "The fox"}], max_new_tokens=5).text
