"""The package's prompt cache (`edgelm export --system-prompt`): a chat that starts with the system prompt starts
from the rows stored in the package, with the same bits as a cold prefill (fp32, int8 weights, int8 KV cache);
the file is listed in the manifest, verified like every other file, and shown by `edgelm info`."""

import json
import re
import shutil

import edgelm.runtime as rt
import numpy as np
import pytest
from click.testing import CliRunner
from edgelm.export.errors import ExportError
from edgelm.export.prompt_cache import add_prompt_cache
from edgelm.runtime.batching import prefix_store
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.cli.main import main
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.errors import PackageError
from edgelm.runtime.generation_config import GenerationConfig
from server_harness import HTTP, InProcessServer

CHUNK = 16  # the tiny model has 64 positions: a system prompt of two chunks, then the user's message
SYSTEM = "Be brief, kind and exact."
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(autouse=True)
def short_passes(monkeypatch):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)  # the export and the loads prefill in chunks of 16


def with_cache(package, tmp_path, system=SYSTEM, tools=None):
    folder = tmp_path / "pkg"
    shutil.copytree(package, folder)
    return folder, add_prompt_cache(folder, system, tools)


def messages(user: str) -> list:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def greedy(model, ids, new_tokens) -> tuple[list, np.ndarray]:
    """Tokens and the logits each was picked from, [new_tokens, V]."""
    config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, eos_token_id=model.arch.eos_token_id)
    steps = [(int(t[0]), lg[0].copy()) for t, lg in id_steps(model.engine, [ids], config, model.pad_id)]
    return [t for t, _ in steps], np.stack([lg for _, lg in steps])


@pytest.mark.parametrize("package", ["tiny_package", "tiny_package_int8", "tiny_package_int8_kv8"])
def test_a_chat_with_the_system_prompt_starts_from_the_package_cache_with_the_same_bits(request, tmp_path, package):
    original = request.getfixturevalue(package)
    folder, record = with_cache(original, tmp_path)
    cold, warm = rt.load(original), rt.load(folder)
    assert cold.package.manifest.prompt_cache is None and cold.engine.prefix_cache is None  # loads as before
    assert record.tokens == record.shared_tokens > 2 * CHUNK and record.chunk == CHUNK  # the whole start
    cache, n = warm.engine.prefix_cache, record.tokens
    assert cache.stats()["pinned_tokens"] == n and cache.max_bytes == 0
    ids = warm.chat_ids(messages("Hi there"))
    assert ids == cold.chat_ids(messages("Hi there"))
    tokens, logits = greedy(cold, ids, 6)
    warm_tokens, warm_logits = greedy(warm, ids, 6)
    assert cache.reused_tokens == n  # the whole start came from the package: only the user's message is prefilled
    assert warm_tokens == tokens and np.array_equal(warm_logits, logits)  # every bit, at every step
    options = dict(max_new_tokens=5, do_sample=False)
    assert warm.chat(messages("Hello"), **options).token_ids == cold.chat(messages("Hello"), **options).token_ids
    assert "".join(warm.chat_stream(messages("Hello"), **options)) == cold.chat(messages("Hello"), **options).text
    assert cache.reused_tokens == 3 * n
    header = prefix_store.read_header(folder / record.file)
    cache_dtype = "|i1" if package.endswith("kv8") else "<f4"
    assert {dtype for dtype, _ in header["arrays"]} == {cache_dtype}  # int8 where the package's cache is int8
    # no other chat starts from it, and a chat with another system prompt gets nothing from it
    other = [{"role": "system", "content": "Answer in French, always."}, {"role": "user", "content": "Hi"}]
    assert warm.chat(other, **options).token_ids == cold.chat(other, **options).token_ids
    assert cache.reused_tokens == 3 * n and len(cache) == 0


def test_the_prefix_cache_keeps_the_package_rows_and_evicts_only_its_own(tiny_package, tmp_path):
    folder, record = with_cache(tiny_package, tmp_path)
    cold, warm = rt.load(tiny_package), rt.load(folder, prefix_cache_mb=1)
    cache = warm.engine.prefix_cache
    ids = warm.chat_ids(messages("Tell me of lighthouses"))
    assert record.tokens + CHUNK <= len(ids) <= 60  # a whole chunk after the package's: the cache keeps it
    tokens, logits = greedy(cold, ids, 4)
    warm_tokens, warm_logits = greedy(warm, ids, 4)
    assert warm_tokens == tokens and np.array_equal(warm_logits, logits)
    assert len(cache) == 1 and cache.bytes > 0  # its own block, after the pinned ones
    cache.clear()
    assert cache.stats()["pinned_tokens"] == record.tokens and cache.bytes == 0 and len(cache) == 0
    before = cache.reused_tokens
    assert greedy(warm, ids, 4)[0] == tokens and cache.reused_tokens - before == record.tokens


