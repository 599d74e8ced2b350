"""A runtime on another machine or onnxruntime against the exporting machine's: float32 greedy tokens equal, int8
and int4 within the greedy agreement their export recorded (or nearer float32's tokens than the exporting
machine's), scores, chat and a batch working (and, for a recipe whose manifest says batch_invariant, each
prompt's tokens the same in a batch as alone).

It needs packages exported elsewhere with their reference.json (tests/support/reference_tokens.py): EDGELM_TEST_PACKAGES
names them (tools/ci/onnxruntime_matrix.sh, tools/ci/aarch64_emulated.sh). The default run has none."""

import json
import math
import os
from pathlib import Path

import edgelm.runtime as rt
import pytest
from edgelm.runtime import PackageError
from edgelm.runtime.package.onnxruntime_compat import installed_version, version_tuple
from edgelm.runtime.package.open import open_package
from reference_tokens import NEW_TOKENS, PROMPTS, REFERENCE, greedy

PACKAGES = Path(os.environ.get("EDGELM_TEST_PACKAGES", "")) if os.environ.get("EDGELM_TEST_PACKAGES") else None
RECORDED = json.loads((PACKAGES / REFERENCE).read_text()) if PACKAGES and (PACKAGES / REFERENCE).exists() else None
NAMES = sorted(RECORDED["packages"]) if RECORDED else []

pytestmark = pytest.mark.skipif(RECORDED is None, reason="needs EDGELM_TEST_PACKAGES with a reference.json")


def agreement(ours: list, reference: list) -> float:
    """Tokens before the first divergence / tokens generated, averaged over prompts (the export's greedy_agreement)."""
    lengths = []
    for a, b in zip(ours, reference):
        differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        lengths.append((differ[0] if differ else NEW_TOKENS) / NEW_TOKENS)
    return sum(lengths) / len(lengths)


def _model(name):
    folder = PACKAGES / name
    needed = open_package(folder).min_onnxruntime
    if needed and version_tuple(installed_version()) < version_tuple(needed):
        with pytest.raises(PackageError, match=f"needs onnxruntime {needed}"):
            rt.load(folder)
        return None  # refused by name, as test_onnxruntime_versions.py checks: nothing more to compare
    return rt.load(folder, device="cpu")


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_match_the_exporting_machine(name):
    model = _model(name)
    if model is None:
        return
    reference = RECORDED["packages"][name]["greedy"]
    ours = greedy(model)
    manifest = model.package.manifest
    if manifest.weights.dtype == "float32":
        assert ours == reference, f"{name}: float32 greedy tokens differ from {RECORDED['machine']}'s"
        return
    recorded = manifest.validation.greedy_agreement(manifest.weights.method)
    assert recorded is not None, f"{name} was exported without validation: no agreement to hold it to"
    if agreement(ours, reference) >= min(recorded, 1.0) - 1e-9:
        return
    # Another CPU's kernels may round another way: onnxruntime's 8-bit MatMulNBits on a CPU without dot-product
    # instructions (Cortex-A72) computes closer to float32 than x86-64's does. Then the tokens must agree with the
    # float32 package of the same checkpoint at least as well as the exporting machine's did.
    float32 = _float32_sibling(manifest)
    assert float32 is not None, (name, ours, reference, recorded, "no float32 package of its checkpoint to judge by")
    exact = RECORDED["packages"][float32]["greedy"]
    assert agreement(ours, exact) >= agreement(reference, exact) - 1e-9, (name, ours, reference, exact)


def _float32_sibling(manifest):
    """The float32 package of the set exported from the same checkpoint, or None."""
    for other in NAMES:
        theirs = open_package(PACKAGES / other, verify=False).manifest
        if theirs.weights.dtype == "float32" and theirs.source == manifest.source:
            return other
    return None


@pytest.mark.parametrize("name", NAMES)
def test_scores_batches_and_chat_work(name):
    model = _model(name)
    if model is None:
        return
    reference = RECORDED["packages"][name]["score"]
    ours = [float(x) for x in model.score(PROMPTS[0]).logprobs[1:]]
    assert len(ours) == len(reference) and all(math.isfinite(x) for x in ours)
    if name == "tiny-fp32":
        assert max(abs(a - b) for a, b in zip(ours, reference)) < 1e-4
    batch = model.generate([PROMPTS[0], PROMPTS[0]], max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert batch[0].token_ids == batch[1].token_ids
    if model.package.manifest.weights.quantization.get("batch_invariant"):  # int8: each row on its own
        together = model.generate(list(PROMPTS), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        assert [c.token_ids for c in together] == greedy(model), f"{name}: a row's tokens moved with its batch"
    reply = model.chat([{"role": "user", "content": "Hi there"}], max_new_tokens=4, min_new_tokens=4)
    assert len(reply.token_ids) == 4
