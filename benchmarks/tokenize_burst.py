"""A burst of large /tokenize requests against `edgelm serve`: the server's resident memory idle, at its peak
and after the burst, and how long /health takes to answer meanwhile.

    python benchmarks/tokenize_burst.py -m PACKAGE [--requests 40] [--body-kb 900] [--python PYTHON]

The package should carry a real tokenizer (tests/conftest.py's gpt2-vocab package: a tiny random model over
GPT-2's 50,257-token vocabulary). --python picks the interpreter that runs the server, so two checkouts can be
compared side by side in one run. Prints one JSON line."""

import argparse
import concurrent.futures
import json
import socket
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--package", required=True)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--body-kb", type=int, default=900)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.python, "-m", "edgelm.runtime.cli", "serve", "-m", args.package, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        text = "Hello world, this is some text. " * (args.body_kb * 1024 // 32)
        httpx.post(url + "/tokenize", json={"content": "warm up"}, timeout=60)
        time.sleep(1)
        idle = rss_mb(server.pid)
        peak, health = [idle], []
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak.append(rss_mb(server.pid))
                started = time.perf_counter()
                httpx.get(url + "/health", timeout=600)
                health.append(time.perf_counter() - started)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.requests) as pool:
            codes = list(
                pool.map(
                    lambda _: httpx.post(url + "/tokenize", json={"content": text}, timeout=900).status_code,
                    range(args.requests),
                )
            )
        burst = time.perf_counter() - started
        done.set()
        watcher.join()
        time.sleep(2)
        after = rss_mb(server.pid)
        health.sort()
        print(
            json.dumps(
                {
                    "requests": args.requests,
                    "body_kb": args.body_kb,
                    "statuses": sorted(set(codes)),
                    "burst_s": round(burst, 1),
                    "rss_idle_mb": round(idle),
                    "rss_peak_mb": round(max(peak)),
                    "rss_after_mb": round(after),
                    "health_median_s": round(health[len(health) // 2], 3) if health else None,
                    "health_max_s": round(health[-1], 3) if health else None,
                }
            )
        )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
