"""A conversation saved with its key/value cache (Model.save_session, `edgelm chat --session`) and restored in a
later process goes on as an uninterrupted one, without computing its saved prefix again; a file of another package,
altered, truncated, too large or not a regular file is refused in one line, never a hang."""

import json
import os
import subprocess
import sys

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.batching.prefix_store import MAGIC
from edgelm.runtime.cli.main import main
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.errors import SessionError

CHUNK = 16  # the tiny model has 64 positions: a first turn of two whole chunks and a rest
FIRST = [{"role": "user", "content": "The quick brown fox"}]
NEXT = {"role": "user", "content": "jumps over"}
GREEDY = {"max_new_tokens": 4, "do_sample": False}

RESUME = """
import json, sys
import edgelm.runtime as rt
from edgelm.runtime.engine import decode
decode.PREFILL_CHUNK = 16
model = rt.load(sys.argv[1], verify=False)
saved = model.load_session(sys.argv[2])
reply = model.chat([*saved.messages, json.loads(sys.argv[3])], max_new_tokens=4, do_sample=False)
print(json.dumps({"tokens": list(reply.token_ids), "cached": saved.cached_tokens,
                  "reused": model.engine.prefix_cache.reused_tokens}))
"""


@pytest.fixture
def chunked(monkeypatch):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)


def conversation(model) -> list:
    """FIRST and the model's greedy reply to it."""
    return [*FIRST, {"role": "assistant", "content": model.chat(FIRST, **GREEDY).text}]


@pytest.mark.parametrize("package", ["tiny_package", "tiny_package_int8", "tiny_package_int8_kv8"])
def test_a_session_restored_in_a_new_process_answers_as_the_uninterrupted_conversation(request, tmp_path, package):
    folder = request.getfixturevalue(package)
    request.getfixturevalue("chunked")
    model = rt.load(folder, verify=False)
    messages = conversation(model)
    uninterrupted = model.chat([*messages, NEXT], **GREEDY).token_ids
    saved = model.save_session(tmp_path / "chat.session", messages)
    assert saved.cached_tokens >= 2 * CHUNK and saved.cached_tokens % CHUNK == 0 and saved.messages == messages
    done = subprocess.run([sys.executable, "-c", RESUME, str(folder), str(tmp_path / "chat.session"), json.dumps(NEXT)],
                          check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = json.loads(done.stdout)
    assert resumed["cached"] == saved.cached_tokens and resumed["reused"] == saved.cached_tokens  # no prefill of it
    assert resumed["tokens"] == list(uninterrupted)


def test_a_session_of_token_ids_seeds_generate_and_a_model_without_a_prefix_cache_gets_one(
    tiny_package, tmp_path, chunked
):
    ids = rt.load(tiny_package, verify=False).encode("The quick brown fox jumps over the lazy dog. " * 3)[:40]
    cold = rt.load(tiny_package, verify=False).generate([ids], **GREEDY)[0].token_ids
    rt.load(tiny_package, verify=False).save_session(tmp_path / "ids.session", ids)
    model = rt.load(tiny_package, verify=False)
    assert model.engine.prefix_cache is None
    saved = model.load_session(tmp_path / "ids.session")
    assert saved.messages is None and saved.token_ids == ids and saved.cached_tokens == 2 * CHUNK
    assert model.generate([ids], **GREEDY)[0].token_ids == cold
    assert model.engine.prefix_cache.reused_tokens == 2 * CHUNK


def test_where_the_cache_is_not_written_in_place_the_file_holds_the_conversation_alone(
    tiny_package, tmp_path, monkeypatch
):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)
    model = rt.load(tiny_package, verify=False)
    messages = conversation(model)
    with monkeypatch.context() as growing:  # as on CUDA: each pass's present becomes the next past
        growing.setattr(engine.Engine, "writes_cache_in_place", property(lambda self: False))
        assert model.save_session(tmp_path / "chat.session", messages).cached_tokens == 0
    resumed = rt.load(tiny_package, verify=False)
    saved = resumed.load_session(tmp_path / "chat.session")
    assert saved.messages == messages and saved.cached_tokens == 0 and resumed.engine.prefix_cache is None
    assert resumed.chat([*messages, NEXT], **GREEDY).token_ids == model.chat([*messages, NEXT], **GREEDY).token_ids


@pytest.fixture
def saved(tiny_package, tmp_path, chunked):
    model = rt.load(tiny_package, verify=False)
    path = tmp_path / "chat.session"
    model.save_session(path, conversation(model))
    return model, path


def test_a_changed_byte_anywhere_is_refused_as_altered(saved):
    model, path = saved
    data = path.read_bytes()
    header_end = data.index(b"\n", len(MAGIC))
    digit = data.index(b'"tokens":[', len(MAGIC)) + len(b'"tokens":[')  # a token id: the header still parses
    for at in (len(data) - 1, digit):
        changed = bytearray(data)
        changed[at] = (
            ord("1") if at == digit and data[at] != ord("1") else (data[at] ^ 1 if at > header_end else ord("2"))
        )
        path.write_bytes(bytes(changed))
        with pytest.raises(SessionError, match="was altered"):
            model.load_session(path)


