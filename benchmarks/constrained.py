"""Constrained decoding's cost: schema compile time, decode speed and first token under a JSON schema against
unconstrained decoding, on one package, in one process, interleaved.

    python benchmarks/constrained.py PKG [--rounds 5] [--tokens 64] [--prompt-tokens 64]

PKG: distilgpt2's shape, int8 (tools/distilgpt2_checkpoint.py OUT, then
`edgelm export OUT --quantize int8 -o PKG`). Printed:

- compile: per schema of SCHEMAS, the median over rounds of a cold compile (settings checked, grammar built, its
  first mask computed; llguidance's tokenizer, built once per process, reported apart), and the schema's size;
- decode: at batch 1 and 16, sampled (temperature 1, top_k 0), the median time of a decode step over the steps
  in which every row is still running, as tokens per second, constrained ("notes": an array of unbounded strings,
  the dense masks a string needs, which a random model keeps writing) and not, taking turns within each round;
  the ratio is the median of the rounds' ratios (above 0.9 is the target); and the same per CPU second of the
  process (every thread's, the mask thread's included), which a loaded machine disturbs less than the clock;
- first token: the time from the call to the first token (prefill, the first mask, the pick), the grammar already
  compiled (a repeated schema) and cold, over a PROMPT_TOKENS-token prompt; ratio to the unconstrained one.

No text is decoded (the same for both): the loop is a fixed batch's steps on ids (id_steps), with the Batch's grammars.
"""

import argparse
import json
import time

import numpy as np
from edgelm.runtime.batching.step import id_steps
from edgelm.runtime.model import load
from edgelm.runtime.sampling import constraint

NOTES = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
    "required": ["notes"],
}
ADDRESS = {
    "type": "object",
    "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
    "required": ["street", "city"],
}
SCHEMAS = {
    "notes (array of strings)": NOTES,
    "person (enum, range, format, optional)": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
            "role": {"enum": ["admin", "user", "guest"]},
            "born": {"type": "string", "format": "date"},
        },
        "required": ["name", "age", "role"],
        "additionalProperties": False,
    },
    "order ($defs, nested arrays, anyOf)": {
        "$defs": {
            "address": ADDRESS,
            "item": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
            },
        },  # fmt: skip
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
            "ship_to": {"$ref": "#/$defs/address"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 50},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["id", "ship_to", "items"],
    },
    "tool call (OpenAI-style function arguments)": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and country"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["location", "unit"],
        "additionalProperties": False,
    },
}


def cold_compile(model, schema) -> float:
    """Seconds from the options to a row's first mask, with llguidance's caches emptied (its tokenizer kept)."""
    constraint._grammar_texts.clear()
    constraint._compiled.clear()
    started = time.perf_counter()
    grammar = model.compile_constraint(model.settings(json_schema=schema, max_new_tokens=64))
    masks = constraint.Masks(1, model.arch.vocab_size)
    masks.start([grammar.row()])
    masks.wait()
    return time.perf_counter() - started


def run(model, prompts, config):
    """(seconds to the first token, step seconds while every row runs, and the process's CPU seconds in those steps,
    every thread's: onnxruntime's and the mask thread's) for one call."""
    batch = model.batch(prompts, config)
    started = time.perf_counter()
    steps = id_steps(model.engine, batch.prompts, batch.config, model.pad_id, grammars=batch.grammars)
    stamps, cpu, full = [], [], []
    for tokens, _ in steps:
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
        full.append(bool((tokens >= 0).all()))
    gaps = [b - a for a, b, every in zip(stamps, stamps[1:], full[1:]) if every]
    cpu_gaps = [b - a for a, b, every in zip(cpu, cpu[1:], full[1:]) if every]
    return stamps[0] - started, gaps, cpu_gaps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    args = parser.parse_args()
    model = load(args.package)
    started = time.perf_counter()
    model.compile_constraint(model.settings(json_schema=NOTES))  # llguidance's tokenizer, once per process
    tokenizer_s = time.perf_counter() - started

    compile_s = {name: [] for name in SCHEMAS}
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.arch.vocab_size - 1, args.prompt_tokens).tolist()
    common = dict(max_new_tokens=args.tokens, do_sample=True, top_k=0, ignore_eos=True)
    plain = model.settings(**common)
    schema = model.settings(json_schema=NOTES, **common)
    decode, decode_cpu, first = {}, {}, {}  # (batch, mode) -> per-round medians
    run(model, [prompt], plain)  # warm-up
    run(model, [prompt], schema)
    for r in range(args.rounds):
        for name, s in SCHEMAS.items():
            compile_s[name].append(cold_compile(model, s))
        for size in (1, 16):
            modes = ("plain", "schema") if r % 2 == 0 else ("schema", "plain")
            for mode in modes:
                config = (plain if mode == "plain" else schema).with_options(seed=r)
                first_s, gaps, cpu_gaps = run(model, [prompt] * size, config)
                decode.setdefault((size, mode), []).append(size / np.median(gaps))
                decode_cpu.setdefault((size, mode), []).append(size / np.median(cpu_gaps))
                if size == 1:
                    first.setdefault(mode, []).append(first_s)
        constraint._compiled.clear()  # the first token with a cold grammar
        constraint._grammar_texts.clear()
        first_s, _, _ = run(model, [prompt], model.settings(json_schema=NOTES, **common, seed=r))
        first.setdefault("schema, cold", []).append(first_s)

    print(f"{args.package}: {args.rounds} rounds, {args.tokens} new tokens, prompt {args.prompt_tokens} tokens")
    print(f"  llguidance tokenizer from tokenizer.json: {tokenizer_s * 1e3:.0f} ms (once per process)")
    for name, s in SCHEMAS.items():
        size = len(json.dumps(s))
        print(f"  compile {name:<45} {size:5d} chars  {np.median(compile_s[name]) * 1e3:7.1f} ms")
    for size in (1, 16):
        ratios = np.array(decode[size, "schema"]) / np.array(decode[size, "plain"])
        print(
            f"  decode batch {size:2d}: unconstrained {np.median(decode[size, 'plain']):7.1f} tok/s, json_schema "
            f"{np.median(decode[size, 'schema']):7.1f} tok/s, ratio {np.median(ratios):.3f} (rounds {ratios.min():.3f}-{ratios.max():.3f})"
        )
    for size in (1, 16):
        ratios = np.array(decode_cpu[size, "schema"]) / np.array(decode_cpu[size, "plain"])
        print(
            f"  decode batch {size:2d} per CPU second (all threads): unconstrained {np.median(decode_cpu[size, 'plain']):7.1f} "
            f"tok, json_schema {np.median(decode_cpu[size, 'schema']):7.1f} tok, ratio {np.median(ratios):.3f} "
            f"(rounds {ratios.min():.3f}-{ratios.max():.3f})"
        )
    for mode in ("schema", "schema, cold"):
        ratios = np.array(first[mode]) / np.array(first["plain"])
        print(
            f"  first token: unconstrained {np.median(first['plain']) * 1e3:6.1f} ms, json_schema ({mode}) "
            f"{np.median(first[mode]) * 1e3:6.1f} ms, ratio {np.median(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
