"""Several tokens per pass against one: tokens per second, acceptance and passes per token, per task and mode, on
one package, in one process, the modes taking turns within each round.

    python benchmarks/speculative.py PKG [--draft DRAFT] [--rounds 3] [--tokens 64] [--items 40]
                                         [--tasks schema,quote,extract,open] [--modes off,auto,ngram,draft]
                                         [--option no_repeat_ngram_size=3 ...]
    python benchmarks/speculative.py PKG --exactness 200 [--tokens 32]
    python benchmarks/speculative.py PKG --draft DRAFT --cost-ratio [--acceptance 0.6]
    python benchmarks/speculative.py PKG --pass-cost [--rounds 5]

benchmarks/speculative_figures.py builds the packages and runs this once per figure of docs/performance.md.

Tasks (greedy, prompts cut to the context from the left):
- schema: a JSON schema whose output is mostly forced (fixed keys, long enum words, an array of --items enum
  words): "off" against "auto" (the grammar's forced tokens in one pass) and "ngram";
- quote: a passage, then the request to repeat it, and its first words: prompt lookup's best case;
- extract: a document, then its fields as JSON (the values are spans of the document);
- open: open-ended continuation, where prompt lookup should switch itself off (the target: >= 0.97x).
With --draft, each task also runs "draft" (load(PKG, draft=DRAFT)). --option KEY=VALUE (repeatable; VALUE as
JSON) adds a generation option to every call of every mode, as a user's settings would: no_repeat_ngram_size=3
or repetition_penalty=1.3 keep a small model that loops under plain greedy writing varied text, where the "open"
task exercises the off-switches.

Printed: one JSON line per task and mode: tokens/s (the median over rounds of generated tokens over the
call's wall time), its ratio to "off" (the median of the rounds' ratios), acceptance, passes per token, and
whether the tokens equal "off"'s (greedy with speculation is token-identical unless a near-tie flips).

--exactness N: N prompts (slices of the passage) decoded greedily with "off" and "ngram" ("draft" with --draft:
the package itself as its own draft makes every pass as wide as the draft); printed: tokens drafted, how many
outputs differ and, for those, where they first do: a kernel whose multi-row path sums in another order can
flip a near-tie. No figures are asserted here; tests never time anything.

--cost-ratio: the seconds of one decode step of DRAFT over one of PKG (batch 1, medians of --rounds x 32 steps
after a 64-token prompt), and from it the speed-up a draft of length k can give at an acceptance rate a per
token (Leviathan et al. 2023: (1 - a^(k+1)) / ((1 - a)(k c + 1)), c the cost ratio), for --acceptance (default:
0.5, 0.6, 0.7, 0.8) and k from 1 to 8: what a pair of real shapes (distilgpt2 drafting gpt2-large, SmolLM2-135M
drafting SmolLM2-1.7B, Qwen2.5-0.5B drafting 1.5B: benchmarks/random_checkpoint.py builds them) lets users expect
from the acceptance a trained pair measures.

--pass-cost: the seconds of a verify pass of k + 1 tokens (the row's last token and k proposed) at batch 1 over
those of a one-token step, for k from 1 to 16, after a 64-token prompt (medians of --rounds x 32 passes): what
a proposal the model refuses costs, the figure prompt lookup's off-switch weighs (runtime/speculative/ngram.py).

Every run prints first the CPU, the load average and its command line (one JSON line).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from edgelm.runtime.model import load
from edgelm.runtime.speculative import AUTO_NGRAM

PASSAGE = (
    "The lighthouse at the end of the northern pier was built in 1873 from granite quarried on the island. "
    "Its lamp was first lit with whale oil, then with kerosene, and from 1921 with an electric bulb fed by a cable "
    "laid along the sea floor. The keeper's cottage, a low stone house with a slate roof, still stands beside it, "
    "and the logbooks of the three families who kept the light are held in the town library. Storms damaged the "
    "gallery in 1896 and again in 1953; both times the ironwork was recast in the same foundry in Leith."
)
DOCUMENT = (
    "Invoice 20417. Issued 14 March 2026 by Harbour Supplies Ltd, 12 Quay Street, Aberdeen, to Northern Light "
    "Trust. Items: 40 granite blocks at 85 pounds each; 2 brass lamp housings at 310 pounds each. Total due: "
    "4,020 pounds, payable within 30 days to account 80-41-22 00917345."
)
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo"]
ENUM_WORDS = [f"{w}-{v}" for w in WORDS for v in ("north", "south", "east", "west")]
OPTIONS = {}  # --option: generation options added to every call


def schema(items: int) -> dict:
    """Fixed keys, long enum values and `items` enum words: most of the output is forced by the grammar."""
    return {
        "type": "object",
        "properties": {
            "station": {"enum": ["northern pier lighthouse", "southern breakwater beacon"]},
            "status": {"const": "operational"},
            "inspection": {"enum": ["annual structural inspection", "quarterly lamp inspection"]},
            "codes": {"type": "array", "items": {"enum": ENUM_WORDS}, "minItems": items, "maxItems": items},
        },
        "required": ["station", "status", "inspection", "codes"],
        "additionalProperties": False,
    }


def tasks(items: int) -> dict:
    """task -> (prompt, options)."""
    return {
        "schema": ("Inspection record as JSON: ", dict(json_schema=schema(items))),
        "quote": (f"{PASSAGE}\n\nRepeat the passage above word for word.\n\nThe lighthouse at the end", {}),
        "extract": (
            f"{DOCUMENT}\n\nThe invoice's fields as JSON: "
            '{"number": "20417", "issued": "14 March 2026", "seller": "',
            {},
        ),
        "open": ("Once upon a time, in a village by the sea,", {}),
    }


def run(model, prompt: str, mode: str, tokens: int, options: dict) -> dict:
    start = time.perf_counter()
    done = model.generate(prompt, max_new_tokens=tokens, speculative=mode, truncate=True, **options, **OPTIONS)
    seconds = time.perf_counter() - start
    stats = done.speculation or {}
    return {
        "tokens/s": len(done.token_ids) / seconds,
        "tokens": done.token_ids,
        "acceptance": stats.get("acceptance_rate"),
        "passes/token": (stats.get("passes", len(done.token_ids) - 1) + 1) / max(1, len(done.token_ids)),
    }


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as lines:
            for line in lines:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header() -> None:
    """The machine and the command, printed before the figures they belong to."""
    line = {"cpu": cpu_model(), "cores": os.cpu_count(), "load average": os.getloadavg()}
    print(json.dumps(line | {"command": " ".join(["python", *sys.argv])}), flush=True)


def speeds(model, args, modes: list) -> None:
    chosen = tasks(args.items)
    for task, (prompt, options) in ((t, chosen[t]) for t in args.tasks):
        # auto differs from ngram under a constraint only (without AUTO_NGRAM: from off)
        task_modes = [m for m in modes if m != "auto" or options or AUTO_NGRAM]
        for mode in task_modes:  # warm: the grammar compiled, onnxruntime's buffers for each pass width made
            run(model, prompt, mode, args.tokens, options)
        rounds = []
        for _ in range(args.rounds):
            rounds.append({mode: run(model, prompt, mode, args.tokens, options) for mode in task_modes})
        for mode in task_modes:
            last = rounds[-1][mode]
            line = {
                "task": task,
                "mode": mode,
                "tokens/s": round(statistics.median(r[mode]["tokens/s"] for r in rounds), 2),
                "vs off": round(statistics.median(r[mode]["tokens/s"] / r["off"]["tokens/s"] for r in rounds), 3),
                "acceptance": last["acceptance"],
                "passes/token": round(last["passes/token"], 3),
                "tokens": len(last["tokens"]),
                "same tokens as off": all(r[mode]["tokens"] == r["off"]["tokens"] for r in rounds),
            }
            print(json.dumps(line), flush=True)


def exactness(model, args) -> None:
    ids = model.encode(PASSAGE)
    room = model.arch.n_positions - args.tokens
    differ, drafted, mode = [], 0, "draft" if args.draft else "ngram"
    for i in range(args.exactness):
        start = (i * 7) % max(1, len(ids) - 8)
        prompt = ids[start : start + max(4, min(room, 8 + i % 32))]
        plain = model.generate([prompt], max_new_tokens=args.tokens, speculative="off", **OPTIONS)[0].token_ids
        done = model.generate([prompt], max_new_tokens=args.tokens, speculative=mode, **OPTIONS)[0]
        fast, drafted = done.token_ids, drafted + done.speculation["drafted"]
        if plain != fast:
            differ.append(next(j for j, (a, b) in enumerate(zip(plain + [-1], fast + [-2])) if a != b))
    line = {"mode": mode, "prompts": args.exactness, "drafted": drafted}
    print(json.dumps(line | {"outputs that differ": len(differ), "first difference at": differ}))


def random_prompt(model) -> list:
    """64 token ids drawn from the vocabulary (seeded): the prompt the step timings decode after."""
    return [int(i) for i in np.random.default_rng(0).integers(0, model.arch.vocab_size - 1, size=64)]


def step_seconds(model, rounds: int) -> float:
    """Median seconds of one batch-1 decode step after a 64-token prompt (32 steps a round, greedy)."""
    prompt = random_prompt(model)
    times = []
    for _ in range(rounds + 1):  # the first is a warm-up
        started = time.perf_counter()
        model.generate([prompt], max_new_tokens=33, ignore_eos=True, speculative="off")
        middle = time.perf_counter()
        model.generate([prompt], max_new_tokens=1, ignore_eos=True, speculative="off")
        times.append(((middle - started) - (time.perf_counter() - middle)) / 32)  # the 32 steps after the first
    return statistics.median(times[1:])


def cost_ratio(model, args) -> None:
    """The draft's step over the target's, and the speed-ups it allows (see the module docstring)."""
    target, draft = step_seconds(model, args.rounds), step_seconds(model.draft, args.rounds)
    c = draft / target
    print(json.dumps({"target step s": round(target, 5), "draft step s": round(draft, 5), "cost ratio": round(c, 4)}))
    for a in args.acceptance or [0.5, 0.6, 0.7, 0.8]:
        gains = {k: round((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)), 3) for k in range(1, 9)}
        best = max(gains, key=gains.get)
        print(json.dumps({"acceptance": a, "expected speed-up by draft length": gains, "best length": best}))


def pass_cost(model, args) -> None:
    """Verify passes of k + 1 tokens against one-token steps, at batch 1 (see the module docstring)."""
    from edgelm.runtime.engine.steps import prefill_inputs
    from edgelm.runtime.engine.verify_pass import VerifyPasses

    prompt = random_prompt(model)
    decoder = model.engine.decoder(1, capacity=len(prompt) + 32)
    decoder.run(*prefill_inputs([prompt], 0))
    passes, cached = VerifyPasses(decoder), len(prompt)
    widths = [1, 2, 3, 4, 5, 6, 8, 12, 17]

    def seconds(width: int) -> float:
        tokens = prompt[:width]
        times = []
        for _ in range(args.rounds + 1):  # the first is a warm-up
            started = time.perf_counter()
            for _ in range(32):
                passes.rewind(cached)
                passes.run(tokens, cached)
            times.append((time.perf_counter() - started) / 32)
        return statistics.median(times[1:])

    one = seconds(1)
    costs = {width - 1: round(seconds(width) / one, 3) for width in widths[1:]}
    print(json.dumps({"one-token step s": round(one, 6), "verify pass cost over a step, by k proposed": costs}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package")
    parser.add_argument("--draft", help="a draft package of the same tokenizer: adds the 'draft' mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per call")
    parser.add_argument("--items", type=int, default=40, help="enum words in the schema's array")
    parser.add_argument("--exactness", type=int, default=0, metavar="N", help="count outputs that differ instead")
    parser.add_argument("--tasks", default="schema,quote,extract,open", help="comma-separated tasks to run")
    parser.add_argument("--modes", help="comma-separated modes (default: off,auto,ngram and draft with --draft)")
    parser.add_argument("--cost-ratio", action="store_true", help="time the draft's step against PKG's instead")
    parser.add_argument("--pass-cost", action="store_true", help="time verify passes of k + 1 tokens instead")
    parser.add_argument("--acceptance", type=float, action="append", help="acceptance rate for --cost-ratio")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a generation option for every call (VALUE as JSON), e.g. no_repeat_ngram_size=3")
    args = parser.parse_args()
    for option in args.option:
        key, _, value = option.partition("=")
        try:
            OPTIONS[key] = json.loads(value)
        except ValueError:
            parser.error(f"--option {option!r}: write KEY=VALUE with VALUE as JSON, e.g. repetition_penalty=1.3")
    args.tasks = args.tasks.split(",")
    unknown = set(args.tasks) - set(tasks(1))
    if unknown:
        parser.error(f"unknown task {sorted(unknown)[0]!r}: the tasks are {', '.join(tasks(1))}")
    modes = args.modes.split(",") if args.modes else ["off", "auto", "ngram"] + (["draft"] if args.draft else [])
    if "off" not in modes or not set(modes) <= {"off", "auto", "ngram", "draft"}:
        parser.error("--modes takes off (always: the others are compared with it), auto, ngram and draft")
    if ("draft" in modes or args.cost_ratio) and not args.draft:
        parser.error("the draft mode and --cost-ratio need --draft DRAFT")
    header()
    model = load(args.package, draft=args.draft)
    if args.pass_cost:
        pass_cost(model, args)
    elif args.cost_ratio:
        cost_ratio(model, args)
    elif args.exactness:
        exactness(model, args)
    else:
        speeds(model, args, modes)


if __name__ == "__main__":
    main()
