"""The graph's sampling outputs against the sampler's own pass over the logits, on one package, in one process.

    python benchmarks/sampling_outputs.py PKG [--rounds 5] [--tokens 128]

PKG must have the sampling outputs (docs/package-format.md). For each setting of harness.SAMPLED, decodes at
batch 1 with the outputs made and used ("outputs") and with none made ("numpy": the sampler computes from the
logits, as for a graph without them), interleaved within every round. Printed per setting and
mode: the sampler chain's median time per step, the graph pass's median time per decode step, and the median
time between tokens, with the speed ratio to greedy (greedy's median time over the setting's: medians of
per-round ratios; below 1 is slower). For the penalties the two modes decode different tokens from the same
seed: the draw from the outputs keeps or refuses a penalized token with a second uniform. Then the graph pass alone: the
same decode pass (one token at one position, over the same cache) again and again, alternating between the
outputs made for its row and made for none, and the difference of the medians.
"""

import argparse
import time

import numpy as np
from edgelm.runtime.engine import decode as engine
from edgelm.runtime.model import load
from edgelm.runtime.sampling import SamplerChain
from harness import SAMPLED, prompt_ids, timed_tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    model = load(args.package)
    if not model.engine.io.has_sampling:
        raise SystemExit(f"{args.package} has no sampling outputs: export it again with this edgelm")
    chain_ns, pass_ns, current = {}, {}, {"key": ("warm-up", "outputs")}

    class Timed(SamplerChain):
        def __call__(self, *call):
            started = time.perf_counter_ns()
            try:
                return super().__call__(*call)
            finally:
                chain_ns.setdefault(current["key"], []).append(time.perf_counter_ns() - started)

    one_pass, set_temperatures = engine.InPlaceDecoder._pass, engine.InPlaceDecoder.set_temperatures

    def timed_pass(self, input_ids, *rest):
        started = time.perf_counter_ns()
        one_pass(self, input_ids, *rest)
        if input_ids.shape[1] == 1:  # decode steps only
            pass_ns.setdefault(current["key"], []).append(time.perf_counter_ns() - started)

    def outputs_or_none(self, temperatures):  # "numpy": the graph makes no outputs, as one without them
        set_temperatures(self, temperatures if current["key"][1] == "outputs" else None)

    engine.SamplerChain, engine.InPlaceDecoder._pass = Timed, timed_pass
    engine.InPlaceDecoder.set_temperatures = outputs_or_none
    timed_tokens(model, [prompt_ids(model, 8)], 8)  # warm-up
    steps = {}  # (setting, mode) -> median seconds between tokens, per round
    for r in range(args.rounds):
        for key, _, options in SAMPLED[r % len(SAMPLED) :] + SAMPLED[: r % len(SAMPLED)]:
            for mode in ("outputs", "numpy") if r % 2 == 0 else ("numpy", "outputs"):
                current["key"], gaps = (key, mode), []
                timed_tokens(model, [prompt_ids(model, 8, r)], args.tokens, options, seed=r, steps=gaps)
                steps.setdefault((key, mode), []).append(np.median(gaps))
    print(
        f"{args.package}: batch 1, {args.tokens} new tokens, {args.rounds} rounds; medians (sampler chain per step, "
        "graph pass per decode step, time between tokens and its ratio to greedy's)"
    )
    for key, label, _ in SAMPLED:
        for mode in ("numpy", "outputs"):
            ratio = np.median(np.array(steps["greedy", mode]) / np.array(steps[key, mode]))
            print(
                f"  {label:<50} {mode:<8} chain {np.median(chain_ns[key, mode]) / 1e3:6.0f} us   pass "
                f"{np.median(pass_ns[key, mode]) / 1e3:6.0f} us   step {np.median(steps[key, mode]) * 1e3:6.2f} ms "
                f"{ratio:5.3f}x greedy"
            )
    engine.InPlaceDecoder._pass, engine.InPlaceDecoder.set_temperatures = one_pass, set_temperatures
    made, none = pass_cost(model)
    print(
        f"one decode pass, median of 200 each: outputs made {made * 1e6:.0f} us, none {none * 1e6:.0f} us, "
        f"+{(made - none) * 1e6:.0f} us"
    )


def pass_cost(model, passes: int = 400) -> tuple[float, float]:
    """Median seconds of one decode pass with the sampling outputs made for its row, and made for none."""
    decoder = model.engine.decoder(1, 16)
    prompt = np.array([prompt_ids(model, 8)])
    decoder.run(prompt, np.ones_like(prompt), np.arange(8)[None])
    token, mask, position = np.array([[1]]), np.ones((1, 9), dtype=np.int64), np.array([[8]])
    times = {True: [], False: []}
    for i in range(passes):
        made = i % 2 == 0
        decoder.set_temperatures(1.0 if made else None)
        started = time.perf_counter_ns()
        decoder.run(token, mask, position)  # writes the same cache row each time
        times[made].append(time.perf_counter_ns() - started)
    return np.median(times[True]) / 1e9, np.median(times[False]) / 1e9


if __name__ == "__main__":
    main()
