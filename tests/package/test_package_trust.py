"""A package is untrusted input: crafted packages are refused with one clear line (PackageError; through the
CLI a non-zero exit and no traceback), before anything outside the folder is opened, and never hang."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import edgelm.runtime as rt
import pytest
from click.testing import CliRunner
from edgelm.runtime.cli.main import main
from edgelm.runtime.errors import PackageError
from edgelm.runtime.package.open import open_package
from package_files import copy, read_manifest, record, rerecord, write_manifest

EDGELM = Path(sys.executable).parent / "edgelm"
SECRET = b"a file outside the package, 41 bytes long"


@pytest.fixture
def outside(tmp_path):
    """A folder beside the package, with a secret file and a second package's graph in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_bytes(SECRET)
    return folder


# --- crafts: each takes (folder, outside) and damages the package copy in folder ---------------------------


def files_entry_up_and_out(folder, outside):
    m = read_manifest(folder)
    m["files"]["../outside/secret.txt"] = record(outside / "secret.txt")
    write_manifest(folder, m)


def files_entry_absolute(folder, outside):
    m = read_manifest(folder)
    m["files"][str(outside / "secret.txt")] = record(outside / "secret.txt")
    write_manifest(folder, m)


def graph_file_etc_passwd(folder, outside):
    m = read_manifest(folder)
    m["graph"]["file"] = "/etc/passwd"
    m["files"]["/etc/passwd"] = record(Path("/etc/passwd"))
    write_manifest(folder, m)


def graph_file_of_another_package(folder, outside):
    shutil.copy(folder / "model.onnx", outside / "model.onnx")
    m = read_manifest(folder)
    m["graph"]["file"] = "../outside/model.onnx"
    m["files"]["../outside/model.onnx"] = m["files"].pop("model.onnx")
    write_manifest(folder, m)


def tokenizer_absolute(folder, outside):
    shutil.copy(folder / "tokenizer.json", outside / "tokenizer.json")
    m = read_manifest(folder)
    m["tokenizer"] = str(outside / "tokenizer.json")
    m["files"][m["tokenizer"]] = record(outside / "tokenizer.json")
    write_manifest(folder, m)


