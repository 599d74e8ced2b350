"""benchmarks/sampling_outputs.py: two runtimes decode in ABBA pairs, read as a median ratio with its interval."""

import io
import json

import numpy as np
import pytest


class FakeChild:
    """A runtime's process that answers at a set speed and records who decoded what, in order."""

    def __init__(self, name, speed, log):
        self.name, self.speed, self.log, self.closed = name, speed, log, False
        log.append(("start", name))

    def decode(self, batch, key):
        assert not self.closed
        self.log.append((self.name, batch, key))
        return self.speed * batch

    def close(self):
        self.closed = True
        self.log.append(("close", self.name))


def test_pairs_alternate_in_abba_order_and_processes_restart(monkeypatch):
    import sampling_outputs

    monkeypatch.setattr(sampling_outputs.time, "sleep", lambda s: None)
    log, speeds = [], {"old": 100.0, "new": 99.0}
    cases = [(1, "greedy"), (16, "openai")]
    pairs = sampling_outputs.paired_rounds(
        lambda name: FakeChild(name, speeds[name], log), ("old", "new"), 4, 2, cases, settle=0.0
    )
    assert pairs == {(1, "greedy"): [(100.0, 99.0)] * 4, (16, "openai"): [(1600.0, 1584.0)] * 4}
    decodes = [entry for entry in log if entry[0] in speeds]
    firsts = [decodes[i][0] for i in range(0, len(decodes), 2)]  # who decoded first in each pair
    assert firsts == ["old", "old", "new", "new", "old", "old", "new", "new"]  # A B, A B, then B A, B A: ABBA
    assert all(decodes[i][1:] == decodes[i + 1][1:] for i in range(0, len(decodes), 2))  # a pair is one case
    starts = [entry[1] for entry in log if entry[0] == "start"]
    assert starts == ["old", "new", "old", "new"]  # rounds 0 and 2 start both, in their order (both even: old first)
    assert log.count(("close", "old")) == 2 and sorted(log[-2:]) == [("close", "new"), ("close", "old")]
    restart = log.index(("start", "old"), 1)
    assert {("close", "old"), ("close", "new")} <= set(log[:restart])  # the old processes end before new ones load


def test_no_round_starts_after_the_seconds_given(monkeypatch):
    import sampling_outputs

    clock = [0.0]
    monkeypatch.setattr(sampling_outputs.time, "sleep", lambda s: None)
    monkeypatch.setattr(sampling_outputs.time, "perf_counter", lambda: clock[0])

    class Slow(FakeChild):
        def decode(self, batch, key):
            clock[0] += 10.0
            return super().decode(batch, key)

    pairs = sampling_outputs.paired_rounds(
        lambda name: Slow(name, 1.0, []), ("a", "b"), 50, 2, [(1, "greedy")], settle=0.0, seconds=45.0
    )
    assert len(pairs[(1, "greedy")]) == 3  # 20 s a round: rounds begin at 0, 20, 40; not at 60


def test_the_median_ratio_comes_with_a_bootstrap_interval():
    from sampling_outputs import median_interval, within

    rng = np.random.default_rng(1)
    tight = 0.99 + 0.002 * rng.standard_normal(40)
    ratio, low, high = median_interval(tight)
    assert ratio == pytest.approx(float(np.median(tight)))
    assert low <= ratio <= high and high - low < 0.003
    assert median_interval(tight) == (ratio, low, high)  # seeded: the same pairs, the same interval
    loose = 0.99 + 0.05 * rng.standard_normal(40)
    _, loose_low, loose_high = median_interval(loose)
    assert loose_high - loose_low > 5 * (high - low)  # noisier pairs, a wider interval
    assert within(low, high, 0.02) == "yes"
    assert within(loose_low, loose_high, 0.02) == "?"
    assert within(*median_interval(0.95 + 0.002 * rng.standard_normal(40))[1:], 0.02) == "no"
    assert median_interval([1.0] * 5) == (1.0, 1.0, 1.0)


def test_a_runtime_process_answers_each_request_with_a_decode_speed(tiny_package, monkeypatch):
    import sampling_outputs

    from edgelm.runtime import __file__ as runtime_init

    monkeypatch.setattr(sampling_outputs, "use_runtime", lambda tree: None)  # this process's runtime, the tree's
    replies = io.StringIO()
    settings = [("greedy", {}), ("openai", {"do_sample": True, "top_k": 0})]
    sampling_outputs.serve(runtime_init, tiny_package, 6, [1, 2], settings, ["2 openai\n", "1 greedy\n"], replies)
    lines = replies.getvalue().splitlines()
    assert lines[0] == "ready" and len(lines) == 3
    for line in lines[1:]:  # tokens per second over the decode's steps, and at its median step
        over_steps, median_step = json.loads(line)
        assert over_steps > 0 and median_step > 0


def test_the_table_reads_each_setting_from_its_pairs_and_saves_them(monkeypatch, tmp_path, capsys):
    import sampling_outputs

    speeds = {"main": [[100.0, 110.0], [100.0, 100.0]], "working tree": [[97.0, 109.0], [99.0, 101.0]]}

    class Child:
        def __init__(self, tree, package, tokens, batches, settings):
            self.name = "working tree" if tree == str(sampling_outputs.ROOT) else "main"
            self.calls, self.settings = 0, [key for key, _ in settings]

        def decode(self, batch, key):
            self.calls += 1
            return [batch * s for s in speeds[self.name][self.calls % 2]]

        def close(self):
            pass

    monkeypatch.setattr(sampling_outputs, "Child", Child)
    monkeypatch.setattr(sampling_outputs, "runtime_at", lambda rev, folder: folder)
    monkeypatch.setattr(sampling_outputs.time, "sleep", lambda s: None)
    saved = tmp_path / "pairs.json"
    argv = ["PKG", "--rounds", "4", "--batches", "16", "--settings", "openai", "--save", str(saved)]
    monkeypatch.setattr(sampling_outputs.sys, "argv", ["sampling_outputs.py", *argv])
    sampling_outputs.main()
    pairs = json.loads(saved.read_text())
    assert list(pairs) == ["16/openai"] and len(pairs["16/openai"]) == 4  # greedy and the others left out
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("16")]
    assert "OpenAI's defaults" in line
    # over the steps the pairs read 0.99 and 0.97 in turn: 0.98, an interval reaching below 0.98; at the median
    # steps 1.01 and 0.991: an interval above it
    assert "0.980 0.970-0.990 ?" in line and "1.000 0.991-1.010 yes" in line
