"""Run edgelm commands inside a memory limit, as on a small machine, and report each one's peak memory.

    python tools/ci/memory_limit.py PKG [PKG ...] [--limit-mb 512]     # as root: it makes a cgroup

For each package: `edgelm generate` (32 tokens), `edgelm chat` (one turn, 32 tokens) and `edgelm serve` (one
completion and one chat request, 32 tokens each), each process in a fresh memory cgroup limited to --limit-mb
(swap included where the kernel accounts it), with every core's threads. Printed per command: whether it
succeeded, and the cgroup's peak: its processes' resident memory and the page cache of the package, which is
copied from inside the cgroup first so that its pages are charged there (weights mapped from a file are page
cache). tests/platforms/test_small_machine.py runs the same at 512 MB.

cgroup v1 (a `memory` hierarchy) or v2 (a `memory` controller the current cgroup can hand to a child) is used,
whichever this system has; a process counts as killed when the kernel's OOM killer ended it.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT, TOKENS = "Hello, my name is", 32


class MemoryCgroup:
    """A fresh memory cgroup under this process's own, with a limit; removed by close()."""

    def __init__(self, limit_bytes: int):
        self.path, self.version = _make(f"edgelm-{os.getpid()}-{time.monotonic_ns()}")
        if self.version == 1:
            _write(self.path / "memory.limit_in_bytes", limit_bytes)
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                _write(self.path / "memory.memsw.limit_in_bytes", limit_bytes)
        else:
            _write(self.path / "memory.max", limit_bytes)
            if (self.path / "memory.swap.max").exists():
                _write(self.path / "memory.swap.max", 0)

    def enter(self) -> None:
        """Move the calling process in (a child's preexec_fn: it is in the cgroup before it execs)."""
        _write(self.path / "cgroup.procs", os.getpid())

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int((self.path / name).read_text())

    def oom_killed(self) -> bool:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
        return False

    def close(self) -> None:
        for _ in range(50):  # the cgroup's last process may still be exiting
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _make(name: str) -> tuple[Path, int]:
    """A child cgroup of this process's memory cgroup: (its folder, the cgroup version)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:  # v1: "4:memory:/some/path"
        _, controllers, where = line.split(":", 2)
        if "memory" in controllers.split(","):
            for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/memory,cpuset")):
                if root.is_dir():
                    path = root / where.lstrip("/") / name
                    path.mkdir()
                    return path, 1
    for line in lines:  # v2: "0::/some/path"
        if line.startswith("0::"):
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                parent = root / line[3:].lstrip("/")
                controllers = parent / "cgroup.controllers"
                if controllers.exists() and "memory" in controllers.read_text().split():
                    _write(parent / "cgroup.subtree_control", "+memory")
                    path = parent / name
                    path.mkdir()
                    return path, 2
    raise OSError("no memory cgroup this process can make a child of (run as root, with cgroup v1 or v2 memory)")


def edgelm() -> list[str]:
    """The edgelm command of this Python."""
    found = shutil.which("edgelm", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "edgelm.runtime.cli.launch"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def run_limited(what: str, package: Path, limit_bytes: int) -> dict:
    """Run one command ("generate", "chat" or "serve") on `package` in a fresh cgroup; its outcome and peak."""
    cgroup, scratch = MemoryCgroup(limit_bytes), Path(tempfile.mkdtemp(prefix="edgelm-memory-"))
    try:
        # a copy made from inside the cgroup: the page cache of the package's files is charged to it, as it would
        # be on a machine that reads the package for the first time (pages cached earlier count to no cgroup)
        copied = scratch / package.name
        subprocess.run(["cp", "-r", str(package), str(copied)], preexec_fn=cgroup.enter, check=True)
        package = copied
        start = dict(preexec_fn=cgroup.enter, capture_output=True, text=True, timeout=300)
        if what == "generate":
            ran = subprocess.run(
                [*edgelm(), "generate", "-m", str(package), PROMPT, "--max-new-tokens", str(TOKENS)], **start
            )
            ok, output = ran.returncode == 0 and bool(ran.stdout.strip()), ran.stdout + ran.stderr
        elif what == "chat":
            ran = subprocess.run(
                [*edgelm(), "chat", "-m", str(package), "--max-new-tokens", str(TOKENS)], input="Hi there\n", **start
            )
            ok, output = ran.returncode == 0 and bool(ran.stdout.strip()), ran.stdout + ran.stderr
        else:
            ok, output = _serve(package, cgroup)
        return {
            "command": what,
            "ok": ok and not cgroup.oom_killed(),
            "oom_killed": cgroup.oom_killed(),
            "peak_mb": cgroup.peak_bytes() / 2**20,
            "output": output[-2000:],
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        cgroup.close()


def _serve(package: Path, cgroup: MemoryCgroup) -> tuple[bool, str]:
    port = _free_port()
    server = subprocess.Popen(
        [*edgelm(), "serve", "-m", str(package), "--port", str(port)],
        preexec_fn=cgroup.enter,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url, answers = f"http://127.0.0.1:{port}", []
    try:
        for _ in range(600):  # up to a minute to load
            if server.poll() is not None:
                break
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        if server.poll() is None:
            answers.append(
                _post(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": TOKENS})["choices"][0]["text"]
            )
            chat = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": TOKENS}
            answers.append(_post(url + "/v1/chat/completions", chat)["choices"][0]["message"]["content"])
    except OSError as error:
        answers.append(f"request failed: {error}")
    finally:
        server.terminate()
        try:
            output = server.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
    return len(answers) == 2 and all(isinstance(a, str) for a in answers), output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--limit-mb", type=int, default=512)
    args = parser.parse_args()
    failed = False
    for package in args.packages:
        for what in ("generate", "chat", "serve"):
            result = run_limited(what, package, args.limit_mb << 20)
            failed |= not result["ok"]
            status = "ok" if result["ok"] else ("OOM-killed" if result["oom_killed"] else "FAILED")
            print(f"{package.name:24} {what:9} {status:10} peak {result['peak_mb']:6.1f} MB (limit {args.limit_mb} MB)")
            if not result["ok"]:
                print(result["output"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
