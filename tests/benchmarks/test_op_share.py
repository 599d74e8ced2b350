"""benchmarks/op_share.py profiles a package's decode steps and reports each op type's count per layer and its
share of the step, the LM head's kernels apart."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "op_share.py"


def test_op_share_counts_each_op_per_layer_and_the_head_apart(llama_package_int8):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(llama_package_int8), "--threads", "1", "--steps", "3", "--repeats", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in run.stdout.splitlines())
        if len(cells) == 6 and cells[0] not in ("op", "---")
    }
    assert rows["MatMulNBits"][:2] == ["8", "4.00"]  # 2 layers: Q/K/V, output, gate/up, down
    assert rows["GroupQueryAttention"][:2] == ["2", "1.00"]
    assert rows["LM head MatMulNBits"][0] == "1"  # the tied int8 head's product, apart from the layers'
    shares = [float(cells[3].rstrip("%")) for cells in rows.values()]
    assert all(0 <= s <= 100 for s in shares) and 50 < sum(shares) <= 105  # medians: near 100, not exactly
    assert "2 layers" in run.stdout and "weight products (LM head included)" in run.stdout


STEP_PROFILE = SCRIPT.with_name("step_profile.py")


def test_op_share_profiles_rows_decoding_together_over_the_cache_in_place(tiny_package_int4):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_package_int4), "--threads", "1", "--steps", "3", "--repeats", "1",
         "--batch", "1,3"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    titles = [line for line in run.stdout.splitlines() if "layers: profiled step" in line]
    assert [" batch 1 (" in titles[0], " batch 3 (" in titles[1]] == [True, True] and len(titles) == 2
    tables = run.stdout.split("layers: profiled step")[1:]
    cells = [[[c.strip() for c in line.strip("|").split("|")] for line in t.splitlines()] for t in tables]
    kernels = [{c[0]: c[1] for c in table if len(c) == 6} for table in cells]
    assert kernels[0]["GroupQueryAttention"] == kernels[1]["GroupQueryAttention"] == "2"  # one graph, any rows
    assert kernels[0]["MatMulNBits"] == kernels[1]["MatMulNBits"]


def test_step_profile_times_and_profiles_each_batch_size(tiny_package_int8):
    common = [sys.executable, str(STEP_PROFILE), str(tiny_package_int8), "--threads", "1", "--steps", "3"]
    profiled = subprocess.run([*common, "--batch", "2"], capture_output=True, text=True, check=True).stdout
    assert ", batch 2 (" in profiled and "ms a token): step" in profiled and "| MatMulNBits |" in profiled
    rounds = subprocess.run([*common, "--batch", "1,4", "--rounds", "1"], capture_output=True, text=True, check=True)
    assert "thread(s), batch 1, 1 rounds" in rounds.stdout and "thread(s), batch 4, 1 rounds" in rounds.stdout
