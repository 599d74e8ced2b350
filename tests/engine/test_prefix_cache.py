"""The prefix cache: a prompt that starts like a recent one gets those rows restored, and the outputs are the
same bits as without the cache (fp32, int8 weights, int8 KV cache); memory is bounded, least recently used out."""

import threading

import edgelm.runtime as rt
import numpy as np
import pytest
from click.testing import CliRunner
from edgelm.runtime.batching.prefix_cache import PrefixCache
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.engine.passes import MAX_STARTS, Starts, prefill_passes
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.errors import EdgelmError, GenerationOptionError
from edgelm.runtime.generation_config import GenerationConfig

CHUNK = 16  # the tiny model has 64 positions: prompts of two and three chunks


def greedy(model, ids, new_tokens) -> tuple[list, np.ndarray]:
    """Tokens and the logits each was picked from, [new_tokens, V]."""
    config = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, eos_token_id=model.arch.eos_token_id)
    steps = [(int(t[0]), lg[0].copy()) for t, lg in id_steps(model.engine, [ids], config, model.pad_id)]
    return [t for t, _ in steps], np.stack([lg for _, lg in steps])


@pytest.mark.parametrize("package", ["tiny_package", "tiny_package_int8", "tiny_package_int8_kv8"])
def test_a_conversation_gives_the_same_bits_with_and_without_the_cache(request, monkeypatch, package):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)  # both models prefill in chunks of 16
    folder = request.getfixturevalue(package)
    cold, warm = rt.load(folder, verify=False), rt.load(folder, verify=False, prefix_cache_mb=1)
    assert cold.engine.prefix_cache is None and warm.engine.prefix_cache.chunk == CHUNK
    rng = np.random.default_rng(0)
    first = rng.integers(0, cold.arch.vocab_size, 37).tolist()
    prompt, reused = first, []
    # Each turn resends the history, its answer and a new message; the last repeats the first prompt.
    for new_tokens, added in ((6, 5), (6, 3), (4, None)):
        tokens, logits = greedy(cold, prompt, new_tokens)
        before = warm.engine.prefix_cache.reused_tokens
        warm_tokens, warm_logits = greedy(warm, prompt, new_tokens)
        reused.append(warm.engine.prefix_cache.reused_tokens - before)
        assert warm_tokens == tokens
        assert np.array_equal(warm_logits, logits)  # every bit, at every step
        prompt = prompt + tokens + rng.integers(0, cold.arch.vocab_size, added).tolist() if added else first
    assert len(prompt) == 37
    tokens, logits = greedy(cold, prompt, 4)
    warm_tokens, warm_logits = greedy(warm, prompt, 4)
    assert warm_tokens == tokens and np.array_equal(warm_logits, logits)
    # 37 tokens: nothing stored yet; 48: the first two chunks; 57: three; the first prompt again: two
    assert reused == [0, 32, 48] and warm.engine.prefix_cache.reused_tokens == 80 + 32


def test_batches_and_decode_steps_leave_the_cache_alone(tiny_package, monkeypatch):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)
    cold, warm = rt.load(tiny_package, verify=False), rt.load(tiny_package, verify=False, prefix_cache_mb=1)
    prompts = [list(range(40)), list(range(3, 40))]
    options = dict(max_new_tokens=5, do_sample=False)
    assert [c.token_ids for c in warm.generate(prompts, **options)] == [
        c.token_ids for c in cold.generate(prompts, **options)
    ]
    assert len(warm.engine.prefix_cache) == 0  # two rows are prefilled in one pass, not in the cache's chunks
    assert (
        warm.generate([list(range(40))], **options)[0].token_ids
        == cold.generate([list(range(40))], **options)[0].token_ids
    )
    assert len(warm.engine.prefix_cache) == 2  # one row: its two whole chunks, not the decode steps' rows