def tokenizer_symlinked_outside(folder, outside):
    shutil.move(folder / "tokenizer.json", outside / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(outside / "tokenizer.json")


def tokenizer_is_a_fifo(folder, outside):
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")


def dev_zero_in_files(folder, outside):
    m = read_manifest(folder)
    m["files"]["/dev/zero"] = {"size": 1 << 30, "sha256": "0" * 64}
    write_manifest(folder, m)


def link_to_dev_zero(folder, outside):
    (folder / "zeros").symlink_to("/dev/zero")
    m = read_manifest(folder)
    m["files"]["zeros"] = {"size": 1 << 30, "sha256": "0" * 64}
    write_manifest(folder, m)


def weights_unlisted_and_altered(folder, outside):
    data = bytearray((folder / "model.onnx.data").read_bytes())
    data[len(data) // 2] ^= 0x55
    data[len(data) // 3] ^= 0x55
    (folder / "model.onnx.data").write_bytes(bytes(data))
    m = read_manifest(folder)
    del m["files"]["model.onnx.data"]
    write_manifest(folder, m)


def weights_unlisted_and_unnamed(folder, outside):
    """The graph still reads model.onnx.data, but the manifest neither lists nor names it."""
    weights_unlisted_and_altered(folder, outside)
    m = read_manifest(folder)
    del m["graph"]["weights_file"]
    write_manifest(folder, m)


def generation_config_unlisted(folder, outside):
    m = read_manifest(folder)
    del m["files"]["generation_config.json"]
    write_manifest(folder, m)


def file_record_is_a_string(folder, outside):
    m = read_manifest(folder)
    m["files"]["config.json"] = "abc"
    write_manifest(folder, m)


def n_positions_is_a_string(folder, outside):
    m = read_manifest(folder)
    m["architecture"]["n_positions"] = "64"
    write_manifest(folder, m)


def n_head_zero(folder, outside):
    m = read_manifest(folder)
    m["architecture"]["n_head"] = 0
    write_manifest(folder, m)


def vocabulary_larger_than_the_graphs(folder, outside):
    m = read_manifest(folder)
    m["architecture"]["vocab_size"] = 400
    write_manifest(folder, m)


def n_positions_larger_than_the_graph_allows(folder, outside):
    m = read_manifest(folder)
    m["architecture"]["n_positions"] = 128
    write_manifest(folder, m)


def nested_100000_deep(folder, outside):
    (folder / "manifest.json").write_text('{"format": "edgelm-package", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


CRAFTS = {
    files_entry_up_and_out: "plain file name",
    files_entry_absolute: "plain file name",
    graph_file_etc_passwd: "plain file name",
    graph_file_of_another_package: "plain file name",
    tokenizer_absolute: "plain file name",
    tokenizer_symlinked_outside: "outside the package folder",
    tokenizer_is_a_fifo: "not a regular file",
    dev_zero_in_files: "plain file name",
    link_to_dev_zero: "outside the package folder",
    weights_unlisted_and_altered: "does not list 'model.onnx.data'",
    weights_unlisted_and_unnamed: "reads its weights from 'model.onnx.data'",
    generation_config_unlisted: "does not list 'generation_config.json'",
    file_record_is_a_string: "files['config.json'] must be an object",
    n_positions_is_a_string: "architecture.n_positions must be an integer",
    n_head_zero: "architecture.n_head must be an integer from 1",
    vocabulary_larger_than_the_graphs: "logits have 320 columns",
    n_positions_larger_than_the_graph_allows: "graph has 64 positions",
    nested_100000_deep: "nested too deeply",
}


@pytest.mark.parametrize("craft", CRAFTS, ids=lambda craft: craft.__name__)
def test_a_crafted_package_is_refused_in_one_line(craft, tiny_package, tmp_path, outside):
    folder = copy(tiny_package, tmp_path)
    craft(folder, outside)
    with pytest.raises(PackageError, match=re.escape(CRAFTS[craft])) as raised:
        open_package(folder)
    message = str(raised.value)
    # one line, and nothing about outside files: not the secret's size (pytest's numbered run folder, which the
    # message's paths name, may hold the same digits)
    assert "\n" not in message and str(len(SECRET)) not in re.sub(r"pytest-\d+", "pytest-N", message)
    for verify in (True, False):
        with pytest.raises(PackageError, match=re.escape(CRAFTS[craft])):
            rt.load(folder, verify=verify)
    for args in (["verify", folder], ["info", folder], ["generate", "-m", folder, "hi"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
        assert "Traceback" not in result.output and CRAFTS[craft] in result.output


def test_a_graph_with_more_columns_than_the_package_says_is_refused(tiny_package, tmp_path):
    """The manifest's own graph description agrees with the vocabulary, the graph itself does not."""
    folder = copy(tiny_package, tmp_path)
    m = read_manifest(folder)
    m["architecture"]["vocab_size"] = 300
    m["graph"]["outputs"]["logits"]["shape"][-1] = 300
    write_manifest(folder, m)
    with pytest.raises(PackageError, match="gives 320 logits per token"):
        rt.load(folder)


def test_a_negative_token_table_offset_is_refused(tiny_package_int8, tmp_path):
    folder = copy(tiny_package_int8, tmp_path)
    m = read_manifest(folder)
    m["graph"]["token_embeddings"]["rows"]["offset"] = -4096
    write_manifest(folder, m)
    with pytest.raises(PackageError, match="graph.token_embeddings.rows.offset must be an integer from 0"):
        rt.load(folder)
    m["graph"]["token_embeddings"]["file"] = "/etc/passwd"
    write_manifest(folder, m)
    with pytest.raises(PackageError, match="plain file name"):
        rt.load(folder)


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"temperature": "hot", "do_sample": True}, "temperature"),
        ({"bad_words_ids": 5}, "generation_config.json"),
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"eos_token_id": 10**6}, "eos_token_id"),
        ({"eos_token_id": [0, 10**6]}, "eos_token_id"),
        ({"eos_token_id": [0, "1"]}, "eos_token_id"),
        ({"temperature": 10**400, "do_sample": True}, "temperature"),
        ({"max_new_tokens": [1]}, "max_new_tokens"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"bad_words_ids": [[10**6]]}, "bad_words_ids"),
    ],
)
def test_a_package_generation_config_is_untrusted_too(settings, fragment, tiny_package, tmp_path):
    folder = copy(tiny_package, tmp_path)
    (folder / "generation_config.json").write_text(json.dumps(settings))
    rerecord(folder, "generation_config.json")
    with pytest.raises(PackageError, match=fragment):
        rt.load(folder)
    result = CliRunner().invoke(main, ["generate", "-m", str(folder), "hi"])
    assert result.exit_code == 1 and "Traceback" not in result.output and "generation_config.json" in result.output


