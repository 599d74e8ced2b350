"""Several tokens per pass against one: tokens per second, acceptance and passes per token, per task and mode, on
one package, in one process, the modes taking turns within each round.

    python benchmarks/speculative.py PKG [--draft DRAFT] [--rounds 3] [--tokens 64] [--items 40]
    python benchmarks/speculative.py PKG --exactness 200 [--tokens 32]

Tasks (greedy, prompts cut to the context from the left):
- schema: a JSON schema whose output is mostly forced (fixed keys, long enum words, an array of --items enum
  words): "off" against "auto" (the grammar's forced tokens in one pass) and "ngram";
- quote: a passage, then the request to repeat it, and its first words: prompt lookup's best case;
- extract: a document, then its fields as JSON (the values are spans of the document);
- open: open-ended continuation, where prompt lookup should switch itself off (the target: >= 0.97x).
With --draft, each task also runs "draft" (load(PKG, draft=DRAFT)).

Printed: one JSON line per task and mode: tokens/s (the median over rounds of generated tokens over the
call's wall time), its ratio to "off" (the median of the rounds' ratios), acceptance, passes per token, and
whether the tokens equal "off"'s (greedy with speculation is token-identical unless a near-tie flips).

--exactness N: N prompts (slices of the passage) decoded greedily with "off" and "ngram" ("draft" with --draft:
the package itself as its own draft makes every pass as wide as the draft); printed: tokens drafted, how many
outputs differ and, for those, where they first do: a kernel whose multi-row path sums in another order can
flip a near-tie. No figures are asserted here; tests never time anything.
"""

import argparse
import json
import statistics
import time

from edgelm.runtime.model import load

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
    done = model.generate(prompt, max_new_tokens=tokens, speculative=mode, truncate=True, **options)
    seconds = time.perf_counter() - start
    stats = done.speculation or {}
    return {
        "tokens/s": len(done.token_ids) / seconds,
        "tokens": done.token_ids,
        "acceptance": stats.get("acceptance_rate"),
        "passes/token": (stats.get("passes", len(done.token_ids) - 1) + 1) / max(1, len(done.token_ids)),
    }


def speeds(model, args, modes: list) -> None:
    for task, (prompt, options) in tasks(args.items).items():
        task_modes = [m for m in modes if m != "auto" or options]  # auto differs from off under a constraint only
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
        plain = model.generate([prompt], max_new_tokens=args.tokens, speculative="off")[0].token_ids
        done = model.generate([prompt], max_new_tokens=args.tokens, speculative=mode)[0]
        fast, drafted = done.token_ids, drafted + done.speculation["drafted"]
        if plain != fast:
            differ.append(next(j for j, (a, b) in enumerate(zip(plain + [-1], fast + [-2])) if a != b))
    line = {"mode": mode, "prompts": args.exactness, "drafted": drafted}
    print(json.dumps(line | {"outputs that differ": len(differ), "first difference at": differ}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package")
    parser.add_argument("--draft", help="a draft package of the same tokenizer: adds the 'draft' mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per call")
    parser.add_argument("--items", type=int, default=40, help="enum words in the schema's array")
    parser.add_argument("--exactness", type=int, default=0, metavar="N", help="count outputs that differ instead")
    args = parser.parse_args()
    model = load(args.package, draft=args.draft)
    if args.exactness:
        exactness(model, args)
        return
    speeds(model, args, ["off", "auto", "ngram"] + (["draft"] if args.draft else []))


if __name__ == "__main__":
    main()
