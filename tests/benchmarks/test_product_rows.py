"""benchmarks/product_rows.py times one weight product alone per kernel at each row count."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "product_rows.py"


def test_each_kernel_gets_a_row_per_shape_with_its_times_and_their_ratio():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--shapes", "64x96,128x32", "--rows", "1,4", "--threads", "1", "--repeats", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in run.stdout.splitlines() if line.startswith("| ")]
    table = [r for r in rows if r[0] not in ("K x N", "---")]
    assert len(table) == 2 * 9 and {r[0] for r in table} == {"64 x 96", "128 x 32"}
    assert any(r[1].startswith("QGemm") for r in table) and any("(int4)" in r[1] for r in table)
    for _, _, one, four, ratio in table:
        assert float(one) > 0 and float(four) > 0 and ratio.endswith("x") and float(ratio[:-1]) > 0