def test_threads_sharing_a_small_cache_get_the_answers_of_no_cache(tiny_package, monkeypatch):
    """The server's worker threads share one model: restores, stores and evictions interleave."""
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)
    block = 2 * 2 * 4 * CHUNK * 8 * 4  # 2 layers x key and value x 4 heads x 16 tokens x head size 8 x float32
    cold = rt.load(tiny_package, verify=False)
    warm = rt.load(tiny_package, verify=False, prefix_cache_mb=5 * block / (1 << 20))  # 5 blocks for 9 prompts
    rng = np.random.default_rng(1)
    system = rng.integers(0, cold.arch.vocab_size, 16).tolist()  # a shared start, then each prompt's own
    prompts = [system + rng.integers(0, cold.arch.vocab_size, 17 + i).tolist() for i in range(9)]
    expected = [greedy(cold, p, 3)[0] for p in prompts]
    got = {}

    def work(thread):
        for round_ in range(2):
            for i in range(thread, len(prompts), 3):
                got[i, round_] = greedy(warm, prompts[i], 3)[0]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [got[i, r] for r in range(2) for i in range(9)] == expected * 2
    assert warm.engine.prefix_cache.reused_tokens > 0 and warm.engine.prefix_cache.bytes <= 5 * block


def fake_buffers(ids, capacity=32, tensors=4, heads=2, head_size=3) -> list:
    """Decoder buffers whose rows say which token wrote them: row p of every tensor holds ids[p] + tensor."""
    buffers = [np.zeros((1, heads, capacity, head_size), dtype=np.float32) for _ in range(tensors)]
    for t, buffer in enumerate(buffers):
        buffer[0, :, : len(ids)] = (np.asarray(ids, dtype=np.float32) + t)[None, :, None]
    return buffers


BLOCK_BYTES = 4 * 2 * 4 * 3 * 4  # tensors x heads x chunk of 4 x head_size x float32


def test_restore_copies_the_longest_stored_start_and_leaves_a_pass_for_the_logits():
    cache, a = PrefixCache(10 * BLOCK_BYTES, chunk=4), np.arange(1, 14)  # 13 tokens: three whole chunks
    cache.store(a, 0, fake_buffers(a))
    assert len(cache) == 3 and cache.bytes == 3 * BLOCK_BYTES
    longer = np.concatenate([a[:12], [99, 98]])
    restored = fake_buffers([])
    assert cache.restore(longer, 0, restored) == 12
    assert np.array_equal(restored[2][0, :, :12], fake_buffers(a)[2][0, :, :12])
    assert not restored[2][0, :, 12:].any()
    assert cache.restore(a[:12], 0, fake_buffers([])) == 8  # the prompt's last chunk is computed, for its logits
    assert cache.restore(np.concatenate([a[:5], [0], a[6:]]), 0, fake_buffers([])) == 4  # differs in chunk two
    assert cache.restore(np.array([7, 7, 7, 7, 7]), 0, fake_buffers([])) == 0


def test_passes_break_at_a_start_inside_a_pass_and_nowhere_else():
    assert prefill_passes(13, 4) == [(0, 4), (4, 8), (8, 12), (12, 13)]
    assert prefill_passes(13, 4, 6) == [(0, 4), (4, 6), (6, 10), (10, 13)]
    assert prefill_passes(13, 4, 8) == prefill_passes(13, 4)  # a start of whole passes changes nothing
    assert prefill_passes(5, 4, 6) == [(0, 4), (4, 5)]  # a start longer than the prompt is not its start
    assert prefill_passes(6, 4, 6) == [(0, 4), (4, 6)]


def test_the_longest_known_start_is_the_prompt_s_and_only_the_most_recent_are_known():
    starts = Starts()
    starts.add([1, 2, 3], pinned=True)
    starts.add([1, 2, 3, 4, 5])
    assert starts.longest([1, 2, 3, 4, 5, 6]) == 5 and starts.longest([1, 2, 3, 9]) == 3
    assert starts.longest([1, 2]) == 0 and starts.longest([2, 1, 2, 3]) == 0
    for k in range(MAX_STARTS):
        starts.add([7, k])
    assert starts.longest([1, 2, 3, 4, 5, 6]) == 3  # the oldest went; the pinned one stays
    assert starts.longest([7, 0, 1]) == 2


def test_a_start_inside_a_pass_is_kept_whole_and_given_only_to_prompts_broken_there():
    cache, a = PrefixCache(10 * BLOCK_BYTES, chunk=4), np.arange(1, 14)
    cache.store(a, 6, fake_buffers(a))  # passes [0, 4) [4, 6) [6, 10) kept; [10, 13) is the prompt's own
    assert len(cache) == 3
    restored = fake_buffers([])
    assert cache.restore(np.append(a[:10], 99), 6, restored) == 10
    assert np.array_equal(restored[1][0, :, :10], fake_buffers(a)[1][0, :, :10])
    assert cache.restore(np.append(a[:6], 99), 6, fake_buffers([])) == 6  # the start alone, whole
    assert cache.restore(a, 0, fake_buffers([])) == 4  # passes not broken at 6: their [4, 8) was never made
    cache.store(a[:6], 6, fake_buffers(a))  # a prompt that is its start: nothing new
    assert len(cache) == 3


