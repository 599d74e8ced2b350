"""The prefix cache on disk (load(..., prefix_cache_dir=DIR), edgelm serve --prefix-cache-dir): a prompt seen by
one process skips its prefill in the next, with the same output; a block file that is not exactly the block asked
for (another package's, tampered, truncated, a FIFO) is a miss, never an error or a hang; the folder stays
within its bound."""

import json
import os
import subprocess
import sys

import edgelm.runtime as rt
import numpy as np
import pytest
from edgelm.runtime.batching.prefix_store import MAGIC, PrefixStore
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.errors import GenerationOptionError

CHUNK = 16  # the tiny model has 64 positions: prompts of two and three chunks
PROMPT = np.random.default_rng(0).integers(0, 300, 40).tolist()  # two whole chunks and a rest

RUN = """
import json, sys
import edgelm.runtime as rt
from edgelm.runtime.engine import decode
decode.PREFILL_CHUNK = 16
model = rt.load(sys.argv[1], verify=False, prefix_cache_mb=1, prefix_cache_dir=sys.argv[2])
done = model.generate([json.loads(sys.argv[3])], max_new_tokens=6, do_sample=False)[0]
print(json.dumps({"tokens": list(done.token_ids), "reused": model.engine.prefix_cache.reused_tokens}))
"""


def in_a_process(package, folder, prompt=PROMPT) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, str(package), str(folder), json.dumps(prompt)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture
def chunked(monkeypatch):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)


def warm(package, folder, **options):
    return rt.load(package, verify=False, prefix_cache_mb=1, prefix_cache_dir=folder, **options)


@pytest.mark.parametrize("package", ["tiny_package", "tiny_package_int8"])
def test_a_restarted_process_skips_the_prefill_it_did_before_and_answers_the_same(request, tmp_path, package):
    folder = request.getfixturevalue(package)
    cold = rt.load(folder, verify=False).generate([PROMPT], max_new_tokens=6, do_sample=False)[0].token_ids
    first = in_a_process(folder, tmp_path / "cache")
    assert first["reused"] == 0 and len(list((tmp_path / "cache").glob("*.kv"))) == 2  # two whole chunks
    second = in_a_process(folder, tmp_path / "cache")
    assert second["reused"] == 2 * CHUNK
    assert first["tokens"] == second["tokens"] == list(cold)


def test_a_block_file_that_is_not_exactly_the_block_is_a_miss_and_removed(tiny_package, tmp_path, chunked):
    cache = tmp_path / "cache"
    warm(tiny_package, cache).generate([PROMPT], max_new_tokens=2, do_sample=False)
    files = sorted(cache.glob("*.kv"))
    expected = rt.load(tiny_package, verify=False).generate([PROMPT], max_new_tokens=6, do_sample=False)[0].token_ids
    for damage in ("flip", "truncate", "header", "fifo"):
        warm(tiny_package, cache).generate([PROMPT], max_new_tokens=2, do_sample=False)  # both blocks written
        target = max(cache.glob("*.kv"), key=lambda p: p.read_bytes()[len(MAGIC) :].split(b"\n")[0].count(b","))
        data = target.read_bytes()
        target.unlink()
        if damage == "flip":
            target.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        elif damage == "truncate":
            target.write_bytes(data[:-4])
        elif damage == "header":  # another package's block, renamed to this one's name
            header, payload = data[len(MAGIC) :].split(b"\n", 1)
            other = json.loads(header) | {"package": "0" * 64}
            target.write_bytes(MAGIC + json.dumps(other).encode() + b"\n" + payload)
        else:
            os.mkfifo(target)
        model = warm(tiny_package, cache)
        assert model.generate([PROMPT], max_new_tokens=6, do_sample=False)[0].token_ids == expected, damage
        assert model.engine.prefix_cache.reused_tokens == CHUNK, damage  # the first block only
    assert len(files) == 2


def test_another_package_never_reads_the_blocks(tiny_package, tiny_package_int8, tmp_path, chunked):
    cache = tmp_path / "cache"
    warm(tiny_package, cache).generate([PROMPT], max_new_tokens=2, do_sample=False)
    other = warm(tiny_package_int8, cache)
    other.generate([PROMPT], max_new_tokens=2, do_sample=False)
    assert other.engine.prefix_cache.reused_tokens == 0
    assert len(list(cache.glob("*.kv"))) == 4  # each package's own two blocks


