"""`edgelm chat`'s commands (/help, /reset, /system, /save, /load): said to edgelm, never sent to the model; a
conversation saved in one run continues in the next; /save never writes over a file edgelm did not write."""


import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.chat_commands import HELP, load, run_command
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import PromptError


def chat(tiny_package, lines, *options):
    return CliRunner().invoke(
        main, ["chat", "-m", str(tiny_package), "--max-new-tokens", "4", *options], input="\n".join(lines) + "\n"
    )


def answers(model, turns, system=None):
    """What the chat command prints for `turns` user lines, answered in order."""
    history, printed = ([{"role": "system", "content": system}] if system else []), ""
    for line in turns:
        history.append({"role": "user", "content": line})
        text = model.chat(history, max_new_tokens=4).text.lstrip()
        history.append({"role": "assistant", "content": text.strip()})
        printed += text + "\n"
    return printed, history


def test_help_is_answered_by_edgelm_not_the_model(model, tiny_package):
    result = chat(tiny_package, ["/help", "The fox"])
    assert result.exit_code == 0, result.output
    assert HELP in result.stderr and "/save FILE" in result.stderr
    assert result.stdout == answers(model, ["The fox"])[0]  # /help reached neither the model nor the history


def test_reset_forgets_the_turns_and_keeps_the_system_message(model, tiny_package):
    result = chat(tiny_package, ["The fox", "/reset", "Time"], "--system", "Hi")
    assert result.exit_code == 0, result.output
    first = answers(model, ["The fox"], system="Hi")[0]
    assert result.stdout == first + answers(model, ["Time"], system="Hi")[0]


def test_system_sets_and_removes_the_system_message(model, tiny_package):
    result = chat(tiny_package, ["/system Be brief.", "The fox"])
    assert result.exit_code == 0 and result.stdout == answers(model, ["The fox"], system="Be brief.")[0]
    history, said = run_command("/system", [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    assert history == [{"role": "user", "content": "y"}] and said == "No system message."


def test_a_saved_conversation_continues_in_another_run(model, tiny_package, tmp_path):
    saved = tmp_path / "talk.json"
    first = chat(tiny_package, ["The fox", f"/save {saved}"], "--system", "Hi")
    assert first.exit_code == 0 and "Saved 3 messages" in first.stderr, first.output
    _, history = answers(model, ["The fox"], system="Hi")
    assert load(saved) == history
    second = chat(tiny_package, [f"/load {saved}", "Time"])
    assert second.exit_code == 0, second.output
    history.append({"role": "user", "content": "Time"})
    assert second.stdout == model.chat(history, max_new_tokens=4).text.lstrip() + "\n"


def test_save_never_writes_over_a_file_edgelm_did_not_write(tiny_package, tmp_path):
    precious = tmp_path / "config.json"
    precious.write_text('{"password": "x"}')
    result = chat(tiny_package, [f"/save {precious}"])
    assert result.exit_code == 0 and "not a conversation edgelm saved" in result.stderr
    assert precious.read_text() == '{"password": "x"}'
    link = tmp_path / "link.json"
    link.symlink_to(precious)
    with pytest.raises(PromptError, match="not a conversation"):
        run_command(f"/save {link}", [])
    assert precious.read_text() == '{"password": "x"}'


def test_a_session_in_a_folder_that_does_not_exist_is_refused_before_the_first_turn(tiny_package, tmp_path):
    result = chat(tiny_package, ["Hi"], "--session", str(tmp_path / "missing" / "chat.session"))
    assert result.exit_code == 2 and "Invalid value for --session: " in result.output, result.output
    assert "is not a folder: the file cannot be saved there." in result.output and "Traceback" not in result.output


def test_save_writes_through_no_link_prepared_beside_the_file(tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("not a conversation")
    (tmp_path / ".chat.json.partial").symlink_to(other)
    run_command(f"/save {tmp_path / 'chat.json'}", [{"role": "user", "content": "Hi"}])
    assert other.read_text() == "not a conversation"
    assert load(tmp_path / "chat.json") == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "content",
    [b"not json", b"\xff\xfe", b'{"messages": []}', b'{"edgelm_chat": 1, "messages": [{"role": "tool", "content": ""}]}',
     b'{"edgelm_chat": 1, "messages": [{"role": "user", "content": 5}]}',
     b'{"edgelm_chat": 1, "messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}',
     b"[" * 100_000],
)  # fmt: skip
def test_load_refuses_what_edgelm_did_not_save_in_one_line(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(PromptError) as caught:
        run_command(f"/load {bad}", [])
    assert "\n" not in str(caught.value)


def test_load_refuses_a_fifo_and_a_folder_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(PromptError, match="not a regular file"):
            run_command(f"/load {path}", [])


def test_load_of_a_fifo_swapped_in_after_its_check_never_blocks(tmp_path, monkeypatch):
    import os
    import signal

    from edgelm.runtime import untrusted

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # the name passes the check made before the open, as if a FIFO replaced a file right after it
    monkeypatch.setattr(untrusted, "regular", lambda *args, **kwargs: None)
    before = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("/load blocked on a FIFO"))
    signal.alarm(10)
    try:
        with pytest.raises(PromptError, match="not a regular file"):
            run_command(f"/load {fifo}", [])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_an_unknown_command_is_named_and_a_double_slash_reaches_the_model(model, tiny_package):
    result = chat(tiny_package, ["/nope", "//The fox"])
    assert result.exit_code == 0 and "unknown command /nope" in result.stderr
    assert result.stdout == answers(model, ["/The fox"])[0]
    with pytest.raises(PromptError, match="needs a file name"):
        run_command("/save", [])
