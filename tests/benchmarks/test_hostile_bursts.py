"""benchmarks/hostile_bursts.py: the samples of several bursts of one kind read together."""


def watch_with(health, gaps):
    import hostile_bursts

    watch = hostile_bursts.Watch.__new__(hostile_bursts.Watch)  # the samples alone, no threads
    watch.health, watch.gaps = health, gaps
    return watch


def test_pooled_percentiles_cover_every_burst_and_nothing_between_them():
    import hostile_bursts

    # two bursts, [0, 10] and [20, 30]: 100 gaps of 10 ms inside them, one of 500 ms between them (not theirs)
    gaps = [(t * 0.2, 0.010) for t in range(50)] + [(20 + t * 0.2, 0.010) for t in range(50)] + [(15.0, 0.5)]
    health = [(1.0, 0.002), (25.0, 0.150)]
    figures = hostile_bursts.pooled(watch_with(health, gaps), [(0, 10), (20, 30)])
    assert figures["stream_gap"] == {"n": 100, "p50_ms": 10.0, "p99_ms": 10.0, "max_ms": 10.0}
    assert figures["health"]["n"] == 2 and figures["health"]["max_ms"] == 150.0
    assert figures["bursts_over_100_ms"] == {"health": 1, "stream_gap": 0}


def test_one_slow_gap_in_two_hundred_is_the_worst_not_the_99th_percentile():
    import hostile_bursts

    gaps = [(t * 0.05, 0.020) for t in range(199)] + [(5.0, 0.109)]
    figures = hostile_bursts.pooled(watch_with([], gaps), [(0, 4.99), (4.99, 10)])
    assert figures["stream_gap"]["p99_ms"] == 20.0 and figures["stream_gap"]["max_ms"] == 109.0
    assert figures["bursts_over_100_ms"]["stream_gap"] == 1
    assert figures["health"] == {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
