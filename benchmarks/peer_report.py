"""The tables benchmarks/peers.py prints: each system's medians, edgelm's ratios to its peers, sampled decode."""


def format_table(table: dict, failed: dict, heading: str) -> str:
    """table: system -> {figure: median}; failed: system -> why it was not measured; heading: the run's settings."""
    lines = [
        heading,
        "| system | decode tok/s | decode CPU ms/token | first token after 512 (ms) | decode after 512 tok/s | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for system, row in table.items():
        lines.append(
            f"| {system} | {row['decode_tok_s']:.1f} | {row['decode_cpu_ms']:.1f} | {row['ttft_512_ms']:.0f} | {row['decode_after_512_tok_s']:.1f} | {row['peak_rss_mb']:.0f} |"
        )
    ratios = [("edgelm-fp32", "transformers-fp32", "decode_tok_s"), ("edgelm-fp32", "llama.cpp-f32", "decode_tok_s")]
    for bits in ("int8", "int4"):
        ratios += [(f"edgelm-{bits}", f"genai-{bits}", key) for key in ("decode_tok_s", "decode_cpu_ms", "ttft_512_ms")]
    for cache in ("", "-kv8"):
        ratios += [
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_tok_s"),
            (f"edgelm-int4{cache}", "llama.cpp-q4_0", "decode_tok_s"),
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_cpu_ms"),
            (f"edgelm-int4{cache}", "llama.cpp-q4_0", "decode_cpu_ms"),
            (f"edgelm-int8{cache}", "llama.cpp-q8_0", "decode_after_512_tok_s"),
            (f"edgelm-int8{cache}", "ct2-int8", "ttft_512_ms"),
            (f"edgelm-int8{cache}", "ct2-int8", "peak_rss_mb"),
        ]
    lines.append("")
    for ours, peer, key in ratios:
        peers = [table[p][key] for p in (peer, peer + "-nofa") if p in table]  # llama.cpp at its best setting
        if ours in table and peers:
            lower_is_better = key in ("ttft_512_ms", "peak_rss_mb", "decode_cpu_ms")
            best = min(peers) if lower_is_better else max(peers)
            if key == "decode_cpu_ms":  # as a speed: the peer's CPU per token over ours
                lines.append(f"{ours} / {peer} decode per CPU second: {best / table[ours][key]:.2f}x")
            else:
                lines.append(f"{ours} / {peer} {key}: {table[ours][key] / best:.2f}x")
    for system, why in failed.items():
        lines.append(f"not measured: {system}: {why}")
    return "\n".join(lines)


def format_sampled_table(table: dict, sampled: list, new_tokens: int) -> str:
    """Decode tok/s per sampled setting and its ratio to the same worker's greedy rate; edgelm over llama.cpp."""
    keys = [key for key, _ in sampled]
    rows = {s: row for s, row in table.items() if all(f"{k}_tok_s" in row for k in keys)}
    if not rows or not keys:  # --greedy-only
        return ""
    lines = [
        "",
        f"sampled decode, batch 1, {new_tokens} tokens: tok/s (x the same worker's greedy rate)",
        "| system | greedy | " + " | ".join(keys) + " |",
        "| --- " * (len(keys) + 2) + "|",
    ]
    for system, row in rows.items():
        cells = [f"{row[f'{k}_tok_s']:.1f} ({row[f'{k}_over_greedy']:.2f}x)" for k in keys]
        lines.append(f"| {system} | {row['decode_tok_s']:.1f} | " + " | ".join(cells) + " |")
    for ours, peer in (
        ("edgelm-int8", "llama.cpp-q8_0"),
        ("edgelm-int4", "llama.cpp-q4_0"),
        ("edgelm-fp32", "llama.cpp-f32"),
    ):
        if ours in rows and peer in rows:
            ratios = ", ".join(f"{k} {rows[ours][f'{k}_tok_s'] / rows[peer][f'{k}_tok_s']:.2f}x" for k in keys)
            lines.append(f"{ours} / {peer} sampled decode: {ratios}")
    return "\n".join(lines)
