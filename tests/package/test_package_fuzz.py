"""Seeded fuzzing of package manifests and generation configs: mutations of a real tiny package's files
(types swapped, keys dropped, numbers out of range, deep nesting, odd paths). Opening, verifying, describing
and loading either succeed or raise PackageError: never another exception, never a hang."""

import hashlib
import json
import random
import shutil

import edgelm.runtime as rt
import pytest
from edgelm.runtime.engine import hugepages
from edgelm.runtime.errors import PackageError
from edgelm.runtime.package.open import open_package

DEEP = "__deep__"  # replaced by a list nested this deep in the written text (json.dumps itself would recurse)
DEPTH = 100_000
ODD_STRINGS = ["", ".", "..", "../x", "../../outside/secret.txt", "/etc/passwd", "/dev/zero", "a/b", "C:\\x", "x\0y"]
ODD_STRINGS += ["model.onnx", "manifest.json", "tokenizer.json", "é" * 3, "x" * 300, "int8", "float32", "NaN"]
VALUES = [None, True, False, 0, -1, 1, 2, 7, 63, 64, 65, 319, 320, 321, 2**31, 2**63, -(2**63), 10**400, 0.5]
VALUES += [-0.0, 1e308, float("nan"), float("inf"), [], {}, [1, 2], {"a": 1}, [[[]]], DEEP, *ODD_STRINGS]


def paths(value, prefix=()):
    """Every (container path, key) in a JSON value."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield prefix, key
        yield from paths(child, prefix + (key,))


def at(value, path):
    for key in path:
        value = value[key]
    return value


def mutate(document, rng: random.Random):
    """One to three random edits of a JSON document, in place where possible; returns the document."""
    for _ in range(rng.randint(1, 3)):
        spots = list(paths(document))
        if not spots or rng.random() < 0.03:
            return rng.choice([[], "manifest", 5, None, [document], DEEP])
        path, key = rng.choice(spots)
        container, old = at(document, path), at(document, path)[key]
        edit = rng.random()
        if edit < 0.2 and isinstance(container, dict):
            del container[key]
        elif edit < 0.3 and isinstance(container, dict):  # rename the key, e.g. a file name to a path
            container[rng.choice(ODD_STRINGS)] = container.pop(key)
        elif edit < 0.5 and isinstance(old, (int, float)) and not isinstance(old, bool):
            container[key] = rng.choice([-old, old + 1, old - 1, old * 1000, str(old), float(old), 0, -(2**40)])
        elif edit < 0.6:  # the same value as another type
            swaps = {dict: lambda v: list(v.values()), list: lambda v: dict(enumerate(v)), str: lambda v: len(v)}
            container[key] = swaps.get(type(old), str)(old)
        else:
            container[key] = rng.choice(VALUES)
    return document


def write_json(path, document, rng: random.Random) -> None:
    text = json.dumps(document).replace(json.dumps(DEEP), "[" * DEPTH + "]" * DEPTH)
    data = text.encode()
    if rng.random() < 0.03:  # damaged bytes: cut short, or not UTF-8
        data = rng.choice([data[: rng.randrange(len(data) + 1)], data.replace(b'"', b'"\xff', 1)])
    path.write_bytes(data)


def record_file(folder, name) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def exercise(folder, outcomes, load: bool) -> None:
    """Everything that reads a package; PackageError is the only failure allowed."""
    try:
        package = open_package(folder, verify=True)
        package.describe(), json.dumps(package.to_dict())
        open_package(folder, verify=False)
        assert hugepages.gains(folder) in (True, False)
        if load:
            rt.load(folder).generate("hi", max_new_tokens=2)
        outcomes["ok"] += 1
    except PackageError as error:
        assert "\n" not in str(error) and len(str(error)) < 2000, str(error)[:300]
        outcomes["refused"] += 1


@pytest.mark.parametrize("fixture, seed, count", [("tiny_package", 1, 120), ("tiny_package_int8", 2, 60)])
def test_mutated_manifests_open_or_raise_package_error(fixture, seed, count, request, tmp_path):
    original = request.getfixturevalue(fixture)
    folder = shutil.copytree(original, tmp_path / "pkg")
    manifest = json.loads((original / "manifest.json").read_text())
    rng, outcomes = random.Random(seed), {"ok": 0, "refused": 0}
    for k in range(count):
        write_json(folder / "manifest.json", mutate(json.loads(json.dumps(manifest)), rng), rng)
        exercise(folder, outcomes, load=k % 6 == 0)
    assert outcomes["refused"] > count // 2 and outcomes["ok"] > 0  # the mutations do reach both outcomes


def test_mutated_generation_configs_load_or_raise_package_error(tiny_package, tmp_path):
    folder = shutil.copytree(tiny_package, tmp_path / "pkg")
    defaults = {"bos_token_id": 0, "eos_token_id": 0, "max_length": 50, "do_sample": True, "top_k": 5}
    defaults |= {"temperature": 0.7, "bad_words_ids": [[3]], "stop": ["x"], "repetition_penalty": 1.1}
    rng, outcomes = random.Random(3), {"ok": 0, "refused": 0}
    for _ in range(30):
        write_json(folder / "generation_config.json", mutate(json.loads(json.dumps(defaults)), rng), rng)
        record_file(folder, "generation_config.json")
        exercise(folder, outcomes, load=True)
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0
