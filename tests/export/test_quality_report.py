"""The quantized package's quality report: measured on the evaluation text (export/data/ or --eval-text), recorded
per recipe in the manifest, shown by edgelm info, and measured again by edgelm verify --quality."""

import hashlib
import json
import shutil
from pathlib import Path

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import PackageError
from edgelm.runtime.package.open import open_package
from edgelm.runtime.quality.eval_text import EvalText
from edgelm.runtime.quality.measure import Plan, compare_engines

SAMPLE = Path(__file__).resolve().parents[2] / "export" / "data" / "persuasion-chapters-1-4.txt"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def manifest_of(folder) -> dict:
    return json.loads((Path(folder) / "manifest.json").read_text())


@pytest.mark.parametrize("fixture, recipe", [("validated_package_int8", "int8"), ("validated_package_int4", "int4")])
def test_the_report_measures_the_evaluation_text(request, fixture, recipe):
    folder = request.getfixturevalue(fixture)
    validation = manifest_of(folder)["validation"]
    text = validation["text"]
    assert text["name"] == SAMPLE.name and text["sha256"] == hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    assert text["measured_tokens"] == 8192 and text["tokens"] > 8192 and text["bytes"] == SAMPLE.stat().st_size
    figures = validation[recipe]
    # 64-position windows: 128 of them, each scoring its 63 next tokens
    assert figures["window"] == 64 and figures["tokens"] == 128 * 63
    assert figures["greedy"] | {"identical": 0, "prefix_agreement": 0, "token_agreement": 0} == {
        "continuations": 32, "prompt_tokens": 16, "tokens_each": 48, "identical": 0, "prefix_agreement": 0,
        "token_agreement": 0,
    }  # fmt: skip
    assert figures["cache_path"]["tokens"] == 4 * 32 and figures["kv_cache"] == "float32"
    assert 0 < figures["mean_kl_divergence"] and 0 < figures["top1_agreement"] <= 1
    # random weights: the reference's perplexity is far above a tenth of the 320-token vocabulary
    assert figures["perplexity_reference"] > 32 and figures["perplexity_meaningful"] is False
    read = open_package(folder, verify=False).manifest.validation
    assert read.quality[recipe].tokens == figures["tokens"] and read.text.measured_tokens == 8192


def test_info_shows_each_figure_on_its_line(validated_package_int8):
    lines = invoke("info", validated_package_int8).output.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("  int8 quality  against transformers")))
    assert lines[at - 1].startswith(f"  eval text     {SAMPLE.name}: its first 8,192 of ")
    figures = {line.split()[0]: line for line in lines[at + 1 : at + 6]}
    assert list(figures) == ["mean", "top-1", "cache", "greedy", "perplexity"]
    assert "over 8,064 tokens" in figures["mean"] and "of 32 continuations identical" in figures["greedy"]
    assert "perplexity means nothing" not in figures["perplexity"]  # it says it in its own words:
    assert "means nothing for this checkpoint" in figures["perplexity"]


