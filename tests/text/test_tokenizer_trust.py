"""A package's tokenizer.json is hostile input: a normalizer or decoder that multiplies text, or a pre-tokenizer
regex that backtracks without end, is refused at load with the reason; a regex that still makes the Rust
library panic on some text is a PromptError in the API, a JSON 400 from the server and one line in the CLI."""

import json

import edgelm.runtime as rt
import httpx
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import PackageError, PromptError
from edgelm.runtime.server.api.requests import Limits
from package_files import copy, rerecord
from server_harness import InProcessServer

GROWING = {"type": "Replace", "pattern": {"String": "a"}, "content": "a" * 50}
PANICS = "(a|a)+$"  # alternatives that match alike: the regex engine's retry limit gives up on 'aaa...b'
PANIC_TEXT = "a" * 40 + "b"


def _with_tokenizer(tiny_package, tmp_path, change):
    folder = copy(tiny_package, tmp_path)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    rerecord(folder, path.name)
    return folder


def _split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            lambda d: d.update(decoder={"type": "Sequence", "decoders": [GROWING] * 3}),
            "decoder can make a text 125,000",
        ),
        (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [GROWING] * 2}), "normalizer can make"),
        (lambda d: d.update(decoder={"type": "Replace", "pattern": {"Regex": "."}, "content": "x" * 99}), "100 times"),
        (lambda d: d.update(pre_tokenizer=_split("(a+)+$")), "repeats a repeated group"),
        (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [_split("(\\s*x{1,})*")]}), "repeats"),
    ],
    ids=["decoder-chain", "normalizer-chain", "regex-replace", "nested-quantifier", "nested-in-sequence"],
)
def test_a_tokenizer_that_multiplies_or_backtracks_is_refused_at_load(change, fragment, tiny_package, tmp_path):
    folder = _with_tokenizer(tiny_package, tmp_path, change)
    with pytest.raises(PackageError, match=fragment) as raised:
        rt.load(folder)
    assert "tokenizer.json is refused" in str(raised.value) and "\n" not in str(raised.value)
    result = CliRunner().invoke(main, ["generate", "-m", str(folder), "hi"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "refused" in result.output


def test_real_tokenizer_steps_load(tiny_package, tmp_path):
    """SentencePiece-style steps ("▁" <-> " ", a collapse of spaces) are not growth."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    collapse = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
    folder = _with_tokenizer(
        tiny_package, tmp_path, lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [replace, collapse]})
    )
    assert rt.load(folder).encode("hi there")


@pytest.fixture(scope="module")
def panicking(tiny_package, tmp_path_factory):
    folder = _with_tokenizer(
        tiny_package, tmp_path_factory.mktemp("panics"), lambda d: d.update(pre_tokenizer=_split(PANICS))
    )
    return rt.load(folder), folder


def test_a_tokenizer_panic_is_a_prompt_error(panicking):
    model, _ = panicking
    with pytest.raises(PromptError, match="tokenizer failed to encode this text"):
        model.encode(PANIC_TEXT)
    with pytest.raises(PromptError, match="tokenizer failed"):
        model.generate(PANIC_TEXT, max_new_tokens=2)
    assert model.encode("fine")  # the tokenizer still works for other text


def test_a_tokenizer_panic_is_one_line_in_the_cli(panicking):
    _, folder = panicking
    result = CliRunner().invoke(main, ["generate", "-m", str(folder), PANIC_TEXT])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "tokenizer failed" in result.output and "Traceback" not in result.output


def test_a_tokenizer_panic_is_a_json_400_from_the_server(panicking):
    model, _ = panicking
    server = InProcessServer(model, Limits(max_tokens=8))
    try:
        for path, body in (("/tokenize", {"content": PANIC_TEXT}), ("/v1/completions", {"prompt": PANIC_TEXT})):
            response = httpx.post(server.url + path, json=body, timeout=60)
            assert response.status_code == 400, response.text
            assert "tokenizer failed" in response.json()["error"]["message"]
        assert httpx.post(server.url + "/tokenize", json={"content": "fine"}, timeout=60).status_code == 200
    finally:
        server.stop()
