"""Nothing heavy runs on the server's event loop, and abandoned work stops: a request's body is parsed, its
settings built (its constraint compiled) and its prompts prepared in the server's worker threads, /tokenize's
work in the tokenizer's thread; the requests waiting for those threads count against --max-queue with those
waiting for a slot, and one whose client leaves while it waits never runs. A step is held at a gate the test
opens (nothing depends on how fast the machine is)."""

import asyncio
import gc
import socket
import threading
import time
import types
import weakref

import pytest
from edgelm.runtime import load
from edgelm.runtime.errors import GenerationOptionError, PromptError
from edgelm.runtime.sampling import constraint
from edgelm.runtime.server import request_path, workers
from edgelm.runtime.server.app import create_app
from edgelm.runtime.server.api.requests import Limits
from edgelm.runtime.server.waiting import ClientGone
from server_harness import HTTP, InProcessServer, complete

BODY = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}
JSON = {"response_format": {"type": "json_object"}}  # a constraint: building the settings compiles it


class Held:
    """`function` behind a gate: each call is counted and signalled (`entered`), then waits until the gate opens."""

    def __init__(self, function):
        self.function, self.calls = function, 0
        self.gate, self.entered = threading.Event(), threading.Semaphore(0)

    def __call__(self, *args, **options):
        self.calls += 1
        self.entered.release()
        assert self.gate.wait(60), "the test never opened the gate"
        return self.function(*args, **options)

    def wait_entered(self, calls: int = 1) -> None:
        for _ in range(calls):
            assert self.entered.acquire(timeout=30), "the held step was never reached"


@pytest.fixture
def server(tiny_package):
    """Four rows in the running batch, one place in line, and a model of this test's own."""
    s = InProcessServer(load(tiny_package), Limits(max_tokens=50), max_batch=4, max_queue=1)
    yield s
    s.stop()


def in_thread(function, *args) -> list:
    """Run function(*args) in a thread; the list gets its value."""
    out = []
    threading.Thread(target=lambda: out.append(function(*args)), daemon=True).start()
    return out


def until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def waiting(server) -> int:
    """Requests waiting in line for a slot or a thread, all lines together."""
    return server.app.jobs.slots.waiting


@pytest.mark.parametrize("step", ["body", "settings"])
def test_health_is_answered_while_a_request_is_parsed_or_its_settings_built(server, monkeypatch, step):
    if step == "body":
        held = Held(request_path.parse_json)
        monkeypatch.setattr(request_path, "parse_json", held)
    else:  # building the settings compiles the constraint
        held = Held(server.app.model.settings)
        monkeypatch.setattr(server.app.model, "settings", held)
    answer = in_thread(complete, server, {**BODY, **JSON})
    held.wait_entered()
    health = HTTP.get(server.url + "/health", timeout=30)  # a step on the event loop would hold this until the gate opens
    assert health.status_code == 200 and not held.gate.is_set()
    held.gate.set()
    until(lambda: answer, "the held request was answered")
    assert answer[0].status_code == 200, answer[0].text


def test_requests_waiting_for_a_worker_thread_count_against_max_queue(server, monkeypatch):
    held = Held(server.app.model.settings)
    monkeypatch.setattr(server.app.model, "settings", held)
    answers = [in_thread(complete, server, BODY) for _ in range(workers_of(server))]
    held.wait_entered(len(answers))  # every worker thread is busy
    answers.append(in_thread(complete, server, BODY))
    until(lambda: waiting(server) == 1, "a request waits for a worker thread")
    refused = complete(server, BODY)  # the line (one place) is full
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert refused.headers["retry-after"] == "1"
    tokenize = Held(server.app.text_work._tokens)
    monkeypatch.setattr(server.app.text_work, "_tokens", tokenize)
    first = in_thread(lambda: HTTP.post(server.url + "/tokenize", json={"content": "hello"}))
    tokenize.wait_entered()  # the tokenizer's thread is free: the first /tokenize runs at once
    refused = HTTP.post(server.url + "/tokenize", json={"content": "hello"})  # the second would wait: no place
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    held.gate.set()
    tokenize.gate.set()
    until(lambda: len(first) == 1 and all(answers), "every admitted request was answered")
    assert first[0].status_code == 200 and [a[0].status_code for a in answers] == [200] * len(answers)
    assert tokenize.calls == 1 and held.calls == len(answers)  # what was refused never ran


