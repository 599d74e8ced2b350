"""The `edgelm generate / info / verify` commands: through click's CliRunner, and as real processes for
streaming, exit codes and Ctrl-C."""

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main

EOS = 0
EDGELM = Path(sys.executable).parent / "edgelm"


def invoke(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def generate(package, *args, input=None):
    return invoke("generate", "-m", package, *args, input=input)


def assert_clean_failure(result, fragment, code=1):
    """A non-zero exit with one readable line, never a Python traceback."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert fragment in result.output
    assert "Traceback" not in result.output


# --- generate ----------------------------------------------------------------------------------------


def test_generate_prints_the_completion(tiny_package, model):
    result = generate(tiny_package, "The quick brown", "--max-new-tokens", 5)
    assert result.exit_code == 0, result.output
    assert result.stdout == model.generate("The quick brown", max_new_tokens=5).text + "\n"


def test_generate_json(tiny_package, model):
    result = generate(tiny_package, "The quick brown", "--max-new-tokens", 8, "--json", "--logprobs", 2)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = model.generate("The quick brown", max_new_tokens=8, logprobs=2)
    assert data["text"] == expected.text
    assert data["token_ids"] == expected.token_ids
    assert data["finish_reason"] == expected.finish_reason
    assert data["prompt_tokens"] == len(model.encode("The quick brown"))
    assert data["completion_tokens"] == len(expected.token_ids)
    assert [e["token_id"] for e in data["logprobs"]] == expected.token_ids
    assert all(len(e["top_logprobs"]) == 2 for e in data["logprobs"])


def test_show_config_prints_the_settings_in_effect(tiny_package, model):
    result = generate(
        tiny_package, "--show-config", "--temperature", 0.7, "--top-k", 7, "--stop", "END", "--max-new-tokens", 9
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)
    assert settings["temperature"] == 0.7 and settings["top_k"] == 7 and settings["max_new_tokens"] == 9
    assert settings["do_sample"] is True  # a sampling option turns sampling on
    assert settings["stop"] == ["END"]
    assert settings["eos_token_id"] == [EOS]
    assert settings["device"] == "cpu" and settings["package"] == str(tiny_package)
    greedy = json.loads(generate(tiny_package, "--show-config", "--temperature", 0.7, "--greedy").stdout)
    assert greedy["do_sample"] is False and greedy["temperature"] == 0.7


def test_prompt_from_stdin(tiny_package, model):
    result = generate(tiny_package, "-", "--max-new-tokens", 6, input="Once upon a time\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == model.generate("Once upon a time", max_new_tokens=6).text + "\n"


def test_invalid_utf8_on_stdin_is_a_clear_error(tiny_package):
    result = generate(tiny_package, "-", input=b"caf\xe9 au lait")
    assert_clean_failure(result, "UTF-8")
    assert "0xe9" in result.output


def test_bad_option_value_is_a_clear_error(tiny_package):
    assert_clean_failure(generate(tiny_package, "Hi", "--top-p", 0), "top_p must be in (0, 1]")
    assert_clean_failure(generate(tiny_package, "Hi", "--max-new-tokens", 0), "max_new_tokens")
    assert_clean_failure(generate(tiny_package, "Hi " * 80, "--max-new-tokens", 5), "--truncate")


def test_unknown_option_is_a_usage_error(tiny_package):
    result = generate(tiny_package, "Hi", "--temprature", 0.5)
    assert_clean_failure(result, "No such option", code=2)
    assert_clean_failure(generate(tiny_package, "Hi", "--logit-bias", "abc"), "ID=BIAS", code=2)


def test_missing_package_says_how_to_export(tmp_path):
    result = generate(tmp_path / "absent", "Hi")
    assert_clean_failure(result, "edgelm export")


def test_bare_generate_looks_for_models_distilgpt2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store (conftest) is empty too
    result = invoke("generate", "Hi")
    assert_clean_failure(result, "models/distilgpt2")
    assert "edgelm pull" in result.output and "edgelm export" in result.output
    assert_clean_failure(invoke("info"), "models/distilgpt2")
    assert_clean_failure(invoke("verify"), "models/distilgpt2")


def test_seeded_sampling_repeats(tiny_package, model):
    args = ("The quick brown", "--max-new-tokens", 20, "--seed", 1, "--do-sample")
    first, second = generate(tiny_package, *args), generate(tiny_package, *args)
    assert first.exit_code == 0 and first.stdout == second.stdout
    assert first.stdout == model.generate("The quick brown", max_new_tokens=20, seed=1, do_sample=True).text + "\n"
    assert (
        generate(tiny_package, "The quick brown", "--max-new-tokens", 20, "--seed", 2, "--do-sample").stdout
        != first.stdout
    )


def test_stop(tiny_package, model):
    text = model.generate("", max_new_tokens=25, ignore_eos=True).text
    start = next(
        i for i in range(4, len(text) - 3) if text[i : i + 3].isprintable() and text.find(text[i : i + 3]) == i
    )
    result = generate(tiny_package, "", "--max-new-tokens", 25, "--ignore-eos", "--stop", text[start : start + 3])
    assert result.exit_code == 0, result.output
    assert result.stdout == text[:start] + "\n"
    data = json.loads(
        generate(
            tiny_package,
            "",
            "--max-new-tokens",
            25,
            "--ignore-eos",
            "--stop",
            "\u2603",
            "--stop",
            text[start : start + 3],
            "--json",
        ).stdout
    )
    assert (data["text"], data["finish_reason"], data["stop_string"]) == (text[:start], "stop", text[start : start + 3])


def test_several_sequences(tiny_package, model):
    result = generate(tiny_package, "Hi", "--max-new-tokens", 6, "-n", 2, "--do-sample", "--seed", 3)
    assert result.exit_code == 0, result.output
    texts = [c.text for c in model.generate("Hi", max_new_tokens=6, num_return_sequences=2, do_sample=True, seed=3)]
    assert result.stdout == f"{texts[0]}\n---\n{texts[1]}\n"
    data = json.loads(
        generate(tiny_package, "Hi", "--max-new-tokens", 6, "-n", 3, "--json", "--do-sample", "--seed", 4).stdout
    )
    assert [d["index"] for d in data] == [0, 1, 2]


def test_logit_bias(tiny_package, model):
    banned = generate(tiny_package, "The quick brown", "--max-new-tokens", 30, "--logit-bias", "0=-100", "--json")
    data = json.loads(banned.stdout)
    assert data["completion_tokens"] == 30 and data["finish_reason"] == "length" and EOS not in data["token_ids"]
    assert data["token_ids"] == model.generate("The quick brown", max_new_tokens=30, logit_bias={EOS: -100}).token_ids
    forced = json.loads(generate(tiny_package, "The quick brown", "--logit-bias", "0=100", "--json").stdout)
    assert (forced["finish_reason"], forced["completion_tokens"], forced["text"]) == ("stop", 0, "")
    assert_clean_failure(generate(tiny_package, "Hi", "--logit-bias", "100000=5"), "outside this model's vocabulary")


def test_ban(tiny_package, model):
    prompt = "Once upon a time, in a land"
    before = model.generate(prompt, max_new_tokens=20)
    word = next(w for w in (model.tokenizer.decode([t]) for t in before.token_ids) if w.isalpha() and len(w) >= 2)
    word_ids = model.encode(word)
    assert any(before.token_ids[i : i + len(word_ids)] == word_ids for i in range(len(before.token_ids)))
    data = json.loads(generate(tiny_package, prompt, "--max-new-tokens", 20, "--ban", word, "--json").stdout)
    assert not any(data["token_ids"][i : i + len(word_ids)] == word_ids for i in range(len(data["token_ids"])))
    assert word not in data["text"]
    assert data["token_ids"] != before.token_ids


def test_truncate_flag(tiny_package):
    data = json.loads(generate(tiny_package, "Hi there. " * 40, "--max-new-tokens", 10, "--truncate", "--json").stdout)
    assert data["prompt_tokens"] == 54 and data["truncated_prompt_tokens"] > 0


# --- info and verify ---------------------------------------------------------------------------------


def test_info(validated_package, validated_package_int8):
    result = invoke("info", validated_package)
    assert result.exit_code == 0, result.output
    assert "2 layers, 4 heads x 8, width 32, 64 positions" in result.output
    assert "fp32 parity" in result.output and "greedy identical True" in result.output
    int8 = invoke("info", validated_package_int8)
    assert int8.exit_code == 0, int8.output
    assert "int8 quality  against transformers GPT2LMHeadModel" in int8.output
    assert "    mean KL     " in int8.output and "    top-1       " in int8.output


def test_info_json(validated_package):
    result = invoke("info", validated_package, "--json")
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert manifest["architecture"]["n_layer"] == 2
    assert manifest["validation"]["fp32"]["greedy_identical"] is True


def test_verify(tiny_package, tmp_path):
    result = invoke("verify", tiny_package)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("OK:")
    folder = shutil.copytree(tiny_package, tmp_path / "copy")
    data = bytearray((folder / "model.onnx").read_bytes())
    data[100] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(data))
    assert_clean_failure(invoke("verify", folder), "model.onnx")
    assert "sha256" in invoke("verify", folder).output
    # generate refuses it too, and --no-verify skips the check: a weight altered in its last bit then runs
    assert_clean_failure(generate(folder, "Hi"), "model.onnx")
    shutil.copy(tiny_package / "model.onnx", folder / "model.onnx")
    weights = bytearray((folder / "model.onnx.data").read_bytes())
    weights[0] ^= 1  # the lowest mantissa bit of the first float32 weight
    (folder / "model.onnx.data").write_bytes(bytes(weights))
    assert_clean_failure(generate(folder, "Hi"), "model.onnx.data")
    unchecked = generate(folder, "Hi", "--no-verify", "--max-new-tokens", 2)
    assert unchecked.exit_code == 0 and unchecked.stdout.strip() and "sha256" not in unchecked.output, unchecked.output


def test_info_and_verify_on_an_optimum_folder(tiny_package, tmp_path):
    for name in ("model.onnx", "config.json", "tokenizer.json"):
        shutil.copy(tiny_package / name, tmp_path / name)
    info = invoke("info", tmp_path)
    assert info.exit_code == 0, info.output
    assert "optimum package" in info.output and "2 layers" in info.output
    assert json.loads(invoke("info", tmp_path, "--json").stdout)["kind"] == "optimum"
    verified = invoke("verify", tmp_path)
    assert verified.exit_code == 0 and "nothing to verify" in verified.output


# --- real processes ----------------------------------------------------------------------------------


def test_edgelm_command_streams_and_exits_cleanly(tiny_package, model):
    done = subprocess.run(
        [EDGELM, "generate", "-m", tiny_package, "The quick brown", "--max-new-tokens", "12"],
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode("utf-8") == model.generate("The quick brown", max_new_tokens=12).text + "\n"
    failed = subprocess.run(
        [EDGELM, "generate", "-m", tiny_package, "Hi", "--top-p", "0"],
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert failed.returncode == 1
    assert b"top_p must be in (0, 1]" in failed.stderr and b"Traceback" not in failed.stderr
    assert failed.stdout == b""


def test_ctrl_c_keeps_the_printed_text_and_exits_130(gpt2_vocab_package):
    """SIGINT while streaming: exit code 130, and what was printed stays printed.

    Deterministic, not timed: the completion is forced to be longer than the stdout pipe holds (60 copies of a
    128-byte token, the pipe shrunk to 4 KiB) and nothing is read before the signal, so once the first bytes
    arrive the process cannot have finished streaming: it is generating or blocked writing when SIGINT lands.
    """
    token = 35496  # GPT-2's longest token: 128 bytes of mojibake
    text = rt.load(gpt2_vocab_package).tokenizer.decode([token])
    assert len(text.encode()) == 128
    read_end, write_end = os.pipe()
    capacity = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    assert 60 * len(text.encode()) > capacity
    process = subprocess.Popen(
        [
            EDGELM,
            "generate",
            "-m",
            gpt2_vocab_package,
            "A",
            "--max-new-tokens",
            "60",
            "--ignore-eos",
            "--logit-bias",
            f"{token}=1000",
        ],
        stdout=write_end,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal, whatever runs pytest
    )
    os.close(write_end)
    try:
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        assert poller.poll(120_000), "no output within two minutes"
        assert process.poll() is None
        process.send_signal(signal.SIGINT)
        with os.fdopen(read_end, "rb") as stdout:
            printed = stdout.read()  # drains the pipe so the process can finish writing and exit
        stderr = process.stderr.read()
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 130, stderr.decode(errors="replace")
    assert b"Traceback" not in stderr
    assert printed.endswith(b"\n")
    shown = printed[:-1].decode("utf-8")
    assert len(shown) >= len(text) and shown == text * (len(shown) // len(text))  # whole pieces, kept


def test_bench_reports_every_figure_as_json_and_as_a_table(tiny_package, monkeypatch):
    from edgelm.runtime.apps import bench

    result = invoke("bench", tiny_package, "--runs", "1", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    rates = ["decode_tok_s", "batch_8_tok_s", "batch_16_tok_s", "ceiling_tok_s", "read_gb_s"]
    measured = rates + ["ttft_8_ms", "peak_rss_mb", "load_s", "cold_start_to_first_token_s", "batch_16_over_batch_1"]
    assert all(figures[k] > 0 for k in measured)
    assert figures["decode_fraction_of_ceiling"] == pytest.approx(figures["decode_tok_s"] / figures["ceiling_tok_s"])
    assert figures["weight_bytes"] == sum(
        (Path(tiny_package) / name).stat().st_size for name in ("model.onnx", "model.onnx.data")
    )
    assert "ttft_128_ms" not in figures  # a 64-position model cannot take a 128-token prompt
    assert_clean_failure(invoke("bench", tiny_package, "--threads", "0"), "--threads", code=2)
    assert_clean_failure(invoke("bench", Path(tiny_package).parent / "missing"), "edgelm export")
    monkeypatch.setattr(bench, "run_bench", lambda *args, **kwargs: figures)  # the table of the same figures
    table = invoke("bench", tiny_package, "--runs", "1", "--threads", "1")
    assert table.exit_code == 0, table.output
    for label in (
        "first token, 8-token prompt",
        "decode, batch 16 (aggregate)",
        "batch 16 / batch 1, same rounds",
        "decode / ceiling, same rounds",
    ):
        assert label in table.output


def test_bench_on_cuda_leaves_out_the_host_memory_ceiling(tiny_package, monkeypatch):
    from edgelm.runtime.apps import bench

    def on_cuda(path, device, threads, draft=None):  # the figures come from the CPU; the model says it runs on CUDA
        model = rt.load(path, device="cpu", threads=threads, draft=draft)
        model.device = "cuda"
        return model

    monkeypatch.setattr(bench, "load", on_cuda)
    figures = bench.run_bench(tiny_package, threads=1, runs=1)
    assert figures["device"] == "cuda" and figures["decode_tok_s"] > 0
    assert not {"read_gb_s", "ceiling_tok_s", "decode_fraction_of_ceiling"} & set(figures)
    assert "decode / ceiling" not in bench.format_table(figures)


def test_the_bench_read_probe_is_a_matmul_onnxruntime_runs():
    import numpy as np
    import onnxruntime as ort
    from edgelm.runtime.apps.bench import READ_PROBE, ReadProbe

    probe = ort.InferenceSession(READ_PROBE, providers=["CPUExecutionProvider"])
    a, b = (
        np.random.default_rng(0).standard_normal((1, 768), dtype=np.float32),
        np.random.default_rng(1).standard_normal((768, 40), dtype=np.float32),
    )
    np.testing.assert_allclose(probe.run(None, {"a": a, "b": b})[0], a @ b, rtol=1e-4, atol=1e-4)
    seconds = ReadProbe(8 << 20, threads=1).seconds(repeats=1)
    assert isinstance(seconds, float) and np.isfinite(seconds) and seconds > 0
