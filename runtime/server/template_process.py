"""Large conversations rendered by the chat template in a process of the server's own, not in its threads.

A template renders in Python (Jinja, each line traced by chat_bounds.Budget): of the steps that prepare a body
near --max-body-bytes of thousands of messages, its render holds the GIL longest by far (JSON parsing and the
body's checks are short, the tokenizer releases it), and a worker thread running it shares the GIL with the event
loop in 5 ms turns, so every wait of the loop on a socket costs it a turn: /health and each stream's chunks stall
while a burst of such bodies is prepared. So a chat body of RENDER_ELSEWHERE_FROM bytes or more is
rendered in another process, `python -m` this module, started on the first such body and holding nothing but
the package's template; the worker thread waits for the prompt with the GIL released.

    worker thread -- (messages, tools, deadline) --> the process: ChatTemplate.render under its usual bounds
                  <-- ("prompt", text), or the ChatError / DeadlineError to raise again with its param
    each message: 8 bytes of length, then a pickle (the two ends are this module; the client's values are
    plain JSON values by then)

Not multiprocessing: its spawn runs the parent's main script again in the child, which a script that serves
without an `if __name__ == "__main__"` guard must not see. Bounds: one process, one render at a time (the others
wait for it until their request's deadline), each under the bounds a render has in a thread (the deadline is
time.monotonic(), one clock for every process of the machine); a process that does not answer by the deadline
(and a second), or dies, is killed: its request gets a 408 or 503, the next render starts another. close() (the
server's shutdown) kills it.
"""

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time

from ..errors import ChatError, DeadlineError
from ..text.chat_bounds import deadline as render_deadline
from ..text.chat_template import ChatTemplate

# Body bytes from which a chat request's template renders in the process: the size from which a render's Python is
# worth a round trip to it (the messages pickled there, the prompt back); a server that never sees one never starts it.
RENDER_ELSEWHERE_FROM = 32 << 10
GRACE_S = 1.0  # how long past the deadline the process may take to say that it ran out of time
LATE = "the chat template did not render before the request's deadline"


class TemplateProcess:
    """`template` (a ChatTemplate) rendered in one process of its own, started when first used."""

    def __init__(self, template: ChatTemplate):
        self.template = template
        self._process, self._turn, self._closed = None, threading.Lock(), False

    def render(self, messages, tools, deadline: float) -> str:
        """template.render(messages, add_generation_prompt=True, tools=tools) in the process, by time.monotonic()
        `deadline`; ChatError and DeadlineError as the template raises them, ApiError 503 if the process failed or
        the server is stopping."""
        if not self._turn.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise DeadlineError(LATE)
        try:
            process = self._started()
            _send(process.stdin, (messages, tools, deadline))
            kind, *value = _receive(process.stdout, deadline + GRACE_S)
        except (OSError, EOFError, ValueError, pickle.PickleError, TimeoutError) as error:
            if self._process is not None:  # dead, killed by close(), or stuck: the next render starts another
                self._kill(self._process)
            if isinstance(error, TimeoutError):
                raise DeadlineError(LATE) from None
            raise _stopped(self._closed) from None
        finally:
            self._turn.release()
        if kind == "prompt":
            return value[0]
        if kind == "deadline":
            raise DeadlineError(value[0])
        raise ChatError(*value)

    def close(self) -> None:
        """Kill the process (a render it runs gets a 503) and start no other."""
        self._closed = True
        process = self._process
        if process is None:
            return
        if self._turn.acquire(blocking=False):
            self._kill(process)
            self._turn.release()
        else:  # a render is waiting for it: its thread sees the pipe close, and cleans up
            process.kill()

    def _started(self) -> subprocess.Popen:
        if self._closed:
            raise _stopped(True)
        if self._process is not None and self._process.poll() is not None:  # it died between two renders
            self._kill(self._process)
        if self._process is None:
            t = self.template
            command = [sys.executable, "-m", __spec__.name]
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            _send(self._process.stdin, (t.source, t.special_tokens, t.origin, t.model_type, t.is_default))
        return self._process

    def _kill(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        if self._process is process:
            self._process = None


def _stopped(closing: bool):
    from .api_errors import ApiError, api_error
    from .jobs import Stopped

    if closing:
        return api_error(Stopped("shutdown"))
    return ApiError(
        503, "the process rendering chat templates stopped; retry shortly", code="unavailable", type="server_error"
    )


def _send(pipe, value) -> None:
    data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()


def _receive(pipe, deadline: float | None = None):
    """The next value from `pipe` (read through its file descriptor, never its buffer); TimeoutError once
    time.monotonic() passes `deadline`, EOFError if the other end closed."""
    size = struct.unpack("<Q", _read(pipe.fileno(), 8, deadline))[0]
    return pickle.loads(_read(pipe.fileno(), size, deadline))


def _read(fd: int, size: int, deadline: float | None) -> bytes:
    """Exactly `size` bytes from `fd`: no more, the next message's bytes stay in the pipe."""
    data = bytearray()
    while len(data) < size:
        if deadline is not None and not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
            raise TimeoutError()
        chunk = os.read(fd, min(1 << 20, size - len(data)))
        if not chunk:
            raise EOFError()
        data += chunk
    return bytes(data)


# -- in the process ----------------------------------------------------------------------------------------


def _render(template: ChatTemplate, messages, tools, deadline: float) -> tuple:
    """("prompt", text), or the error as plain values: ChatError's param does not survive pickling."""
    try:
        with render_deadline(deadline):
            return ("prompt", template.render(messages, add_generation_prompt=True, tools=tools))
    except ChatError as error:
        return ("chat", str(error), error.param)
    except DeadlineError as error:
        return ("deadline", str(error))


def main() -> None:
    """Render what the server sends on stdin, answering on stdout, until stdin closes (the server ended)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the server's to handle: it ends this
    source, special_tokens, origin, model_type, is_default = _receive(sys.stdin.buffer)
    if is_default:  # the default template is known by identity (its stop strings), which pickling loses
        template = ChatTemplate.default(special_tokens)
    else:
        template = ChatTemplate(source, special_tokens, origin, model_type)
    while True:
        try:
            messages, tools, deadline = _receive(sys.stdin.buffer)
        except EOFError:
            return
        _send(sys.stdout.buffer, _render(template, messages, tools, deadline))


if __name__ == "__main__":
    main()