def test_the_server_chat_starts_from_the_package_cache(tiny_package, tmp_path):
    folder, record = with_cache(tiny_package, tmp_path)
    expected = rt.load(tiny_package).chat(messages("Hi"), max_new_tokens=5, do_sample=False).text
    server = InProcessServer(rt.load(folder))
    try:
        body = {"model": server.app.names.id, "messages": messages("Hi"), "max_tokens": 5, "temperature": 0}
        answer = HTTP.post(server.url + "/v1/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"] == expected
        stats = server.health()["prefix_cache"]
        assert stats["pinned_tokens"] == stats["reused_tokens"] == record.tokens
    finally:
        server.stop()


def test_edgelm_chat_with_the_system_prompt_starts_from_the_package_cache(tiny_package, tmp_path, monkeypatch):
    from edgelm.runtime.batching.prefix_cache import PrefixCache

    folder, record = with_cache(tiny_package, tmp_path)
    restored, restore = [], PrefixCache.restore
    monkeypatch.setattr(PrefixCache, "restore", lambda self, *a: restored.append(restore(self, *a)) or restored[-1])
    options = ["--system", SYSTEM, "--max-new-tokens", "4", "--greedy"]
    warm = CliRunner().invoke(main, ["chat", "-m", str(folder), *options], input="Hi\n")
    assert warm.exit_code == 0, warm.output
    assert restored == [record.tokens]
    cold = CliRunner().invoke(main, ["chat", "-m", str(tiny_package), *options], input="Hi\n")
    assert cold.stdout == warm.stdout and restored[1:] == [0]  # the CLI's own prefix cache, empty


def test_the_file_is_verified_as_every_package_file_is(tiny_package, tmp_path):
    folder, record = with_cache(tiny_package, tmp_path)
    path = folder / record.file
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="prompt_cache.kv does not match its sha256 in the manifest: the file was"):
        rt.load(folder, verify="full")
    with pytest.raises(PackageError, match="prompt_cache.kv is not the prompt cache of this graph") as raised:
        rt.load(folder, verify=False)  # no checksums: the file's own still refuses it
    assert "\n" not in str(raised.value)
    path.unlink()
    with pytest.raises(PackageError, match="prompt_cache.kv is missing"):
        rt.load(folder, verify=False)


def test_the_files_it_writes_are_as_readable_as_the_package_s_others(tiny_package, tmp_path):
    folder, record = with_cache(tiny_package, tmp_path)
    mode = (folder / "tokenizer.json").stat().st_mode
    assert (folder / "manifest.json").stat().st_mode == mode and (folder / record.file).stat().st_mode == mode


def test_a_cache_of_another_graph_is_refused(tiny_package, tiny_package_int8, tmp_path):
    folder, record = with_cache(tiny_package, tmp_path)
    other, _ = with_cache(tiny_package_int8, tmp_path / "other")
    manifest = json.loads((folder / "manifest.json").read_text())
    shutil.copyfile(other / record.file, folder / record.file)  # listed with its own sha256: only its header differs
    manifest["files"][record.file] = json.loads((other / "manifest.json").read_text())["files"][record.file]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="is not the prompt cache of this graph"):
        rt.load(folder)


def test_a_package_gets_another_system_prompt_in_place_of_its_own(tiny_package, tmp_path):
    from edgelm.export import add_prompt_cache as public

    folder, first = with_cache(tiny_package, tmp_path)
    other = "Answer in French, always, and briefly."
    second = public(folder, other)
    assert second.system_prompt_sha256 != first.system_prompt_sha256
    model = rt.load(folder, verify="full")
    assert model.package.manifest.prompt_cache == second
    conversation = [{"role": "system", "content": other}, {"role": "user", "content": "Hi"}]
    expected = rt.load(tiny_package).chat(conversation, max_new_tokens=4, do_sample=False).token_ids
    assert model.chat(conversation, max_new_tokens=4, do_sample=False).token_ids == expected
    assert model.engine.prefix_cache.reused_tokens == second.tokens


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, m: c.update(tokens=c["tokens"] - 1), "prompt_cache.tokens (33) must be prompt_cache.shared_tokens"),
        (lambda c, m: c.update(file="../prompt_cache.kv"), "prompt_cache.file must be a plain file name"),
        (lambda c, m: m["files"].pop(c["file"]), "files does not list 'prompt_cache.kv' (prompt_cache.file)"),
        (lambda c, m: c.update(system_prompt_sha256="x"), "prompt_cache.system_prompt_sha256 must be 64"),
        (lambda c, m: c.update(tools="get_time"), "prompt_cache.tools must be a list"),
    ],
)
def test_a_damaged_prompt_cache_section_is_refused_naming_its_field(tiny_package, tmp_path, change, message):
    folder, record = with_cache(tiny_package, tmp_path)
    assert record.tokens == 34
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest["prompt_cache"], manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=re.escape("manifest.json: " + message)):
        rt.load(folder)