def test_a_text_of_ones_own_is_recorded_by_sha256(tiny_checkpoint, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text(SAMPLE.read_text(encoding="utf-8")[-30_000:], encoding="utf-8")  # ~24,000 tiny-tokenizer tokens
    result = invoke("export", tiny_checkpoint, "-o", tmp_path / "pkg", "--quantize", "int8", "--eval-text", text)
    assert result.exit_code == 0, result.output
    recorded = manifest_of(tmp_path / "pkg")["validation"]["text"]
    assert recorded["name"] == "notes.txt" and recorded["sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()
    assert recorded["measured_tokens"] == 8192
    assert "eval text     notes.txt" in result.output


def test_bad_evaluation_texts_are_refused_in_one_line(tiny_checkpoint, tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"PK\x03\x04\x00\x00" * 100)
    (tmp_path / "latin1.txt").write_bytes("Émile a visité Paris.".encode("latin-1"))
    (tmp_path / "short.txt").write_text("A short text. " * 50)
    with open(tmp_path / "huge.txt", "wb") as file:  # sparse: refused by its size, never read
        file.truncate(9 << 20)
    cases = {
        "missing.txt": "is not a file (missing)",
        "empty.txt": "is empty: give a text of at least 2,048 tokens",
        "binary.txt": "is binary, not text",
        "latin1.txt": "is not UTF-8 (byte 0xc9 at offset 0)",
        "huge.txt": "is 9.0 MiB; at most 8 MiB is read",
        "short.txt": "holds 650 tokens of this model's tokenizer; the quality report measures 8,192 (--eval-tokens, "
        "at least 2,048)",
    }
    for name, message in cases.items():
        out = tmp_path / f"package-of-{name}"
        result = invoke("export", tiny_checkpoint, "-o", out, "--quantize", "int8", "--eval-text", tmp_path / name)
        assert result.exit_code in (1, 2) and message in result.output, (name, result.output)
        assert "Traceback" not in result.output and not out.exists()
    few = invoke("export", tiny_checkpoint, "-o", tmp_path / "few", "--quantize", "int8", "--eval-tokens", 100)
    assert few.exit_code == 2 and "100 is not in the range x>=2048" in few.output
    unused = invoke("export", tiny_checkpoint, "-o", tmp_path / "fp32", "--eval-text", SAMPLE)
    assert unused.exit_code == 1 and "a float32 export (--quantize none) has no quality report" in unused.output


def test_verify_quality_measures_again_against_the_float32_package(tiny_package, validated_package_int8):
    result = invoke("verify", validated_package_int8, "--quality", "--reference", tiny_package, "--json")
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)
    model, reference = rt.load(validated_package_int8), rt.load(tiny_package)
    ids, prefix, _ = EvalText.read(SAMPLE).tokens(model.tokenizer, 8192)
    direct = compare_engines(reference.engine, model.engine, ids, Plan.for_context(64), model.arch.eos_token_id, prefix)
    assert measured["figures"] == direct | {"kv_cache": "float32"}
    assert measured["text"]["measured_tokens"] == 8192 and measured["recipe"] == "int8"
    assert measured["recorded"] == manifest_of(validated_package_int8)["validation"]["int8"]
    # the float32 package is the checkpoint within 1e-5: the figures come out as the export's against PyTorch
    assert measured["figures"]["top1_agreement"] == pytest.approx(measured["recorded"]["top1_agreement"], abs=0.01)
    printed = invoke("verify", validated_package_int8, "--quality", "--reference", tiny_package)
    assert printed.exit_code == 0 and "match their sha256" in printed.output, printed.output
    kl = next(line for line in printed.output.splitlines() if line.startswith("    mean KL"))
    assert kl.count("over 8,064 tokens") == 1 and kl.endswith("]")  # the manifest's figure beside, in brackets


def test_verify_quality_takes_the_checkpoint_itself_as_reference(tiny_checkpoint, validated_package_int8):
    result = invoke("verify", validated_package_int8, "--quality", "--reference", tiny_checkpoint, "--json")
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)
    assert measured["reference"] == f"the checkpoint {tiny_checkpoint} in PyTorch"
    recorded = measured["recorded"]  # measured the same way at export: against the checkpoint in PyTorch
    assert measured["figures"]["tokens"] == recorded["tokens"] and measured["figures"]["greedy"]["continuations"] == 32
    assert measured["figures"]["mean_kl_divergence"] == pytest.approx(recorded["mean_kl_divergence"], rel=1e-3)


def test_verify_quality_on_a_text_of_ones_own(tiny_package, validated_package_int8, tmp_path):
    text = tmp_path / "other.txt"
    text.write_text(SAMPLE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    result = invoke("verify", validated_package_int8, "--quality", "--reference", tiny_package, "--text", text,
                    "--eval-tokens", 4096, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)
    assert measured["text"]["name"] == "other.txt" and measured["text"]["measured_tokens"] == 4096
    assert measured["figures"]["tokens"] == 64 * 63  # 4,096 tokens: 64 windows of 64


def test_verify_quality_refuses_another_model_as_reference(tiny_package, validated_package_int8, tmp_path):
    quantized = invoke("verify", validated_package_int8, "--quality", "--reference", validated_package_int8)
    assert quantized.exit_code == 1 and "holds int8 weights; the reference is the float32 package" in quantized.output
    other = tmp_path / "other"
    shutil.copytree(tiny_package, other)
    manifest = manifest_of(other)
    manifest["architecture"]["layer_norm_epsilon"] = 1e-3
    (other / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("verify", validated_package_int8, "--quality", "--reference", other)
    assert result.exit_code == 1 and "is a different model from the package (layer_norm_epsilon 0.001" in result.output
    missing = invoke("verify", validated_package_int8, "--quality")
    assert missing.exit_code == 2 and "--quality needs --reference" in missing.output


def test_an_older_manifest_without_the_text_still_loads(validated_package_int8, tiny_package, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(validated_package_int8, old)
    manifest = manifest_of(old)
    validation = manifest["validation"]
    del validation["text"]
    validation["int8"] = {  # what an export before the evaluation text recorded
        "held_out_tokens": 66, "top1_agreement": 0.95, "mean_kl_divergence": 0.002,
        "cache_path_mean_kl_divergence": 0.002, "cache_path_positions": 32, "kv_cache": "float32",
        "greedy_agreement": 0.8, "perplexity_reference": 300.0, "perplexity": 301.0, "perplexity_change": 0.0033,
    }  # fmt: skip
    (old / "manifest.json").write_text(json.dumps(manifest))
    package = open_package(old)
    assert package.manifest.validation.greedy_agreement("int8") == 0.8 and package.manifest.validation.text is None
    assert "int8 quality  top-1 0.950" in package.describe() and "66-token paragraph" in package.describe()
    result = invoke("verify", old, "--quality", "--reference", tiny_package)
    assert result.exit_code == 2 and "records no evaluation text: give one with --text FILE" in result.output


def test_a_figure_out_of_range_is_refused(validated_package_int8, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(validated_package_int8, bad)
    manifest = manifest_of(bad)
    manifest["validation"]["int8"]["greedy"]["identical"] = 33
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=r"validation\.int8\.greedy\.identical must be an integer from 0 to 32"):
        open_package(bad)
