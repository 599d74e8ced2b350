"""Speculation's statistics where users look on the command line: `edgelm generate --json` and `edgelm bench
--speculative` (runtime/apps/bench.py)."""

import json

from click.testing import CliRunner
from edgelm.runtime import load
from edgelm.runtime.apps import bench
from edgelm.runtime.cli.main import main

PROMPT = "one two three four one two three four one two"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_generate_json_carries_the_speculation_statistics(tiny_package):
    fast = invoke("generate", "-m", tiny_package, "--greedy", "--max-new-tokens", "12", "--speculative", "ngram",
                  "--json", PROMPT)  # fmt: skip
    plain = invoke("generate", "-m", tiny_package, "--greedy", "--max-new-tokens", "12", "--speculative", "off",
                   "--json", PROMPT)  # fmt: skip
    assert fast.exit_code == 0 and plain.exit_code == 0, fast.output + plain.output
    fast, plain = json.loads(fast.output), json.loads(plain.output)
    assert fast["token_ids"] == plain["token_ids"] and "speculation" not in plain
    stats = fast["speculation"]
    assert {"drafted", "accepted", "forced", "passes", "acceptance_rate"} <= set(stats) and stats["passes"] >= 1


def test_bench_times_a_speculative_mode_against_off(tiny_package):
    figures = bench.speculation_figures(load(tiny_package), "ngram", runs=1, new_tokens=8)
    assert figures["speculative"] == "ngram"
    assert figures["speculative_tok_s"] > 0 and figures["speculative_off_tok_s"] > 0
    assert figures["speculative_speedup"] == figures["speculative_tok_s"] / figures["speculative_off_tok_s"]
    assert 0 <= figures["speculative_accepted"] <= figures["speculative_drafted"]


def test_bench_takes_speculative_and_prints_its_figures(tiny_package, monkeypatch):
    asked = {}
    figures = {"package": "p", "device": "cpu", "threads": 1, "runs": 1, "load_average": (0.5, 0, 0),
               "speculative": "ngram", "speculative_tok_s": 30.0, "speculative_off_tok_s": 20.0,
               "speculative_speedup": 1.5, "speculative_drafted": 10, "speculative_accepted": 7,
               "speculative_acceptance_rate": 0.7}  # fmt: skip

    def run_bench(*args, **kwargs):
        asked.update(kwargs)
        return figures

    monkeypatch.setattr(bench, "run_bench", run_bench)
    table = invoke("bench", tiny_package, "--runs", "1", "--speculative", "ngram")
    assert table.exit_code == 0, table.output
    assert asked["speculative"] == "ngram" and asked["draft"] is None
    assert "on / off, same rounds" in table.output and "1.50x" in table.output and "0.70" in table.output
    refused = invoke("bench", tiny_package, "--speculative", "draft")
    assert refused.exit_code == 2 and "--speculative draft needs --draft-model" in refused.output
