"""A graph whose key/value cache is float16 (another exporter's, or tools/graph_variants.py's): the runtime
allocates its cache in float16, in place, alone and in a running batch."""

import subprocess
import sys
from pathlib import Path

import edgelm.runtime as rt
import numpy as np
import pytest
from edgelm.runtime.batching.scheduler import Scheduler

VARIANTS = Path(__file__).resolve().parents[2] / "tools" / "graph_variants.py"


@pytest.fixture(scope="module")
def float16_package(llama_package, tmp_path_factory):
    out = tmp_path_factory.mktemp("kv16") / "package"
    subprocess.run([sys.executable, str(VARIANTS), str(llama_package), str(out), "--variant", "kv-float16"], check=True)
    return out


def test_a_float16_cache_decodes_like_the_float32_one(llama_package, float16_package):
    model, reference = rt.load(float16_package), rt.load(llama_package)
    assert model.engine.io.cache_dtype == "float16" and reference.engine.io.cache_dtype == "float32"
    prompts = ["Hello there", "Once upon a time, in a land far away"]
    ours = model.generate(prompts, max_new_tokens=6, ignore_eos=True, logprobs=1)
    theirs = reference.generate(prompts, max_new_tokens=6, ignore_eos=True, logprobs=1)
    for a, b in zip(ours, theirs):  # the first token's distribution: the prompt through a float16 attention
        assert a.logprobs[0]["token_id"] == b.logprobs[0]["token_id"]
        assert a.logprobs[0]["logprob"] == pytest.approx(b.logprobs[0]["logprob"], abs=2e-2)
    decoder = model.engine.decoder(1, capacity=8)
    assert {buffer.dtype for buffer in decoder.buffers} == {np.dtype(np.float16)}


def test_a_running_batch_of_a_float16_cache_gets_what_each_gets_alone(float16_package):
    from scheduler_job import Job

    model = rt.load(float16_package)
    options = dict(do_sample=False, ignore_eos=True, max_new_tokens=8)
    scheduler = Scheduler(model, max_rows=2)
    try:
        jobs = [Job(model.batch([prompt], **options)) for prompt in ("Hello", "Once upon a time")]
        for job in jobs:
            scheduler.submit(job)
        for job in jobs:
            assert job.wait().error is None
            alone = model.generate(list(job.batch.prompts), **options)
            assert [c.token_ids for c in job.batch.completions] == [c.token_ids for c in alone]
    finally:
        scheduler.close()


def test_a_cache_type_edgelm_does_not_run_is_refused(float16_package, tmp_path):
    import json
    import shutil

    folder = tmp_path / "package"
    shutil.copytree(float16_package, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["graph"]["kv_cache"] = {"dtype": "bfloat16"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(rt.PackageError, match="kv_cache.dtype must be one of float32, float16, int8, got 'bfloat16'"):
        rt.load(folder)
