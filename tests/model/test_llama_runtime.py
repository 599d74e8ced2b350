"""Llama and Qwen2 packages on the same runtime: greedy tokens equal transformers' from the CLI, the Python API
(single prompts, a left-padded batch, prompts longer than one prefill chunk) and the server (completions and
chat), the cache sized by the key/value heads, and the mapped int4 weight pages load() drops."""

import os

import pytest
import torch
from click.testing import CliRunner
from edgelm.runtime import load
from edgelm.runtime.cli.main import main
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.server.api.requests import Limits
from server_harness import HTTP, InProcessServer

FAMILIES = ["llama", "qwen2"]
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "import numpy as np\n"]
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(loaded package, transformers model of the same checkpoint), per family."""
    import transformers

    name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[request.param]
    checkpoint = request.getfixturevalue(f"{request.param}_checkpoint")
    reference = getattr(transformers, name).from_pretrained(checkpoint, attn_implementation="eager").eval()
    return (
        request.getfixturevalue(f"{request.param}_package"),
        load(request.getfixturevalue(f"{request.param}_package")),
        reference,
    )


def hf_greedy(reference, rows: list, n: int) -> list:
    """transformers' greedy continuation of each row (left-padded together when several)."""
    ids, mask = engine.left_pad(rows, 0)
    with torch.no_grad():
        out = reference.generate(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :].tolist()


def test_api_greedy_equals_transformers(family):
    _, model, reference = family
    for prompt in PROMPTS:
        ids = model.encode(prompt)
        completion = model.generate(prompt, max_new_tokens=12, min_new_tokens=12)
        assert completion.token_ids == hf_greedy(reference, [ids], 12)[0]


def test_padded_batch_equals_transformers(family):
    """Rows of different lengths are left-padded and decoded together: the rotation follows position_ids."""
    _, model, reference = family
    rows = [model.encode(p) for p in PROMPTS]
    completions = model.generate(rows, max_new_tokens=10, min_new_tokens=10)
    assert [c.token_ids for c in completions] == hf_greedy(reference, rows, 10)


def test_prompt_in_chunks_equals_transformers(family, monkeypatch):
    """A prompt longer than one prefill chunk goes into the in-place cache in several passes."""
    _, model, reference = family
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 16)
    ids = (model.encode(PROMPTS[1]) * 4)[:40]
    assert model.generate([ids], max_new_tokens=8, min_new_tokens=8)[0].token_ids == hf_greedy(reference, [ids], 8)[0]


def test_cache_has_one_head_per_key_value_head(family):
    _, model, _ = family
    decoder = model.engine.decoder(1, 16)
    assert decoder.buffers[0].shape == (1, model.arch.kv_heads, 16, model.arch.head_size)
    assert model.arch.kv_heads < model.arch.n_head


def test_cli_generate(family):
    package, model, reference = family
    result = CliRunner().invoke(main, ["generate", "-m", str(package), PROMPTS[0], "--max-new-tokens", "6"])
    assert result.exit_code == 0, result.output
    assert result.stdout == model.generate(PROMPTS[0], max_new_tokens=6).text + "\n"


