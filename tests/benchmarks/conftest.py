"""The lab's own tests put benchmarks/ on the import path; tests/repository/test_test_layout.py checks that no
test outside this folder imports a module of the lab."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