def external_data_at(folder: Path, location: str) -> None:
    """Point the graph's first external tensor at `location`, and record the new model.onnx."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    next(e for e in tensor.external_data if e.key == "location").value = location
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    rerecord(folder, "model.onnx")


@pytest.mark.parametrize("where", ["../outside/secret.txt", "ABSOLUTE", "unlisted.bin"])
def test_the_graph_may_read_only_listed_files_of_the_package(where, tiny_package, tmp_path, outside):
    """onnxruntime opens external data itself (1.32 refuses absolute paths, '..' and links that leave the
    folder); the loader refuses first, and also a file of the folder that the manifest does not list."""
    folder = copy(tiny_package, tmp_path)
    shutil.copy(folder / "model.onnx.data", folder / "unlisted.bin")
    location = str(outside / "secret.txt") if where == "ABSOLUTE" else where
    external_data_at(folder, location)
    with pytest.raises(PackageError, match="reads its weights from") as raised:
        rt.load(folder)
    assert "does not list it" in str(raised.value)


def test_a_protobuf_group_in_the_graph_does_not_stop_its_checks(tiny_package, tmp_path):
    """Groups are deprecated protobuf that onnxruntime still parses (it skips an unknown one). A graph carrying
    one is still scanned: its unlisted weights file is refused as without it."""
    folder = copy(tiny_package, tmp_path)
    shutil.copy(folder / "model.onnx.data", folder / "unlisted.bin")
    external_data_at(folder, "unlisted.bin")
    # field 99 of ModelProto as a group (wire types 3 and 4) holding field 1 = 5, nested once
    group = b"\x9b\x06" + b"\x08\x05" + b"\x13" + b"\x08\x07" + b"\x14" + b"\x9c\x06"
    (folder / "model.onnx").write_bytes((folder / "model.onnx").read_bytes() + group)
    rerecord(folder, "model.onnx")
    with pytest.raises(PackageError, match="reads its weights from"):
        rt.load(folder)
    # nested past what the scan reads (protobuf itself reads 100 deep): refused, not left unchecked
    deep = b"\x9b\x06" + b"\x13" * 40 + b"\x14" * 40 + b"\x9c\x06"
    (folder / "model.onnx").write_bytes((folder / "model.onnx").read_bytes()[: -len(group)] + deep)
    rerecord(folder, "model.onnx")
    with pytest.raises(PackageError, match="nests graphs or protobuf groups more than 16 deep"):
        rt.load(folder)


@pytest.mark.parametrize(
    "edit, refusal",
    [
        ({"offset": "+0"}, "not a plain decimal"),  # onnxruntime reads it as 0; the table check could not
        ({"offset": "0" * 30}, "not a plain decimal"),
        ({"dims": 100_000}, "does not match the graph"),  # no size computed from 100,000 dims, and no hang
    ],
)
def test_the_token_table_s_tensors_cannot_hide_from_the_check(edit, refusal, tiny_package_int8, tmp_path):
    """The int8 table's first tensor with an offset onnxruntime reads but the scan would not, or with dims no
    decoder has: the loader refuses the graph instead of skipping the comparison with the manifest."""
    import onnx

    folder = copy(tiny_package_int8, tmp_path)
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    if "offset" in edit:
        next(e for e in tensor.external_data if e.key == "offset").value = edit["offset"]
    else:
        del tensor.dims[:]
        tensor.dims.extend([1] * edit["dims"])
        del tensor.external_data[2:]  # location, offset; no length
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    rerecord(folder, "model.onnx")
    with pytest.raises(PackageError, match=refusal):
        rt.load(folder)


def test_an_external_offset_of_thousands_of_digits_is_an_error_not_a_traceback(tiny_package_int8, tmp_path):
    """The loader compares the int8 token table with the graph's tensors at its bytes; an offset too long for
    Python's int() (4,300 digits) is left to onnxruntime, which refuses the graph."""
    import onnx

    folder = copy(tiny_package_int8, tmp_path)
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    next(e for e in tensor.external_data if e.key == "offset").value = "1" * 5000
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    rerecord(folder, "model.onnx")
    with pytest.raises(PackageError):
        rt.load(folder)


