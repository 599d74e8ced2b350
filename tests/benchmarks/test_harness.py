"""benchmarks/harness.py: the sampled settings timed against greedy, step by step in turns."""

import json


def test_the_harness_times_each_sampled_setting_against_greedy(tiny_package):
    from harness import SAMPLED, format_sample_table, run_sample_bench

    figures = json.loads(json.dumps(run_sample_bench(tiny_package, threads=1, runs=1)))  # what --json prints
    assert figures["new_tokens"] == 56  # a 64-position model: 8 prompt tokens leave room for 56
    for key, _, _ in SAMPLED:
        assert figures[f"{key}_tok_s"] > 0 and figures[f"{key}_over_greedy"] > 0
        assert figures[f"{key}_median_step_tok_s"] > 0 and figures[f"{key}_median_step_over_greedy"] > 0
    assert figures["greedy_over_greedy"] == 1.0 and figures["greedy_median_step_over_greedy"] == 1.0
    table = format_sample_table(figures)  # what the script prints without --json
    for label in ("top_p 0.9", "top_k 50, temperature 1 (transformers' defaults)", "x greedy", "median step"):
        assert label in table
    top_p = next(line for line in table.splitlines() if "top_p 0.9" in line)
    assert f"{figures['top_p_0.9_median_step_over_greedy']:5.2f}x greedy" in top_p


def test_the_sampled_settings_take_turns_step_by_step(monkeypatch):
    # each setting's decode advances one step at a time, every setting once per turn, in orders where each follows
    # every other about as often, and each step's time is credited to the setting that took it
    import harness

    order, clock = [], [0.0]
    cost = {"a": 1.0, "b": 10.0, "c": 100.0}

    def decode(model, prompts, new_tokens, options, seed):
        for step in range(new_tokens):
            order.append((options["name"], step))
            clock[0] += cost[options["name"]]
            yield step

    monkeypatch.setattr(harness, "exact_decode", decode)
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    settings = [(key, {"name": key}) for key in "abc"]
    steps = harness.lockstep_steps(None, [1, 2], 301, settings)
    assert steps == {key: [cost[key]] * 300 for key in "abc"}
    assert order[:3] == [("a", 0), ("b", 0), ("c", 0)]  # the prompt's pass, then turns
    turns = [order[3 + 3 * i : 6 + 3 * i] for i in range(300)]
    assert all(sorted(key for key, _ in turn) == list("abc") for turn in turns)
    assert all({step for _, step in turn} == {i + 1} for i, turn in enumerate(turns))
    keys = [key for key, _ in order[3:]]
    follows = {(x, y): 0 for x in "abc" for y in "abc" if x != y}
    for x, y in zip(keys, keys[1:]):
        if x != y:
            follows[x, y] += 1
    assert min(follows.values()) > 0.6 * max(follows.values())  # no setting mostly follows one other
