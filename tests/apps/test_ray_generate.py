"""examples/ray_generate.py: the map_batches callable on its own (no Ray needed), and the whole job on a local
Ray cluster (the slow tier: starting Ray costs tens of seconds)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_generate.py"


def load_example():
    spec = importlib.util.spec_from_file_location("ray_generate", EXAMPLE)
    module = sys.modules["ray_generate"] = importlib.util.module_from_spec(spec)  # as `import` would
    spec.loader.exec_module(module)
    return module


def test_the_callable_answers_a_batch_of_columns_without_ray(tiny_package, model):
    generate = load_example().Generate(str(tiny_package), max_new_tokens=5)
    batch = {  # as pyarrow gives columns: a key a line lacks is None
        "id": ["a", "b", "c"],
        "prompt": ["The quick brown", "Hello", "x"],
        "max_new_tokens": [None, 3, None],
        "temprature": [None, None, 0.5],
    }
    out = generate(batch)
    assert out["id"] == ["a", "b", "c"] and out["prompt"] == batch["prompt"]  # the input's columns, kept
    assert out["text"][:2] == [
        model.generate("The quick brown", max_new_tokens=5).text,
        model.generate("Hello", max_new_tokens=3).text,
    ]
    assert out["error"][:2] == [None, None] and "temprature" in out["error"][2]  # one bad row, the rest answered
    assert out["text"][2] is None


@pytest.mark.slow
def test_the_job_on_a_local_ray_cluster(tiny_package, model, tmp_path):
    ray = pytest.importorskip("ray", reason="the [ray] extra: pip install 'edgelm[ray]'")
    lines = [{"id": i, "prompt": p} for i, p in enumerate(["The quick brown", "Hello", "Once upon a time"])]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        load_example().run(source, tmp_path / "results", tiny_package, batch_size=2, max_new_tokens=5)
    finally:
        ray.shutdown()
    rows = [json.loads(line) for f in sorted((tmp_path / "results").iterdir()) for line in f.read_text().splitlines()]
    assert sorted((r["id"], r["text"]) for r in rows) == [
        (line["id"], model.generate(line["prompt"], max_new_tokens=5).text) for line in lines
    ]


@pytest.mark.slow
def test_the_script_finishes_with_a_worker_on_every_core(tiny_package, model, tmp_path):
    """Workers holding every core leave none for Ray's reader and writer tasks, which take none of their own."""
    pytest.importorskip("ray", reason="the [ray] extra: pip install 'edgelm[ray]'")
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(["Hello", "The sky"])))
    cores = os.cpu_count()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(source), str(tmp_path / "results"), "-m", str(tiny_package),
         "--concurrency", str(cores), "--max-new-tokens", "4"],
        capture_output=True, text=True, timeout=600, env=os.environ | {"RAY_DISABLE_IMPORT_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for f in sorted((tmp_path / "results").iterdir()) for line in f.read_text().splitlines()]
    assert sorted((r["id"], r["text"]) for r in rows) == [
        (0, model.generate("Hello", max_new_tokens=4).text), (1, model.generate("The sky", max_new_tokens=4).text)
    ]