def test_the_folder_stays_within_its_bound_least_recently_used_out(tmp_path):
    rows = (np.ones((2, 16, 8), np.float32), np.ones((2, 16, 8), np.float32))
    store = PrefixStore(tmp_path, "p" * 64, 16, 3 * 2100)  # room for about three blocks of ~2.1 KB
    for start in range(6):
        store.save(list(range(start, start + 16)), 0, rows)
    sizes = [p.stat().st_size for p in tmp_path.glob("*.kv")]
    assert len(sizes) == 2 and sum(sizes) <= 3 * 2100
    assert store.load(list(range(5, 21)), 0, list(rows)) is not None  # the newest stays
    assert store.load(list(range(0, 16)), 0, list(rows)) is None  # the oldest went first
    assert not list(tmp_path.glob(".*partial"))


def test_two_stores_on_one_folder_write_and_read_the_same_block(tmp_path):
    rows = (np.arange(256, dtype=np.float32).reshape(2, 16, 8),)
    a, b = PrefixStore(tmp_path, "p" * 64, 16, 1 << 20), PrefixStore(tmp_path, "p" * 64, 16, 1 << 20)
    a.save(list(range(16)), 0, rows)
    b.save(list(range(16)), 0, rows)  # already there: left as it is
    (loaded,) = b.load(list(range(16)), 0, list(rows))
    assert np.array_equal(loaded, rows[0]) and len(list(tmp_path.glob("*.kv"))) == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"prefix_cache_dir": "x"}, "give prefix_cache_mb > 0"),
        ({"prefix_cache_dir": "x", "prefix_cache_mb": 1, "prefix_cache_disk_mb": 0}, "prefix_cache_disk_mb"),
        ({"prefix_cache_dir": "", "prefix_cache_mb": 1}, "prefix_cache_dir"),
    ],
)
def test_bad_options_are_refused_by_name(tiny_package, tmp_path, options, message):
    with pytest.raises(GenerationOptionError, match=message):
        rt.load(tiny_package, verify=False, **options)


def test_a_file_in_place_of_the_folder_is_refused_in_one_line(tiny_package, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(GenerationOptionError, match="cannot use it as a folder"):
        rt.load(tiny_package, verify=False, prefix_cache_mb=1, prefix_cache_dir=tmp_path / "file")


def chat_logits(model, messages, new_tokens=4) -> tuple[list, np.ndarray]:
    from edgelm.runtime.batching.step import id_steps
    from edgelm.runtime.generation_config import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, eos_token_id=model.arch.eos_token_id)
    steps = [(int(t[0]), lg[0].copy()) for t, lg in id_steps(model.engine, [model.chat_ids(messages)], config, 0)]
    return [t for t, _ in steps], np.stack([lg for _, lg in steps])


@pytest.mark.parametrize("package", ["tiny_package", "tiny_package_int8"])
def test_a_restart_reads_the_whole_conversation_start_at_load_and_answers_with_the_same_bits(
    request, tmp_path, chunked, package
):
    folder, cache = request.getfixturevalue(package), tmp_path / "cache"
    system = {"role": "system", "content": "Be brief, kind and exact."}
    first = [system, {"role": "user", "content": "Hi"}]
    second = [system, {"role": "user", "content": "Where is Lisbon?"}]
    cold = rt.load(folder, verify=False)
    start = len(cold.conversation_start(first))
    assert start % CHUNK and start > CHUNK  # the start ends inside a pass: kept whole all the same
    warm(folder, cache).chat(first, max_new_tokens=2, do_sample=False)  # an earlier process fills the folder
    restarted = warm(folder, cache)
    stats = restarted.engine.prefix_cache.stats()
    assert stats["blocks"] == start // CHUNK + 1  # read at load: its whole passes and the one ending at the start
    for file in cache.glob("*.kv"):  # the request reads nothing from the folder
        file.unlink()
    tokens, logits = chat_logits(cold, second)
    warm_tokens, warm_logits = chat_logits(restarted, second)
    assert restarted.engine.prefix_cache.reused_tokens == start
    assert warm_tokens == tokens and np.array_equal(warm_logits, logits)  # every bit, at every step


