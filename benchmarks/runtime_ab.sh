#!/usr/bin/env bash
# edgelm bench, alternating two checkouts' runtimes on one package: OLD and NEW are the checkouts (each with its
# own .venv), PKG the package. Prints, per round, each figure as (old, new, new/old).
# usage: OLD=../edgelm-old NEW=. PKG=models/distilgpt2-int8 bash benchmarks/runtime_ab.sh
set -euo pipefail
OUT=$(mktemp -d)
for round in 1 2; do
  "$OLD/.venv/bin/edgelm" bench "$PKG" --json > "$OUT/old_$round.json"
  "$NEW/.venv/bin/edgelm" bench -m "$PKG" --json > "$OUT/new_$round.json"
done
OUT="$OUT" python3 - <<'PY'
import json, os
keys = ["decode_tok_s", "decode_after_896_tok_s", "ttft_8_ms", "ttft_512_ms", "batch_16_over_batch_1", "peak_rss_mb",
        "cold_start_to_first_token_s", "read_gb_s", "decode_fraction_of_ceiling"]
out = os.environ["OUT"]
for r in (1, 2):
    o, n = (json.load(open(f"{out}/{w}_{r}.json")) for w in ("old", "new"))
    print(r, {k: (round(o[k], 3), round(n[k], 3), round(n[k] / o[k], 3)) for k in keys})
PY
