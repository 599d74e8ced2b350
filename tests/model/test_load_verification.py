"""What load() makes of a package that is not as its manifest says (a grown, changed or missing file, a newer or
foreign format, a damaged manifest), of a folder that is not a package, and of the package kinds it also loads
(an Optimum-style folder, an int8 package's token rows)."""

import json
import shutil

import edgelm.runtime as rt
import numpy as np
import pytest
from edgelm.runtime import PackageError
from user_prompts import PROMPTS


def copy_package(tiny_package, tmp_path):
    return shutil.copytree(tiny_package, tmp_path / "copy")


# --- package verification ----------------------------------------------------------------------------


def edit_manifest(folder, **changes):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_a_grown_file_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    with open(folder / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(PackageError, match="truncated or replaced") as raised:
        rt.load(folder)
    assert "model.onnx" in str(raised.value) and "bytes" in str(raised.value)


def test_a_changed_byte_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    data = bytearray((folder / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(PackageError, match="sha256") as raised:
        rt.load(folder)
    assert "model.onnx" in str(raised.value)


def test_a_missing_file_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(PackageError, match="missing") as raised:
        rt.load(folder)
    assert "tokenizer.json" in str(raised.value)


def test_a_newer_format_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    edit_manifest(folder, format_version=99)
    with pytest.raises(PackageError, match="newer") as raised:
        rt.load(folder)
    assert "99" in str(raised.value) and "Upgrade edgelm" in str(raised.value)


def test_a_foreign_manifest_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    edit_manifest(folder, format="something-else")
    with pytest.raises(PackageError, match="not an edgelm manifest") as raised:
        rt.load(folder)
    assert "something-else" in str(raised.value)


def test_a_damaged_manifest_is_refused(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(PackageError, match="damaged"):
        rt.load(folder)


def test_a_folder_without_manifest_says_how_to_make_a_package(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(PackageError, match="manifest.json") as raised:
        rt.load(tmp_path)
    assert "edgelm export" in str(raised.value)


def test_a_file_instead_of_a_folder(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\0")
    with pytest.raises(PackageError, match="folder"):
        rt.load(tmp_path / "model.onnx")


def test_verify_false_loads_an_altered_but_loadable_package(tiny_package, tmp_path, model):
    folder = copy_package(tiny_package, tmp_path)
    with open(folder / "tokenizer.json", "a") as f:
        f.write("\n")  # still valid JSON, no longer the recorded bytes
    with pytest.raises(PackageError, match="tokenizer.json"):
        rt.load(folder)
    altered = rt.load(folder, verify=False)
    assert (
        altered.generate(PROMPTS[0], max_new_tokens=10).token_ids
        == model.generate(PROMPTS[0], max_new_tokens=10).token_ids
    )


def test_an_unloadable_graph_is_a_package_error(tiny_package, tmp_path):
    folder = copy_package(tiny_package, tmp_path)
    (folder / "model.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(PackageError, match="onnxruntime cannot load"):
        rt.load(folder, verify=False)


def test_an_optimum_style_folder_loads(tiny_package, tmp_path, model):
    folder = tmp_path / "optimum"
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data", "config.json", "tokenizer.json"):
        shutil.copy(tiny_package / name, folder / name)
    plain = rt.load(folder)
    assert plain.package.kind == "optimum"
    assert plain.arch == model.arch
    for prompt in PROMPTS:
        assert (
            plain.generate(prompt, max_new_tokens=15).token_ids == model.generate(prompt, max_new_tokens=15).token_ids
        )
    assert plain.score("The quick brown fox").logprobs == pytest.approx(
        model.score("The quick brown fox").logprobs, abs=1e-5
    )
    # without its tokenizer it says what is missing
    (folder / "tokenizer.json").unlink()
    with pytest.raises(PackageError, match="tokenizer.json"):
        rt.load(folder)


@pytest.mark.parametrize(
    "fixture, rows",
    [("tiny_package_int8", r"uint8 rows \[320, 1, 32\]"), ("tiny_package_int8_rows", r"int8 rows \[320, 32\]")],
)
def test_an_int8_package_with_a_damaged_token_table_description_is_refused(request, fixture, rows, tmp_path):
    """int8 graphs take inputs_embeds; the manifest says where the token rows are. Without that, or with the
    wrong shape or block, load says so instead of failing inside onnxruntime."""
    folder = copy_package(request.getfixturevalue(fixture), tmp_path)
    graph = json.loads((folder / "manifest.json").read_text())["graph"]
    section = graph.pop("token_embeddings")
    edit_manifest(folder, graph=graph)
    with pytest.raises(PackageError, match="does not describe its token_embeddings"):
        rt.load(folder)
    edit_manifest(
        folder, graph=graph | {"token_embeddings": section | {"rows": section["rows"] | {"shape": [320, 16]}}}
    )
    with pytest.raises(PackageError, match=rows):
        rt.load(folder)
    for block in (48, 64, -32, "32"):  # not a block size; 64 does not divide the tiny model's 32 inputs
        edit_manifest(folder, graph=graph | {"token_embeddings": section | {"block": block}})
        with pytest.raises(PackageError, match="token_embeddings.block must be"):
            rt.load(folder)
    edit_manifest(folder, graph=graph | {"token_embeddings": {"file": "model.onnx.data"}})
    with pytest.raises(PackageError, match="token_embeddings.rows is missing"):
        rt.load(folder)


def test_an_int8_token_table_that_disagrees_with_the_graph_s_lm_head_is_refused(tiny_package_int8, tmp_path):
    """The int8 recipe's table is the LM head's MatMulNBits weights. A manifest that describes it in other blocks
    (of a size that divides the width, so every field alone is valid) or at other bytes would make the lookup read
    wrong embeddings without any error: load compares it with the graph's tensors at those bytes."""
    folder = copy_package(tiny_package_int8, tmp_path)
    graph = json.loads((folder / "manifest.json").read_text())["graph"]
    section = graph["token_embeddings"]
    vocab, width = section["rows"]["shape"][0], section["block"] * section["rows"]["shape"][1]
    other = section["block"] // 2
    edits = {
        "blocks of half the size": {
            "block": other,
            "rows": section["rows"] | {"shape": [vocab, width // other, other]},
            "scale": section["scale"] | {"shape": [vocab, width // other]},
        },
        "scales moved by one row": {"scale": section["scale"] | {"offset": section["scale"]["offset"] + 4}},
        "rows moved back to a tensor's middle": {"rows": section["rows"] | {"offset": section["rows"]["offset"] + 64}},
    }
    for name, edit in edits.items():
        edit_manifest(folder, graph=graph | {"token_embeddings": section | edit})
        with pytest.raises(PackageError, match="does not match the graph"):
            rt.load(folder)
    edit_manifest(folder, graph=graph)
    assert rt.load(folder).generate("Hello", max_new_tokens=2).token_ids


@pytest.mark.parametrize("fixture", ["tiny_package_int8", "tiny_package_int8_rows"])
def test_an_int8_package_reads_token_rows_not_the_whole_table(request, fixture):
    """The lookup reads one row per token from the weights file: the same embeddings as the stored table."""
    from token_table import stored_table

    package = request.getfixturevalue(fixture)
    model = rt.load(package)
    _, _, embeddings = stored_table(package, model.package.manifest.graph.token_embeddings)
    reads = []
    original = model.engine.embeddings._read_row
    model.engine.embeddings._read_row = lambda token, out: (reads.append(token), original(token, out))
    ids = np.array([[4, 9, 4]])
    np.testing.assert_array_equal(model.engine.embeddings(ids), embeddings[ids])
    assert reads == [4, 9, 4]