def test_preload_stays_within_the_memory_bound_and_skips_other_files(tiny_package, tmp_path, chunked):
    cache = tmp_path / "cache"
    warm(tiny_package, cache).generate([PROMPT], max_new_tokens=2, do_sample=False)
    (cache / "note.kv").write_bytes(b"not a block")
    model = rt.load(tiny_package, verify=False, prefix_cache_mb=1, prefix_cache_dir=cache)
    assert model.engine.prefix_cache.stats()["blocks"] == 2
    block = model.engine.prefix_cache.bytes // 2
    small = rt.load(tiny_package, verify=False, prefix_cache_mb=1.5 * block / (1 << 20), prefix_cache_dir=cache)
    stats = small.engine.prefix_cache.stats()
    assert stats["blocks"] == 1 and stats["bytes"] <= stats["max_bytes"]  # the second block and its parent do not fit
    assert small.generate([PROMPT], max_new_tokens=6, do_sample=False)[0].token_ids == (
        model.generate([PROMPT], max_new_tokens=6, do_sample=False)[0].token_ids
    )


def test_a_header_is_read_a_piece_at_a_time_and_found_past_the_first_piece(tmp_path):
    from edgelm.runtime.batching.prefix_store import HEADER_READ, block_bytes, read_header

    tokens = list(range(100_000, 100_000 + HEADER_READ // 4))  # a header line longer than one piece
    rows = (np.ones((1, len(tokens), 1), np.float32),)
    (tmp_path / "a.kv").write_bytes(block_bytes("p" * 64, 16, tokens, rows, start=5))
    header = read_header(tmp_path / "a.kv")
    assert header["tokens"] == tokens and header["start"] == 5
    (tmp_path / "b.kv").write_bytes(MAGIC + b"{" * HEADER_READ * 2)  # no line's end: not a block
    assert read_header(tmp_path / "b.kv") is None


def test_a_restarted_server_has_the_conversation_start_in_memory_before_its_first_request(
    tiny_package, tmp_path, chunked
):
    from server_harness import HTTP, InProcessServer

    cache, system = tmp_path / "cache", {"role": "system", "content": "Be brief, kind and exact."}
    expected = rt.load(tiny_package, verify=False).chat([system, {"role": "user", "content": "Hi"}], max_new_tokens=4,
                                                        do_sample=False).text  # fmt: skip
    warm(tiny_package, cache).chat([system, {"role": "user", "content": "Hello"}], max_new_tokens=2, do_sample=False)
    server = InProcessServer(warm(tiny_package, cache))
    try:
        before = server.health()["prefix_cache"]
        assert before["bytes"] > 0 and before["reused_tokens"] == 0  # read at load, not by a request
        messages = [system, {"role": "user", "content": "Hi"}]
        body = {"model": server.app.names.id, "messages": messages, "max_tokens": 4, "temperature": 0}
        answer = HTTP.post(server.url + "/v1/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"] == expected
        start = len(rt.load(tiny_package, verify=False).conversation_start(messages))
        assert server.health()["prefix_cache"]["reused_tokens"] == start
    finally:
        server.stop()


@pytest.mark.parametrize("tokens, start", [([2**64, 1], 0), ([-1, 1], 0), ([1, 2], 5), ([1, 2], -1)])
def test_a_header_of_no_token_ids_or_a_start_past_them_is_a_miss_at_load(
    tiny_package, tmp_path, chunked, tokens, start
):
    # a hostile folder: the file's header passes its JSON check, but names no token ids; the load goes on without it
    cache = tmp_path / "cache"
    warm(tiny_package, cache).generate([PROMPT], max_new_tokens=2, do_sample=False)
    for path in cache.glob("*.kv"):
        data = path.read_bytes()
        end = data.index(b"\n", len(MAGIC))
        header = {**json.loads(data[len(MAGIC) : end]), "tokens": tokens, "start": start}
        path.write_bytes(MAGIC + json.dumps(header).encode() + data[end:])
    model = rt.load(tiny_package, verify=False, prefix_cache_mb=1, prefix_cache_dir=cache)
    assert model.engine.prefix_cache.stats()["blocks"] == 0
    assert model.generate([PROMPT], max_new_tokens=2, do_sample=False)[0].token_ids