def workers_of(server) -> int:
    return server.app.workers.slots.size


def test_tokenize_requests_whose_clients_left_never_run(tiny_package, monkeypatch):
    s = InProcessServer(load(tiny_package), Limits(max_tokens=50), max_batch=1, max_queue=16)
    try:
        held = Held(s.app.text_work._tokens)
        monkeypatch.setattr(s.app.text_work, "_tokens", held)
        clients = [send_and_leave_later(s.port, "/tokenize", b'{"content": "' + b"x" * 50_000 + b'"}')]
        held.wait_entered()  # the first runs; the others wait for the tokenizer's one thread
        clients += [send_and_leave_later(s.port, "/tokenize", b'{"content": "abc"}') for _ in range(12)]
        until(lambda: waiting(s) == 12, "the burst waits for the tokenizer")
        for client in clients:
            client.close()  # every client leaves
        until(lambda: waiting(s) == 0, "the server saw the clients leave")
        held.gate.set()  # the one that was running ends in its thread
        answer = HTTP.post(s.url + "/tokenize", json={"content": "hello"})
        assert answer.status_code == 200 and answer.json()["tokens"]
        assert held.calls == 2  # the running one and this one: none of the abandoned burst ran
    finally:
        s.stop()


def send_and_leave_later(port: int, path: str, body: bytes) -> socket.socket:
    """A POST sent whole on a connection of its own, whose answer is never read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


class Big:
    """What a failing compile built (a matcher and its lexer), as an object a weak reference can watch."""


def test_a_failing_compile_leaves_nothing_behind(server, monkeypatch):
    built, trims = [], []

    def failing_compile(config):
        big = Big()  # referenced by this frame, which the error's traceback holds
        built.append(weakref.ref(big))
        raise GenerationOptionError("json_object is too complex to compile within edgelm's limits", "json_object")

    monkeypatch.setattr(server.app.model, "compile_constraint", failing_compile)
    monkeypatch.setattr(workers, "release_freed_memory", lambda: trims.append(1))
    gc.collect()
    gc.disable()  # only references count, not when a collection happens to run
    try:
        for _ in range(5):
            response = complete(server, {**BODY, **JSON})
            assert response.status_code == 400 and response.json()["error"]["param"] == "response_format", response.text
        alive = sum(ref() is not None for ref in built)
    finally:
        gc.enable()
    assert len(built) == 5 and alive == 0  # no error, frame or cache still holds what a failed compile built
    assert len(trims) == 5  # and each failure handed its freed heap back to the system


def test_a_compile_builds_its_lexer_through_the_executor_that_releases_the_gil(model, monkeypatch):
    """A compile's time is its lexer's construction: computed by llguidance's executor (the GIL released), never
    by compute_ff_tokens (which holds it), so a compile in a worker thread leaves the event loop running."""
    import llguidance.numpy

    through_executor = []
    fill = llguidance.numpy.fill_next_token_bitmask_par
    monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask_par", lambda *a: through_executor.append(fill(*a)))
    model.compile_constraint(model.settings(regex="[0-9]{3}-[a-z]{5}", max_new_tokens=16))
    assert len(through_executor) == 1


def test_a_compile_builds_its_lexer_before_the_checks_that_would_build_it_holding_the_gil(model, monkeypatch):
    """The check for special tokens' text reads the forced start (compute_ff_bytes, the GIL held): the lexer it
    needs is built through the executor first, so that a slow compile never holds the GIL."""
    import llguidance.numpy
    from edgelm.runtime.sampling import constraint

    order = []
    fill, refuse = llguidance.numpy.fill_next_token_bitmask_par, constraint.refuse_special_text
    monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask_par", lambda *a: [order.append("lexer"), fill(*a)])
    monkeypatch.setattr(constraint, "refuse_special_text", lambda *a: [order.append("check"), refuse(*a)])
    model.compile_constraint(model.settings(regex="[0-9]{4}-[a-z]{7}", max_new_tokens=16))
    assert order == ["lexer", "check"]


def test_tokenizing_computes_no_offsets_whose_freeing_would_hold_the_gil(model):
    """A prompt (chat, completions, /tokenize) is encoded without offsets or token texts: an Encoding holding them
    is freed with the GIL held, long enough after a body near --max-body-bytes to stall the event loop. The ids
    are those of a full encoding."""
    from edgelm.runtime.text import tokenizer as tokenizing

    text = "Hello world, this is some text. " * 20 + "h\u00e9llo \u4e2d\u6587 <|endoftext|>"
    for special in (False, True):
        encoding = tokenizing.encode(model.tokenizer, text, add_special_tokens=special)
        assert encoding.ids == model.tokenizer.encode(text, add_special_tokens=special).ids
        assert set(encoding.offsets) == {(0, 0)} and set(encoding.tokens) == {""}


def test_repeated_compiles_that_fail_inside_llguidance_keep_nothing(server):
    """Schemas llguidance compiles, then fails at their first mask: each is refused, and neither the compiled-grammar
    cache nor a live error (whose frames would hold the matcher and its lexer) grows with them."""
    from edgelm.runtime.sampling import constraint

    cached = len(constraint._compiled)
    gc.collect()
    gc.disable()  # what stays alive must be referenced, not merely not yet collected
    try:
        for i in range(4):
            schema = {"$ref": "#", "description": f"only itself {i}"}  # distinct: no cache answers for another
            body = {**BODY, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
            response = complete(server, body)
            assert response.status_code == 400 and "allows no output" in response.json()["error"]["message"]
        # the last request's handler may still be finishing as its answer arrives
        until(lambda: GenerationOptionError not in map(type, gc.get_objects()), "the errors are freed")
    finally:
        gc.enable()
    assert len(constraint._compiled) == cached


def test_clients_that_send_a_body_and_leave_at_once_free_the_tokenizer(server, monkeypatch):
    """The burst's clients close their connections as soon as their bodies are sent: each place taken is given back
    (the one call that may have begun ends in its thread), and a later /tokenize is answered."""
    tokenize = server.app.text_work._tokens
    calls = []
    monkeypatch.setattr(server.app.text_work, "_tokens", lambda body: calls.append(1) or tokenize(body))
    body = b'{"content": "' + b"Hello world, this is some text. " * 6000 + b'"}'
    for _ in range(3):
        calls.clear()
        for _ in range(8):
            send_and_leave_later(server.port, "/tokenize", body).close()
        until(lambda: waiting(server) == 0 and server.app.text_work.workers.slots.active == 0, "every place is free")
        answer = HTTP.post(server.url + "/tokenize", json={"content": "hello"}, timeout=60)
        assert answer.status_code == 200 and len(calls) <= 2  # this one, and at most one the burst began


def test_a_place_taken_as_the_client_leaves_is_given_back():
    """The client has left as its request takes a free place: on one event loop, whatever the order in which the
    loop learns of the two, the place comes back once the call (if it began) has ended."""

    class Left:
        state = types.SimpleNamespace()

        async def is_disconnected(self) -> bool:
            return False  # not seen yet: the disconnect is the next message

        async def receive(self) -> dict:
            return {"type": "http.disconnect"}

    async def scenario() -> int:
        lane = workers.Workers("test", 1, 4, [])
        try:
            await lane.run(Left(), time.monotonic() + 30, 30, time.sleep, 0.01)
        except ClientGone:
            pass
        for _ in range(200):  # the call, if it began, ends in its thread and gives its place back
            if lane.slots.active == 0:
                break
            await asyncio.sleep(0.01)
        lane.close()
        return lane.slots.active

    assert asyncio.run(scenario()) == 0


def test_what_is_alive_when_the_server_starts_is_kept_from_the_collector_until_it_stops(tiny_package):
    """A full collection, which holds the GIL, walks only what requests built, not the model and every module."""
    before = gc.get_freeze_count()  # 0, unless a server of another test still runs
    server = InProcessServer(load(tiny_package), Limits(max_tokens=8))
    try:
        assert gc.get_freeze_count() > before
    finally:
        server.stop()
    assert gc.get_freeze_count() == 0


def test_the_server_bounds_its_heap_so_that_a_burst_frees_what_it_used(tiny_package, monkeypatch):
    """glibc keeps what a worker thread's burst freed at the top of that thread's arena (its thresholds raised by
    every large free); the server fixes them when it starts (engine/native.py), whose call is the mechanism."""
    from edgelm.runtime.engine import native

    calls = []
    monkeypatch.setattr(native, "bound_freed_heap", lambda: calls.append(1) or "mallopt")
    server = InProcessServer(load(tiny_package), Limits(max_tokens=8))
    try:
        assert calls == [1]
    finally:
        server.stop()


def test_edgelm_serve_starts_the_app_it_opens_after_the_model_has_loaded(tiny_package, monkeypatch):
    """Under edgelm serve the lifespan runs before the model has loaded (loading.py's Gate answers meanwhile): the
    Gate starts the app as it opens it, so the start's work (the collector's freeze, the heap's bounds) is done."""
    from edgelm.runtime.engine import native
    from edgelm.runtime.server.loading import Gate

    calls = []
    monkeypatch.setattr(native, "bound_freed_heap", lambda: calls.append(1) or "mallopt")
    before = gc.get_freeze_count()
    app = create_app(load(tiny_package), Limits(max_tokens=8), prepare_constraints=False)
    try:
        Gate(5.0).open(app)
        assert calls == [1] and gc.get_freeze_count() > before
        app.start()  # the lifespan, at shutdown: nothing twice
        assert calls == [1]
    finally:
        gc.unfreeze()


def test_a_starting_server_builds_what_every_constraint_needs_in_the_background(tiny_package):
    """llguidance's table of the tokenizer is built as the server starts, not by its first constrained request."""
    model = load(tiny_package)
    server = InProcessServer(model, Limits(max_tokens=8))
    try:
        until(lambda: model._constraints is not None, "the constraint table built")
        until(lambda: model._constraints.key in constraint._tokenizers, "the constraint table built")
    finally:
        server.stop()
    quiet = load(tiny_package)
    create_app(quiet, Limits(max_tokens=8), prepare_constraints=False).start()
    gc.unfreeze()
    assert quiet._constraints is None


def test_a_constraint_arriving_while_the_table_is_built_waits_for_it_rather_than_build_another(gpt2_tokenizer_dir):
    text = (gpt2_tokenizer_dir / "tokenizer.json").read_text()
    built = Held(constraint.engine_tokenizer)
    original, constraint.engine_tokenizer = constraint.engine_tokenizer, built
    try:
        compilers = [constraint.Compiler(text, 50257, (50256,), max_tokens=12345) for _ in range(2)]  # a key of its own
        first = in_thread(compilers[0].tokenizer)
        built.wait_entered()
        second = in_thread(compilers[1].tokenizer)
        time.sleep(0.2)  # the second has reached the lock (were it not held, it would be building too)
        built.gate.set()
        until(lambda: first and second, "both have the table")
        assert built.calls == 1 and first[0] is second[0]
    finally:
        constraint.engine_tokenizer = original
        constraint._tokenizers.pop(compilers[0].key, None)


def test_a_large_prompts_ids_are_checked_without_a_python_call_per_id(model, monkeypatch):
    """A body near --max-body-bytes tokenizes to hundreds of thousands of ids; checked one Python call each, their
    check took a worker thread's CPU (and GIL turns) for ~0.2 s per body, which the model's thread and the event
    loop shared during a burst. Plain ints in range are checked in C; anything else still gets its one line."""
    from edgelm.runtime import inputs

    calls = []
    checked = inputs.is_token_id
    monkeypatch.setattr(inputs, "is_token_id", lambda *args: calls.append(1) or checked(*args))
    vocab = model.arch.vocab_size
    ids = model.encode("Hello world, this is some text. " * 200)
    model._check_ids(ids)
    inputs.check_token_ids(tuple(ids), vocab)
    assert calls == []
    for bad, shown in (([*ids, vocab], str(vocab)), ([*ids, True], "True"), ([1, -1], "-1"), ([1, 2.0], "2.0")):
        with pytest.raises(PromptError, match=f"token id {shown} is outside the vocabulary"):
            inputs.check_token_ids(bad, vocab)
