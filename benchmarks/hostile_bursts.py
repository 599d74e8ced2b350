"""Hostile bursts against `edgelm serve`: how long /health takes, and the gaps between the chunks of another
client's plain stream, while --burst heavy requests of one kind arrive at once.

    python benchmarks/hostile_bursts.py -m PACKAGE [--burst 12] [--kinds slow_compile,large_body,...] [--repeats 1]
    python benchmarks/hostile_bursts.py --tiny --burst 2      # a tiny random package (needs the export extra)

Kinds (each a burst of --burst requests sent at once, one kind after the other):
    slow_compile        chat requests whose response_format pattern, ^((a{100}){100}){100}$, takes llguidance
                        seconds to refuse
    large_body          chat requests whose bodies are just under --max-body-bytes (thousands of messages)
    abandoned_tokenize  /tokenize bodies just under --max-body-bytes whose clients leave at once; then the time
                        a 5-byte /tokenize takes
    failing_compile     schemas llguidance compiles, then fails at their first mask
The server's resident memory is printed as started (`rss_started_mb`: once it answers /health and its memory has
settled, the constraint table it builds in the background included), after the first ordinary constrained request
(`rss_constraints_ready_mb`), and for every burst before it and 2 s after it (`rss_before_mb`, `rss_after_mb`,
`rss_over_started_mb`: how far above the server as started), so "memory after a burst returns to within N MB of
idle" reads directly. The time from the start of the process to /health's first "ok" (`ready_s`) and the first
constrained request's time (`first_constrained_ms`) are printed too.

A thread asks /health every 20 ms and another streams greedy completions throughout; for each burst the script
prints the 50th and 99th percentiles (and the worst) of both, in milliseconds. One burst gives 40-120 gaps, so its
"99th percentile" is its worst gap or next to it: --repeats N sends every kind's burst N times (kind after kind,
round after round) and ends with one line per kind over all its bursts' samples together (`pooled`: the
percentiles of every burst's /health times and gaps, and how many bursts had a gap or a /health time over 100 ms).
Everything is bounded: each request by --request-s, the whole run by --max-seconds, after which the server is
stopped. A benchmark, not a test: nothing is asserted. Run it on quiet cores for figures worth keeping.
"""

import argparse
import concurrent.futures
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

