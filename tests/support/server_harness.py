"""Servers for the server tests: `edgelm serve` in a subprocess, or create_app served by uvicorn in a thread of
this process over a model whose decoder waits at a gate (a threading.Event) that the test opens. A test that
needs a request to be busy holds the gate; nothing depends on how fast the model or the machine is."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref

import httpx
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.server.app import create_app
from edgelm.runtime.server.uvicorn_server import server as uvicorn_server

# Pooled and thread-safe; an idle connection is dropped well before the server's 5-second keep-alive ends it.
HTTP = httpx.Client(timeout=60, limits=httpx.Limits(keepalive_expiry=2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Health:
    """/health, and waiting (bounded) for the server to be idle."""

    url: str

    def health(self) -> dict:
        return HTTP.get(self.url + "/health", timeout=5).json()

    def idle(self, changed: str | None = None, before: int = 0) -> dict:
        """/health once no job runs (and, with `changed`, once that counter has moved past `before`); 10 s at most."""
        deadline = time.monotonic() + 10
        while True:
            health = self.health()
            if (
                health["active"] == 0 and (changed is None or health[changed] != before)
            ) or time.monotonic() > deadline:
                return health
            time.sleep(0.05)


class Server(Health):
    """`edgelm serve -m PACKAGE --port FREE ...` in a subprocess; its log goes to a file, shown when a test fails."""

    def __init__(self, package, tmp_path, *options):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = open(tmp_path / f"server-{self.port}.log", "w+")
        command = [
            sys.executable,
            "-c",
            "from edgelm.runtime.cli.main import main; main()",
            "serve",
            "-m",
            str(package),
            "--port",
            str(self.port),
            *options,
        ]
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, f"the server exited with {self.process.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"the server did not answer /health within 60 s:\n{self.log()}"
            try:
                if HTTP.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)

    def log(self) -> str:
        self.log_file.flush()
        self.log_file.seek(0)
        return self.log_file.read()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        return self.process.returncode


class GatedEngine:
    """A model's engine whose decoders pass their first `free` forward passes, then wait at `gate` before each
    one. Records a weak reference to every decoder it hands out. `fail`, when set, is raised instead of a pass."""

    def __init__(self, engine, free: int = 1):
        self._engine, self.free = engine, free
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a pass is waiting at the closed gate
        self.decoders: list = []
        self.fail: Exception | None = None

    def hold(self) -> None:
        self.waiting.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def decoder(self, batch, capacity, **options):
        decoder = self._engine.decoder(batch, capacity, **options)
        self.decoders.append(weakref.ref(decoder))
        return GatedDecoder(decoder, self)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class GatedDecoder:
    def __init__(self, decoder, gated: GatedEngine):
        self._decoder, self._gated, self._passes = decoder, gated, 0

    def run(self, *args):
        self._passes += 1
        if self._passes > self._gated.free and not self._gated.gate.is_set():
            self._gated.waiting.set()
            self._gated.gate.wait()
        if self._gated.fail is not None:
            raise self._gated.fail
        return self._decoder.run(*args)

    def __getattr__(self, name):  # the cache a batch-1 prefill leaves (buffers)
        return getattr(self._decoder, name)


def gate(model, free: int = 1) -> GatedEngine:
    """Put a gate in front of `model`'s engine, and keep a weak reference to every Batch it makes (model.batches)."""
    model.engine = GatedEngine(model.engine, free)
    model.batches = []
    make_batch = model.batch

    def batch(*args, **options):
        made = make_batch(*args, **options)
        model.batches.append(weakref.ref(made))
        return made

    model.batch = batch
    return model.engine


class InProcessServer(Health):
    """create_app(model, ...) served by uvicorn (with edgelm's protocol) in a thread of this process."""

    def __init__(self, model, limits: Limits = Limits(), **options):
        self.app = create_app(model, limits, **options)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn_server(self.app, "127.0.0.1", self.port, "warning", shutdown_timeout=0.5)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.02)

    def wait_until_stopped(self, reason: str = "cancelled") -> None:
        """Until every running job has been asked to stop for `reason` (the server saw its client leave)."""
        deadline = time.monotonic() + 10
        while not all(job.stop_reason == reason for job in list(self.app.jobs.running)):
            assert time.monotonic() < deadline, "the server did not stop the job"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def complete(server, body, key=None, headers=None, **kwargs) -> httpx.Response:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    return HTTP.post(server.url + "/v1/completions", json=body, headers=headers, **kwargs)