@pytest.mark.parametrize("chunk", [CHUNK, 64])
def test_a_start_shorter_than_one_pass_is_stored_whole_with_the_same_bits(
    tiny_package_int8, tmp_path, monkeypatch, chunk
):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", chunk)  # 64: one pass is the tiny model's whole context
    folder, record = with_cache(tiny_package_int8, tmp_path, system="Hi")
    assert record.tokens == record.shared_tokens < CHUNK
    cold, warm = rt.load(tiny_package_int8), rt.load(folder)
    short = [{"role": "system", "content": "Hi"}, {"role": "user", "content": "What is the time in Lisbon?"}]
    ids = cold.chat_ids(short)
    tokens, logits = greedy(cold, ids, 4)
    warm_tokens, warm_logits = greedy(warm, warm.chat_ids(short), 4)
    assert warm.engine.prefix_cache.reused_tokens == record.tokens
    assert warm_tokens == tokens and np.array_equal(warm_logits, logits)


def test_a_system_prompt_that_fills_the_context_is_refused(tiny_package, tmp_path):
    with pytest.raises(ExportError, match="leaves no room for a message in the model's 64-token context"):
        with_cache(tiny_package, tmp_path, system="Be brief. " * 40)


def test_export_stores_it_and_info_shows_what_it_covers(tmp_path):
    from checkpoints import build_checkpoint

    checkpoint = tmp_path / "checkpoint"
    build_checkpoint(checkpoint, n_positions=512)  # the tools render to a start longer than the tiny model's context
    (tmp_path / "system.txt").write_text(SYSTEM)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    out = tmp_path / "out"
    files = ["--system-prompt", str(tmp_path / "system.txt"), "--tools", str(tmp_path / "tools.json")]
    result = CliRunner().invoke(main, ["export", str(checkpoint), "-o", str(out), "--no-validate", *files])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    cache = manifest["prompt_cache"]
    assert cache["file"] in manifest["files"] and cache["tools"] == ["get_time"] and cache["tokens"] == cache["shared_tokens"]
    info = CliRunner().invoke(main, ["info", str(out)])
    assert info.exit_code == 0, info.output
    line = next(line for line in info.output.splitlines() if line.startswith("  prompt cache"))
    size = manifest["files"][cache["file"]]["size"]
    assert f"{cache['tokens']:,} of the {cache['shared_tokens']:,} tokens" in line and f"{size:,} bytes" in line
    assert cache["system_prompt_sha256"][:12] in line and "tools get_time" in line
    verify = CliRunner().invoke(main, ["verify", str(out)])
    assert verify.exit_code == 0, verify.output


@pytest.mark.parametrize(
    "files, message",
    [
        ({"--tools": "[]"}, "--tools goes with --system-prompt"),
        ({"--system-prompt": "  \n"}, "is empty; --system-prompt takes the system prompt's text"),
        ({"--system-prompt": SYSTEM, "--tools": "{"}, "is not JSON"),
        ({"--system-prompt": SYSTEM, "--tools": '[{"type": "function"}]'}, "needs function.name"),
        ({"--system-prompt": b"Be brief\xff\xfe."}, "is not valid UTF-8 (byte 0xff at offset 8)"),
        ({"--system-prompt": SYSTEM, "--tools": b'[{"function": {"name": "f\xc3"}}]'}, "is not valid UTF-8"),
    ],
)
def test_bad_options_get_one_line_before_any_work(tiny_checkpoint, tmp_path, files, message):
    options = []
    for option, text in files.items():
        (tmp_path / option.strip("-")).write_bytes(text if isinstance(text, bytes) else text.encode())
        options += [option, str(tmp_path / option.strip("-"))]
    result = CliRunner().invoke(main, ["export", str(tiny_checkpoint), "-o", str(tmp_path / "out"), *options])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()