KINDS = ("slow_compile", "large_body", "abandoned_tokenize", "failing_compile")
SLOW_PATTERN = "^((a{100}){100}){100}$"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def percentile(values: list, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def tiny_package(folder: Path) -> Path:
    """The tests' tiny random GPT-2 checkpoint, exported into `folder` (needs the export extra)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    from checkpoints import build_checkpoint
    from edgelm.export.stages import export_model

    build_checkpoint(folder / "checkpoint")
    return export_model(str(folder / "checkpoint"), folder / "tiny", validate=False).path


class Watch:
    """/health latencies and a concurrent stream's gaps between chunks, each with the time it was measured."""

    def __init__(self, url: str, stream_tokens: int):
        self.url, self.stream_tokens = url, stream_tokens
        self.health, self.gaps = [], []  # (when, seconds)
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._health), threading.Thread(target=self._stream)]
        for thread in self.threads:
            thread.start()

    def _health(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.done.is_set():
                started = time.perf_counter()
                client.get(self.url + "/health")
                self.health.append((started, time.perf_counter() - started))
                time.sleep(0.02)

    def _stream(self) -> None:
        body = {"prompt": "The quick", "max_tokens": self.stream_tokens, "ignore_eos": True, "temperature": 0}
        with httpx.Client(timeout=120) as client:
            while not self.done.is_set():
                with client.stream("POST", self.url + "/v1/completions", json={**body, "stream": True}) as response:
                    last = None
                    for line in response.iter_lines():
                        now = time.perf_counter()
                        if line.startswith("data: "):
                            if last is not None:
                                self.gaps.append((last, now - last))
                            last = now

    def between(self, start: float, end: float) -> dict:
        return self.within([(start, end)])

    def within(self, windows: list) -> dict:
        """The /health times and gaps measured inside any of `windows` ((start, end) pairs), in milliseconds."""

        def ms(samples):
            values = [s for at, s in samples if any(start <= at <= end for start, end in windows)]
            return {
                "n": len(values),
                **{k: None if v is None else round(v * 1000, 1) for k, v in (
                    ("p50_ms", percentile(values, 0.50)),
                    ("p99_ms", percentile(values, 0.99)),
                    ("max_ms", max(values) if values else None),
                )},
            }  # fmt: skip

        return {"health": ms(self.health), "stream_gap": ms(self.gaps)}

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(180)


def pooled(watch: Watch, windows: list) -> dict:
    """Every burst's samples together, and how many bursts went over 100 ms in each measure."""
    over = {"health": 0, "stream_gap": 0}
    for window in windows:
        for measure, figures in watch.within([window]).items():
            over[measure] += figures["max_ms"] is not None and figures["max_ms"] > 100
    return {**watch.within(windows), "bursts_over_100_ms": over}


def chat(client: httpx.Client, url: str, body, timeout: float) -> int:
    """POST `body` (a dict, or its JSON already encoded) to /v1/chat/completions; the status, or the error's name."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    try:
        return client.post(url + "/v1/chat/completions", content=content, headers=headers, timeout=timeout).status_code
    except httpx.HTTPError as error:
        return type(error).__name__


def schema_body(schema: dict) -> dict:
    return {
        "messages": [{"role": "user", "content": "Answer"}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    }


def burst(kind: str, args, url: str) -> dict:
    """Send one burst of `kind`; what it got back, and what the kind measures besides."""
    n = args.burst
    near_limit = int(args.max_body_bytes * 0.95)
    if kind == "slow_compile":
        bodies = [schema_body({"type": "string", "pattern": SLOW_PATTERN, "description": str(i)}) for i in range(n)]
    elif kind == "failing_compile":
        bodies = [schema_body({"$ref": "#", "description": f"only itself {i}"}) for i in range(n)]
    elif kind == "large_body":
        message = {"role": "user", "content": "x" * 180}
        count = near_limit // len(json.dumps(message))
        bodies = [{"messages": [message] * count, "max_tokens": 1} for _ in range(n)]
    else:  # abandoned_tokenize: sent whole by clients that close their connection at once
        body = json.dumps({"content": "Hello world, this is some text. " * (near_limit // 33)}).encode()
        port = int(url.rsplit(":", 1)[1])
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", port), timeout=args.request_s) as sock:
                head = f"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        started = time.perf_counter()
        status = httpx.post(url + "/tokenize", json={"content": "hello"}, timeout=args.request_s).status_code
        return {"statuses": [status], "later_tokenize_ms": round((time.perf_counter() - started) * 1000, 1)}
    # encoded before the burst: a megabyte of JSON encoded in each sending thread holds this process's GIL, which the
    # watching threads need to take their timestamps (the gaps measured would be this process's own)
    bodies = [json.dumps(body).encode() for body in bodies]
    with httpx.Client(timeout=args.request_s, limits=httpx.Limits(max_connections=n)) as client:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            statuses = list(pool.map(lambda b: chat(client, url, b, args.request_s), bodies))
    return {"statuses": sorted(set(map(str, statuses)))}


def settled_rss_mb(pid: int, seconds: float = 30) -> float:
    """The process's resident memory once it has not moved by more than 1 MB for 2 s (at most `seconds`)."""
    ends, last = time.monotonic() + seconds, rss_mb(pid)
    while time.monotonic() < ends:
        time.sleep(2)
        now = rss_mb(pid)
        if abs(now - last) <= 1:
            return now
        last = now
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--package", help="the package to serve")
    parser.add_argument("--tiny", action="store_true", help="export the tests' tiny random package and serve it")
    parser.add_argument("--burst", type=int, default=12, help="requests per burst, sent at once (8-20 is hostile)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--stream-tokens", type=int, default=40, help="tokens per request of the watched stream")
    parser.add_argument("--max-body-bytes", type=int, default=1_000_000, help="the server's --max-body-bytes")
    parser.add_argument("--request-s", type=float, default=120, help="seconds one request may take")
    parser.add_argument("--max-seconds", type=float, default=900, help="the whole run's bound")
    parser.add_argument("--repeats", type=int, default=1, help="bursts of each kind, pooled in a last line per kind")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the server")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not args.package and not args.tiny or any(k not in KINDS for k in kinds) or args.repeats < 1:
        parser.error(f"give -m PACKAGE or --tiny, kinds among {', '.join(KINDS)}, and --repeats of 1 or more")
    with tempfile.TemporaryDirectory() as scratch:
        package = args.package or tiny_package(Path(scratch))
        run(args, str(package), kinds)


def run(args, package: str, kinds: list) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [args.python, "-m", "edgelm.runtime.cli", "serve", "-m", package, "--port", str(port)]
    command += ["--max-queue", str(4 * args.burst), "--max-body-bytes", str(args.max_body_bytes)]
    launched = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ends = time.monotonic() + args.max_seconds
    watch = None
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > ends:
                raise SystemExit("the server did not start")
            time.sleep(0.05)
        idle = {"ready_s": round(time.perf_counter() - launched, 2), "rss_ready_mb": round(rss_mb(server.pid))}
        idle["rss_started_mb"] = started_mb = round(settled_rss_mb(server.pid))
        watch = Watch(url, args.stream_tokens)
        time.sleep(1)
        idle["idle"] = watch.between(0, time.perf_counter())
        ordinary = schema_body({"type": "string", "maxLength": 5})  # built llguidance's table where none was
        with httpx.Client(timeout=args.request_s) as client:
            began = time.perf_counter()
            idle["constrained_status"] = chat(client, url, ordinary, args.request_s)
            idle["first_constrained_ms"] = round((time.perf_counter() - began) * 1000, 1)
        time.sleep(2)
        print(json.dumps({**idle, "rss_constraints_ready_mb": round(rss_mb(server.pid))}))
        windows = {kind: [] for kind in kinds}
        for kind in [kind for _ in range(args.repeats) for kind in kinds]:
            if time.monotonic() > ends:
                print(json.dumps({"kind": kind, "skipped": "past --max-seconds"}))
                continue
            before = round(rss_mb(server.pid))
            started = time.perf_counter()
            got = burst(kind, args, url)
            windows[kind].append((started, time.perf_counter()))
            watched = watch.between(*windows[kind][-1])
            time.sleep(2)
            after = round(rss_mb(server.pid))
            memory = {"rss_before_mb": before, "rss_after_mb": after, "rss_over_started_mb": after - started_mb}
            print(json.dumps({"kind": kind, "burst": args.burst, **got, **memory, **watched}))
        if args.repeats > 1:
            for kind, spans in windows.items():
                print(json.dumps({"kind": kind, "pooled": len(spans), **pooled(watch, spans)}))
    finally:
        if watch is not None:
            watch.done.set()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        if watch is not None:
            watch.stop()


if __name__ == "__main__":
    main()
