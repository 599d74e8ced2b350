"""Load-test `edgelm serve`: rounds of N concurrent streaming clients against one server; throughput and latencies.

    python benchmarks/server_load.py [PACKAGE] [--clients 1,4,16] [--rounds 4] [--max-tokens 48] [-- SERVE OPTIONS...]
    python benchmarks/server_load.py --url http://127.0.0.1:8000      # an already running server

Starts the server in a subprocess on a free loopback port (unless --url), waits for /health, then for each
client count in turn (same server, same run) has that many clients each send --rounds requests back to back,
with httpx. Each request streams greedy tokens with ignore_eos from a short prompt, so every one costs
max_tokens steps. Prints per client count: generated tokens per second over its wall time (and as a multiple
of the first count's), request latency p50/p95, time to first token p50/p95 and the worst one (first chunk
with text: a request that starves shows there). Then the continuous-batching targets: tokens/s at the largest
count >= 4x one client; first-token p50 at 4 clients <= 2x one client. A benchmark, not a test: nothing is
asserted; failures are counted.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

PROMPTS = ["Hello, my name is", "The quick brown fox", "Once upon a time", "In the beginning", "import numpy as np"]


def start_server(package: str, serve_options: list) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-c",
        "from edgelm.runtime.cli.main import main; main()",
        "serve",
        package,
        "--port",
        str(port),
        *serve_options,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited with {process.returncode}:\n{process.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    sys.exit("the server did not answer /health within 120 s")


def one_request(client: httpx.Client, url: str, index: int, max_tokens: int, headers: dict) -> dict:
    """Stream one completion; returns its latency, time to first token and generated tokens (or an error)."""
    body = {
        "prompt": PROMPTS[index % len(PROMPTS)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = None
    tokens, done = 0, False
    try:
        with client.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=300) as response:
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {response.read()[:200]!r}"}
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return {"error": event["error"]["message"]}
                if first is None and any(c["text"] for c in event["choices"]):
                    first = time.perf_counter() - started
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as error:
        return {"error": f"{type(error).__name__}: {error}"}
    if not done:
        return {"error": "the stream ended without [DONE]"}
    return {"latency": time.perf_counter() - started, "ttft": first, "tokens": tokens}


def percentile(values: list, q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else (values[0] if values else float("nan"))
    )


def run_clients(client: httpx.Client, url: str, clients: int, requests: int, max_tokens: int, headers: dict) -> dict:
    """`requests` streamed requests from `clients` threads; the figures of that run."""
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda i: one_request(client, url, i, max_tokens, headers), range(requests)))
    wall = time.perf_counter() - started
    ok = [r for r in results if "error" not in r]
    failed = [r["error"] for r in results if "error" in r]
    tokens = sum(r["tokens"] for r in ok)
    latencies, ttfts = [r["latency"] for r in ok], [r["ttft"] for r in ok if r["ttft"] is not None]
    return {
        "clients": clients,
        "ok": len(ok),
        "failed": failed,
        "tokens": tokens,
        "wall": wall,
        "tok_s": tokens / wall,
        "latency": (percentile(latencies, 50), percentile(latencies, 95)) if ok else None,
        "ttft": (percentile(ttfts, 50), percentile(ttfts, 95), max(ttfts)) if ttfts else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default=os.path.join("models", "distilgpt2"))
    parser.add_argument(
        "--clients", default="1,4,16", help="concurrent streaming clients: counts run in turn, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=4, help="requests each client sends, one after the other")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per request (greedy, ignore_eos)")
    parser.add_argument("--url", help="use this running server instead of starting one")
    parser.add_argument("--api-key")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    serve_options = argv[split + 1 :]  # after --: options for edgelm serve, e.g. -- --max-batch 8
    counts = [int(c) for c in args.clients.split(",")]

    process, url = (None, args.url) if args.url else start_server(args.package, serve_options)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # One pooled client for all threads: a fresh httpx client per request costs ~50 ms of TLS setup.
    client = httpx.Client(limits=httpx.Limits(max_connections=max(counts)))
    try:
        model = client.get(url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        one_request(client, url, 0, args.max_tokens, headers)  # warm-up, not counted
        runs = [run_clients(client, url, n, n * args.rounds, args.max_tokens, headers) for n in counts]
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)

    print(
        f"model {model}: {args.max_tokens} tokens a request, {args.rounds} requests a client, server {' '.join(serve_options) or 'defaults'}"
    )
    print("  clients  done  tokens/s   x1st  latency p50/p95 ms  first token p50/p95/worst ms")
    for r in runs:
        latency = "%6.0f %6.0f" % tuple(v * 1000 for v in r["latency"]) if r["latency"] else "     -      -"
        ttft = "%6.0f %6.0f %6.0f" % tuple(v * 1000 for v in r["ttft"]) if r["ttft"] else "     -"
        print(
            f"  {r['clients']:7d}  {r['ok']:4d}  {r['tok_s']:8.1f}  {r['tok_s'] / runs[0]['tok_s']:5.2f}  "
            f"{latency}       {ttft}" + (f"   ({len(r['failed'])} failed: {r['failed'][0]})" if r["failed"] else "")
        )
    by_count = {r["clients"]: r for r in runs}
    if 1 in by_count and len(runs) > 1:
        one, most = by_count[1], max(runs, key=lambda r: r["clients"])
        print(f"  {most['clients']} clients / 1: {most['tok_s'] / one['tok_s']:.2f}x tokens/s (target >= 4)")
        if 4 in by_count and one["ttft"] and by_count[4]["ttft"]:
            print(f"  first token p50, 4 clients / 1: {by_count[4]['ttft'][0] / one['ttft'][0]:.2f}x (target <= 2)")
    worst = max((r["ttft"][2] for r in runs if r["ttft"]), default=float("nan"))
    print(f"  worst first token of the run: {worst * 1000:.0f} ms")


if __name__ == "__main__":
    main()