def test_chat_uses_the_package_template(family):
    _, model, _ = family
    prompt = model.chat_template.render(MESSAGES, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and model.chat_template.stop == ("<|im_end|>",)
    reply = model.chat(MESSAGES, max_new_tokens=8)
    assert reply.token_ids == model.generate(prompt, max_new_tokens=8).token_ids[: len(reply.token_ids)]


def test_server_completions_and_chat(family):
    _, model, _ = family
    server = InProcessServer(model, Limits(max_tokens=16), model_names=("tiny",))
    try:
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
        answer = HTTP.post(server.url + "/v1/completions", json=body).json()
        assert answer["choices"][0]["text"] == model.generate(PROMPTS[0], max_new_tokens=8).text
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
        answer = HTTP.post(server.url + "/v1/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"] == model.chat(MESSAGES, max_new_tokens=8).text.lstrip()
    finally:
        server.stop()


@pytest.mark.parametrize("name, quantize", [("llama", "int8"), ("qwen2", "int4")])
def test_quantized_package_with_int8_cache_runs(request, tmp_path, name, quantize):
    """Quantized weights with an int8 KV cache [B, KV, P, D] (the quality figures: test_llama_export.py, slow)."""
    from edgelm.export.stages import export_model

    checkpoint = request.getfixturevalue(f"{name}_checkpoint")
    folder = export_model(str(checkpoint), tmp_path / "kv8", quantize=quantize, kv_cache="int8", validate=False).path
    model = load(folder)
    assert model.engine.io.cache_dtype == "int8" and model.engine.io.takes_embeddings == (quantize == "int8")
    decoder = model.engine.decoder(1, 8)
    assert decoder.buffers[0].shape == (1, model.arch.kv_heads, 8, model.arch.head_size)
    assert decoder.buffers[0].dtype.name == "int8"
    scores = model.score(PROMPTS[1])
    assert len(scores.logprobs) == len(model.encode(PROMPTS[1])) and all(lp < 0 for lp in scores.logprobs)
    rows = [model.encode(p) for p in PROMPTS]
    assert [len(c.token_ids) for c in model.generate(rows, max_new_tokens=6, min_new_tokens=6)] == [6, 6, 6]


def test_chat_prompt_gets_no_second_start_token(llama_package):
    """A tokenizer that adds a start token (Llama's) adds none to a chat prompt: the template writes its own."""
    from tokenizers import processors

    model = load(llama_package)
    model.tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    assert model.encode("Hi")[0] == 0
    prompt = model.chat_template.render(MESSAGES, add_generation_prompt=True)
    reply = model.chat(MESSAGES, max_new_tokens=2)
    assert reply.prompt_tokens == len(model.encode(prompt, add_special_tokens=False)) == len(model.encode(prompt)) - 1


def test_manifest_claiming_more_positions_than_the_rotary_tables_is_refused(llama_package, tmp_path):
    import json
    import shutil

    from edgelm.runtime.errors import PackageError

    folder = tmp_path / "pkg"
    shutil.copytree(llama_package, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["architecture"]["n_positions"] = 4096
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="n_positions is 4096 but its graph has 64 positions"):
        load(folder)


def test_chat_without_a_template_is_refused_in_one_line(llama_checkpoint, tmp_path):
    """An instruction-tuned family's package without a chat template: chat says so (GPT-2 base models get the
    default template instead); generate still works."""
    import json
    import shutil

    from edgelm.runtime.errors import ChatError

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint, checkpoint)
    config_file = checkpoint / "tokenizer_config.json"
    config_file.write_text(
        json.dumps({k: v for k, v in json.loads(config_file.read_text()).items() if k != "chat_template"})
    )
    result = CliRunner().invoke(main, ["export", str(checkpoint), "-o", str(tmp_path / "pkg"), "--no-validate"])
    assert result.exit_code == 0, result.output
    model = load(tmp_path / "pkg")
    with pytest.raises(ChatError, match="has no chat template .*--chat-template FILE"):
        model.chat(MESSAGES, max_new_tokens=2)
    assert len(model.generate(PROMPTS[0], max_new_tokens=2).token_ids) == 2
    result = CliRunner().invoke(main, ["chat", "-m", str(tmp_path / "pkg")], input="Hi\n")
    errors = [line for line in result.output.splitlines() if "Error" in line]
    assert result.exit_code != 0 and len(errors) == 1 and "has no chat template" in errors[0], result.output
    assert "Traceback" not in result.output


def _resident_kb(path) -> int:
    """This process's resident kB of its mappings of `path` (/proc/self/smaps)."""
    resident, current = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                current = len(fields) == 6 and fields[5] == str(path.resolve())
            elif current and fields[0] == "Rss:":
                resident += int(fields[1])
    return resident


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_int4_load_leaves_no_weight_pages_resident(qwen2_checkpoint, tmp_path, monkeypatch):
    """onnxruntime keeps the int4 scales and the shared 4-bit token table mapped after prepacking them; load()
    drops those pages (runtime/engine/session.py, drop_mapped_pages), and the tokens come out the same."""
    from edgelm.export.stages import export_model
    from edgelm.runtime.model import loaded as model_module

    folder = export_model(str(qwen2_checkpoint), tmp_path / "int4", quantize="int4", validate=False).path
    model = load(folder)
    assert _resident_kb(folder / "model.onnx.data") == 0
    rows = [model.encode(p) for p in PROMPTS]
    tokens = [c.token_ids for c in model.generate(rows, max_new_tokens=6)]
    monkeypatch.setattr(model_module, "drop_mapped_pages", lambda folder: 0)
    kept = load(folder)
    assert _resident_kb(folder / "model.onnx.data") > 0  # what load() would hold without dropping them
    assert [c.token_ids for c in kept.generate(rows, max_new_tokens=6)] == tokens


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="reads Linux's /proc/self/pagemap")
def test_dropping_mapped_pages_keeps_a_written_mapping(tmp_path):
    """A private mapping with a page written through it is left alone: dropping it would undo the write."""
    import mmap

    from edgelm.runtime.engine.session import drop_mapped_pages

    (tmp_path / "weights").write_bytes(bytes(4 * mmap.PAGESIZE))
    with open(tmp_path / "weights", "r+b") as f:
        clean, written = (mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE) for _ in range(2))
    assert clean[:] == written[:]  # both resident now
    written[5] = 7
    assert drop_mapped_pages(tmp_path) == 1  # the clean one only
    assert written[5] == 7 and clean[:] == bytes(4 * mmap.PAGESIZE)