def stream_events(server, body, key=None) -> list:
    """Every `data:` payload of a streaming request, parsed; the final "[DONE]" kept as a string."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    events = []
    with HTTP.stream(
        "POST", server.url + "/v1/completions", json={**body, "stream": True}, headers=headers
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
            else:
                assert line == "", line
    return events


def streamed_texts(events, rows: int = 1) -> tuple[list, list]:
    assert events[-1] == "[DONE]"
    texts, reasons = [""] * rows, [None] * rows
    for event in events[:-1]:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
            reasons[choice["index"]] = choice["finish_reason"] or reasons[choice["index"]]
    return texts, reasons


class RawConnection:
    """One keep-alive HTTP/1.1 connection on a plain socket: to send what no HTTP client sends, and to see that
    the same connection still answers afterwards."""

    def __init__(self, port: int, timeout: float = 30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def post(self, path: str, body: bytes, content_type: str = "application/json", extra: str = "") -> tuple:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        self.sock.sendall(head.encode("latin-1") + body)
        return self.response()

    def response(self) -> tuple:
        """(status, headers dict, body bytes) of the next response; raises ConnectionError if the server closed."""
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed_by_server(self) -> bool:
        """Whether the server closes the connection (reads until it does, within the socket's timeout)."""
        try:
            while self.sock.recv(65536):
                pass
            return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    def close(self) -> None:
        self.sock.close()


class ScriptedEngine:
    """A model's engine whose decoders write a script (token ids), then end-of-text: each pass returns the model's
    logits with the next scripted token raised far above the rest, so greedy decoding (temperature 0) answers
    the script whatever the random weights say. `say(text, ...)` before a request: each decoder made after it
    takes the next text, the last one for every decoder after that (a multi-turn agent's answers in order)."""

    def __init__(self, engine, tokenizer, eos_id: int):
        self._engine, self.tokenizer, self.eos_id = engine, tokenizer, eos_id
        self.scripts: list = [[]]
        self.script: list = []  # the text of the last decoder made, as ids

    def say(self, *texts: str) -> None:
        self.scripts = [self.tokenizer.encode(text, add_special_tokens=False).ids for text in texts]  # no <s>
        self.script = self.scripts[0]

    def decoder(self, batch, capacity, **options):
        self.script = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        return ScriptedDecoder(self._engine.decoder(batch, capacity, **options), self, self.script)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class ScriptedDecoder:
    def __init__(self, decoder, scripted: ScriptedEngine, script: list):
        self._decoder, self._eos, self._script, self._step = decoder, scripted.eos_id, script, 0

    def run(self, *args):
        import numpy as np

        logits = np.array(self._decoder.run(*args), dtype=np.float32)  # [B, 1, V], a copy
        token = self._script[self._step] if self._step < len(self._script) else self._eos
        logits[:, -1, token] = logits.max() + 50.0
        self._step += 1
        return logits

    def __getattr__(self, name):
        return getattr(self._decoder, name)


def scripted(model) -> ScriptedEngine:
    """Put a script in front of `model`'s engine (serve it with max_batch=0: each request decodes alone)."""
    model.engine = ScriptedEngine(model.engine, model.tokenizer, model.arch.eos_token_id)
    return model.engine


def scripted_model(package):
    """A model of `package` (load()) that a test can make answer a given script (scripted)."""
    from edgelm.runtime import load

    model = load(package)
    model.script = scripted(model)
    return model


def serve_alone(model, max_tokens: int):
    """An in-process server of `model` named "tiny", each request run alone: a module fixture's body (yield it,
    then stop() it)."""
    return InProcessServer(model, Limits(max_tokens=max_tokens), max_batch=0, model_names=("tiny",))


def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def samples(server) -> dict:
    """/metrics as {name{labels}: value}."""
    text = HTTP.get(server.url + "/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] not in "#"}