def run_with_timeout(*args):
    return subprocess.run(
        [str(EDGELM), *map(str, args)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


EMPTY = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}  # what a FIFO or /dev/zero seems to hold


def fifo_tokenizer(folder):
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")
    m = read_manifest(folder)
    m["files"]["tokenizer.json"] = EMPTY
    write_manifest(folder, m)


def fifo_manifest(folder):
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")


def dev_zero_listed(folder):
    m = read_manifest(folder)
    m["files"]["/dev/zero"] = EMPTY
    write_manifest(folder, m)


def dev_zero_linked(folder):
    (folder / "zeros").symlink_to("/dev/zero")
    m = read_manifest(folder)
    m["files"]["zeros"] = EMPTY
    write_manifest(folder, m)


HANGS = {
    fifo_tokenizer: "not a regular file",
    fifo_manifest: "not a regular file",
    dev_zero_listed: "plain file name",
    dev_zero_linked: "outside the package folder",
}


def invoke_with_timeout(*args, seconds: float = 120):
    """The command in this process, in a thread given `seconds` to return: a hang fails the test, never hangs it."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(done=CliRunner().invoke(main, list(map(str, args)))))
    worker.daemon = True  # one blocked for good (opening a FIFO) must not keep the test run alive
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"edgelm {args[0]} did not return within {seconds} s"
    return result["done"]


@pytest.mark.parametrize("craft", HANGS, ids=lambda craft: craft.__name__)
def test_a_fifo_or_a_device_never_hangs_a_command(craft, tiny_package_int8, tmp_path):
    """verify, generate and serve (which reads the manifest before it starts, for huge pages) all return.
    serve runs as its own process: the launcher reads the manifest before the command line is parsed."""
    folder = copy(tiny_package_int8, tmp_path)
    craft(folder)
    for args in (["verify", folder], ["generate", "-m", folder, "hi"]):
        done = invoke_with_timeout(*args)  # before: blocked forever opening the FIFO, or read /dev/zero forever
        assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
        assert HANGS[craft] in done.stderr and "Traceback" not in done.output, done.output
    done = run_with_timeout("serve", folder, "--port", "0")
    assert done.returncode != 0 and HANGS[craft] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_format_2_package_from_the_previous_writer_still_loads(tiny_package, tmp_path):
    """Keys this edgelm does not write (from a newer exporter of the same format) are ignored; absent optional
    ones take their defaults."""
    folder = copy(tiny_package, tmp_path)
    m = read_manifest(folder)
    m["graph"]["something_new"] = {"x": 1}
    del m["graph"]["kv_cache"], m["graph"]["past_layout"], m["export_seconds"]
    write_manifest(folder, m)
    assert rt.load(folder).generate("hi", max_new_tokens=3).token_ids


@pytest.mark.parametrize("setting", [{"max_new_tokens": 10**12}, {"max_length": 64}, {"max_new_tokens": 64}])
def test_a_generation_default_no_generate_can_use_is_refused_at_load(setting, tiny_package, tmp_path):
    """A default that leaves no room for a prompt in the 64-token context would fail every call: refused at load,
    naming the file."""
    folder = copy(tiny_package, tmp_path)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **setting}))
    rerecord(folder, path.name)
    with pytest.raises(PackageError, match=r"generation_config\.json holds a setting .*no room for a prompt"):
        rt.load(folder)
    result = CliRunner().invoke(main, ["generate", "-m", str(folder), "hi"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "generation_config.json" in result.output


def test_a_generation_default_that_fits_the_context_loads(tiny_package, tmp_path):
    folder = copy(tiny_package, tmp_path)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_new_tokens": 63}))
    rerecord(folder, path.name)
    assert rt.load(folder).defaults.max_new_tokens == 63