def test_the_least_recently_used_blocks_go_first_ends_before_starts():
    cache = PrefixCache(4 * BLOCK_BYTES, chunk=4)
    a, b = np.arange(1, 13), np.concatenate([np.arange(1, 5), np.arange(50, 58)])  # b shares a's first chunk
    cache.store(a, 0, fake_buffers(a))
    cache.store(b, 0, fake_buffers(b))  # five blocks over a budget of four: a's last goes
    assert len(cache) == 4 and cache.bytes == 4 * BLOCK_BYTES
    assert cache.restore(np.append(b, 0), 0, fake_buffers([])) == 12
    assert cache.restore(np.append(a, 0), 0, fake_buffers([])) == 8  # used now: b's blocks are the oldest
    c = np.arange(100, 108)
    cache.store(c, 0, fake_buffers(c))
    assert cache.restore(np.append(b, 0), 0, fake_buffers([])) == 4  # b lost its end, never the start it shares
    assert cache.restore(np.append(a, 0), 0, fake_buffers([])) == 8
    assert cache.restore(np.append(c, 0), 0, fake_buffers([])) == 8
    assert cache.bytes <= 4 * BLOCK_BYTES


def test_a_budget_below_one_block_stores_nothing():
    cache, a = PrefixCache(BLOCK_BYTES - 1, chunk=4), np.arange(12)
    cache.store(a, 0, fake_buffers(a))
    assert len(cache) == 0 and cache.bytes == 0


@pytest.mark.parametrize("bad", [-1, "64", float("nan"), float("inf"), True, None])
def test_a_bad_prefix_cache_size_is_refused_before_the_package_is_read(tmp_path, bad):
    with pytest.raises(GenerationOptionError, match="prefix_cache_mb must be a number of MiB >= 0") as error:
        rt.load(tmp_path / "no-such-package", prefix_cache_mb=bad)
    assert error.value.param == "prefix_cache_mb"


def test_serve_and_chat_pass_the_size_and_refuse_a_negative_one(monkeypatch, tmp_path):
    from edgelm.runtime import model as model_module
    from edgelm.runtime.cli.main import main

    asked = []

    def refuse(*args, **options):
        asked.append(options["prefix_cache_mb"])
        raise EdgelmError("stop here")

    monkeypatch.setattr(model_module, "load", refuse)
    folder = str(tmp_path)  # a folder: serve resolves the package before it listens, and load() is refused
    for command in ("serve", "chat"):
        assert "stop here" in CliRunner().invoke(main, [command, "-m", folder, "--prefix-cache-mb", "0"]).output
        assert "stop here" in CliRunner().invoke(main, [command, "-m", folder]).output
        result = CliRunner().invoke(main, [command, "-m", folder, "--prefix-cache-mb", "-1"])
        assert result.exit_code == 2 and "--prefix-cache-mb" in result.output
    assert asked == [0, 64, 0, 64]


def test_a_start_given_by_the_caller_breaks_the_passes_whatever_the_engine_remembers(tiny_package, monkeypatch):
    # a saved session names its start in its header: the rows it computes must be made in that start's passes, even
    # if the engine's remembered starts changed between the look-up and the prefill
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)
    model = rt.load(tiny_package, verify=False)
    ids = np.arange(1, 41, dtype=np.int64)[None]
    passes = []
    spy = lambda self, i, m, p: passes.append((int(p[0, 0]), int(p[0, -1]) + 1))  # noqa: E731
    monkeypatch.setattr(engine.InPlaceDecoder, "_pass", spy)
    for start in (21, None):  # the engine remembers no start: None asks it
        decoder = engine.InPlaceDecoder(model.engine, 1, ids.shape[1])
        decoder.run(ids, np.ones_like(ids), np.arange(ids.shape[1])[None], start)
    assert passes == [(0, 16), (16, 21), (21, 37), (37, 40), (0, 16), (16, 32), (32, 40)]
