"""benchmarks/peers.py's pure parts: the load each round records (peer_load.py) and how its workers count tokens.
No peer system runs here: the streams are Python generators that record how far they were asked to go."""

import pytest
from peer_load import CONTENDED, CpuTimes, Load, Snapshot, load_between, parse_proc_stat, rounds_to_summarize
from peers import take, timed

PROC_STAT = """cpu  1000 50 300 9000 20 0 10 40 0 0
cpu0 500 25 150 4500 10 0 5 20 0 0
cpu1 500 25 150 4500 10 0 5 20 0 0
intr 12345 0 0
ctxt 6789
cpuset 1
"""


def test_proc_stat_busy_time_leaves_out_idle_and_iowait_and_counts_the_cores():
    times = parse_proc_stat(PROC_STAT, ticks_per_s=100)
    assert times == CpuTimes(busy_s=(1000 + 50 + 300 + 0 + 10) / 100, steal_s=0.4, cores=2)


def test_a_line_that_is_not_the_aggregate_cpu_line_is_refused():
    with pytest.raises(ValueError, match="aggregate cpu line"):
        parse_proc_stat("intr 1 2 3\n", ticks_per_s=100)


def _snapshot(wall, busy, ours, steal=0.0, load=1.0):
    return Snapshot(wall_s=wall, cpu=CpuTimes(busy, steal, cores=2), ours_s=ours, load_average=load)


def test_others_cpu_is_the_machines_busy_time_less_the_workers_plus_steal():
    # 10 s on 2 cores: the machine was busy 15 s, 12 of them the workers'; 1 s stolen by the hypervisor
    load = load_between(_snapshot(100, 500, 40, steal=2), _snapshot(110, 515, 52, steal=3, load=2.5))
    assert load.capacity_s == 20
    assert load.ours_s == pytest.approx(12)
    assert load.others_s == pytest.approx(3 + 1)
    assert load.others_share == pytest.approx(0.2)
    assert load.contended and load.load_average == 2.5
    assert "CONTENDED" in load.describe() and "20%" in load.describe()


def test_a_round_where_only_the_workers_ran_is_not_contended():
    # rusage and /proc/stat tick differently: the workers may seem to use a little more than the machine did
    load = load_between(_snapshot(0, 100, 10), _snapshot(10, 117.9, 28))
    assert load.others_s == 0.0 and not load.contended
    assert "CONTENDED" not in load.describe()


def test_the_contended_threshold_is_a_share_of_the_rounds_capacity():
    just_under = Load(10, 20, 18, CONTENDED * 20 - 0.01, 0, 1)
    just_over = Load(10, 20, 18, CONTENDED * 20 + 0.01, 0, 1)
    assert not just_under.contended and just_over.contended


def _load(contended: bool) -> Load:
    return Load(10, 20, 16, 5.0 if contended else 0.5, 0, 1)


def test_medians_are_over_the_uncontended_rounds_when_there_are_enough():
    kept, line = rounds_to_summarize([_load(False), _load(True), _load(False), _load(False), _load(True)])
    assert kept == [0, 2, 3]
    assert line.startswith("2 of 5 rounds contended") and "the 3 uncontended rounds" in line


def test_too_few_uncontended_rounds_keep_every_round_and_say_so():
    kept, line = rounds_to_summarize([_load(True), _load(False), _load(True)])
    assert kept == [0, 1, 2]
    assert "2 of 3 rounds contended" in line and "fewer than 3 uncontended" in line


def test_no_contended_round_keeps_every_round():
    kept, line = rounds_to_summarize([_load(False)] * 4)
    assert kept == [0, 1, 2, 3] and line.startswith("0 of 4 rounds contended")


class Decoder:
    """A token stream that counts the steps it was asked for, as llama-cpp-python's generate() runs a decode
    step before it yields each token after the first."""

    def __init__(self):
        self.steps = 0

    def generate(self):
        while True:
            self.steps += 1
            yield self.steps


def test_take_asks_the_stream_for_exactly_n_tokens():
    decoder = Decoder()
    assert list(take(decoder.generate(), 5)) == [1, 2, 3, 4, 5]
    assert decoder.steps == 5
    zipped = Decoder()
    list(token for token, _ in zip(zipped.generate(), range(5)))  # the count peers.py had
    assert zipped.steps == 6


def test_take_of_nothing_asks_for_nothing():
    decoder = Decoder()
    assert list(take(decoder.generate(), 0)) == [] and decoder.steps == 0


def test_timed_counts_the_tokens_the_stream_gave():
    assert timed(iter(range(3)), 10).tokens == 3  # a stream that stopped early (an end token)
    decoder = Decoder()
    timing = timed(decoder.generate(), 128)
    assert timing.tokens == 128 and decoder.steps == 128
    assert timing.decode_tok_s == pytest.approx(127 / timing.rest_s)


def test_a_stream_without_a_decode_step_is_an_error_not_a_division_by_zero():
    with pytest.raises(RuntimeError, match="gave 1 token"):
        timed(iter([7]), 128)