def test_a_truncated_or_extended_file_is_refused(saved):
    model, path = saved
    data = path.read_bytes()
    for damaged in (data[:-4], data + b"\0"):
        path.write_bytes(damaged)
        with pytest.raises(SessionError, match="is truncated or has bytes added"):
            model.load_session(path)
    path.write_bytes(data[: len(MAGIC) + 5])
    with pytest.raises(SessionError, match="header cannot be read"):
        model.load_session(path)


def test_a_session_of_another_package_is_refused_in_one_line(saved, tiny_package_int8):
    _, path = saved
    with pytest.raises(SessionError, match="saved with another package") as refused:
        rt.load(tiny_package_int8, verify=False).load_session(path)
    assert "\n" not in str(refused.value)


def test_a_fifo_a_device_a_folder_and_an_oversized_file_are_refused_without_reading_them(saved, tmp_path):
    model, _ = saved
    os.mkfifo(tmp_path / "fifo")  # no writer: an open or a read that waits would hang the test
    for target, kind in ((tmp_path / "fifo", "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a folder")):
        with pytest.raises(SessionError, match=f"is not a regular file \\(it is {kind}\\)"):
            model.load_session(target)
    with open(tmp_path / "big.session", "wb") as big:
        big.write(MAGIC)
        big.truncate(64 << 20)  # past what a session of this model's context may hold
    with pytest.raises(SessionError, match="is larger than a saved session may be"):
        model.load_session(tmp_path / "big.session")


def test_save_replaces_a_session_atomically_and_refuses_any_other_file(saved, tmp_path):
    model, path = saved
    longer = [*model.load_session(path).messages, NEXT]
    model.save_session(path, longer)
    assert model.load_session(path).messages == longer
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(SessionError, match="holds something other than a saved session"):
        model.save_session(notes, longer)
    assert notes.read_text() == "mine"
    for bad in ([], "hello", [{"role": "user", "content": "x"}, 3]):
        with pytest.raises(SessionError, match="save_session takes a conversation"):
            model.save_session(tmp_path / "bad.session", bad)
    for method, arguments in ((model.save_session, ("", longer)), (model.load_session, ("",))):
        with pytest.raises(SessionError, match="a session's path is empty: name the file"):
            method(*arguments)


def test_chat_session_resumes_across_two_runs_and_refuses_another_package(
    tiny_package, tiny_package_int8, tmp_path, chunked
):
    path = tmp_path / "chat.session"
    command = ["chat", "-m", str(tiny_package), "--no-verify", "--max-new-tokens", "4", "--session", str(path)]
    first = CliRunner().invoke(main, command, input="The quick brown fox\n")
    assert first.exit_code == 0, first.output
    model = rt.load(tiny_package, verify=False)
    after_one = model.load_session(path)
    assert [m["role"] for m in after_one.messages] == ["user", "assistant"] and after_one.cached_tokens >= CHUNK
    second = CliRunner().invoke(main, command, input="jumps over\n")
    assert second.exit_code == 0, second.output
    after_two = model.load_session(path).messages
    assert after_two[:2] == after_one.messages and [m["role"] for m in after_two[2:]] == ["user", "assistant"]
    expected = model.chat([*after_one.messages, {"role": "user", "content": "jumps over"}], **GREEDY).text.strip()
    assert after_two[3]["content"] == expected  # the answer the uninterrupted conversation gives
    other = CliRunner().invoke(main, [*command[:2], str(tiny_package_int8), *command[3:]], input="Hi\n")
    assert other.exit_code == 1 and "saved with another package" in other.output
    assert len(other.output.strip().splitlines()) == 1
    with_system = CliRunner().invoke(main, [*command, "--system", "Be brief."], input="Hi\n")
    assert with_system.exit_code == 1 and "drop --system" in with_system.output


def test_a_session_restores_into_a_model_whose_package_has_a_prompt_cache(tiny_package, tmp_path, chunked):
    """A package's prompt cache gives a model a prefix cache of no bytes of its own (only the pinned rows):
    a restored session's rows still find room in it, and the package's rows stay."""
    import shutil

    from edgelm.export import add_prompt_cache

    folder = tmp_path / "pkg"
    shutil.copytree(tiny_package, folder)
    add_prompt_cache(folder, "Be brief, kind and exact.", None)
    writer = rt.load(folder, verify=False)
    messages = [{"role": "system", "content": "Be brief, kind and exact."}, {"role": "user", "content": "The quick brown fox ran far"}]
    uninterrupted = writer.chat(messages, **GREEDY).token_ids
    saved = writer.save_session(tmp_path / "chat.session", messages)

    reader = rt.load(folder, verify=False)
    pinned = reader.engine.prefix_cache.stats()["pinned_tokens"]
    assert pinned > 0 and reader.engine.prefix_cache.max_bytes == 0
    restored = reader.load_session(tmp_path / "chat.session")
    assert restored.cached_tokens == saved.cached_tokens > pinned
    before = reader.engine.prefix_cache.reused_tokens
    assert reader.chat(restored.messages, **GREEDY).token_ids == uninterrupted
    assert reader.engine.prefix_cache.reused_tokens - before == saved.cached_tokens
    assert reader.engine.prefix_cache.stats()["pinned_tokens"] == pinned
