"""`edgelm serve`: load a package once and answer OpenAI-style HTTP requests with it (needs the server extra)."""

import json
import logging
import os
import sys

import click

from ..errors import install_hint
from ..generation_config import SPECULATIVE
from ..generation_options import EXTRA, request_fields
from ..server.limits import Limits
from .options import (
    device_option,
    package_option_or_argument,
    prefix_cache_dir_option,
    prefix_cache_option,
    threads_option,
    verify_options,
)
from .terminal import echo


@click.command()
@package_option_or_argument
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; 0.0.0.0 exposes the server to the network.",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on; 0 picks a free one, named in the ready line.",
)
@click.option(
    "--uds",
    type=click.Path(dir_okay=False),
    help="Listen on this Unix socket instead of a TCP port (an app's private channel).",
)
@click.option(
    "--parent-pid",
    type=click.IntRange(min=1),
    help="Stop when the process with this id ends (the app that started the server).",
)
@click.option(
    "--exit-with-stdin",
    is_flag=True,
    help="Stop when standard input ends: a parent that spawns the server with a pipe takes it down when it dies.",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Serve GET /metrics in Prometheus' format (off by default: docs/serve.md says what it shows).",
)
@click.option(
    "--speculative",
    type=click.Choice(SPECULATIVE),
    default=Limits.speculative,
    show_default=True,
    help="Several tokens per pass, the same output, for every request: auto feeds a constraint's forced tokens in "
    "one pass, ngram adds prompt lookup, draft a draft model's guesses (--draft-model). The running batch "
    "speculates while it holds one row and decodes one token per pass for all rows above that; usage.speculation "
    "counts the drafted and accepted tokens.",
)
@click.option(
    "--draft-model",
    metavar="NAME_OR_PATH",
    help="A smaller package of the same tokenizer whose guesses are verified several per pass (auto and draft).",
)
@device_option
@threads_option
@click.option(
    "--api-key", envvar="EDGELM_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1/ (also $EDGELM_API_KEY)."
)
@click.option(
    "--max-batch",
    default=16,
    show_default=True,
    type=click.IntRange(min=0),
    help="Continuous batching: rows (prompts x n) decoded together in one running batch, requests joining and "
    "leaving it between steps; up to this many requests run at once, the rest wait in a FIFO queue. Used on the "
    "CPU with an edgelm package (its cache updated in place); 0 turns it off.",
)
@click.option(
    "--max-concurrency",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Without continuous batching (--max-batch 0, CUDA, other graphs): requests running at once, each "
    "decoding alone in a thread of its own; the rest wait in a FIFO queue.",
)
@click.option(
    "--max-queue",
    default=64,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests waiting for a place in the batch (or a thread), or for a thread to parse and prepare them or to "
    "run /tokenize; more get 429.",
)
@click.option(
    "--max-tokens-limit",
    type=click.IntRange(min=1),
    help="Largest max_tokens a request may ask for (default: the model's context).",
)
@click.option(
    "--max-n",
    default=Limits.max_n,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest n (completions per prompt).",
)
@click.option(
    "--max-prompts",
    default=Limits.max_prompts,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most prompts in one request (--max-batch-tokens bounds what they may hold).",
)
@click.option(
    "--max-body-bytes",
    default=Limits.max_body_bytes,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest request body; more gets 413.",
)
@click.option(
    "--request-timeout",
    default=Limits.request_timeout,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request may take, queue included: then 408 (or an error event ending the stream).",
)
@click.option(
    "--max-batch-tokens",
    default=Limits.max_batch_tokens,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens one request may hold: prompts x n x (prompt + max_tokens); more gets 400.",
)
@click.option(
    "--read-timeout",
    default=Limits.read_timeout,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a client has to send a request's headers, and again its body; then the connection is closed.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="HOST",
    help="Also accept this name in the Host header (repeatable; '*' accepts any). Default: 127.0.0.1, localhost, [::1] and --host.",
)
@click.option(
    "--allow-origin",
    "allow_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let web pages from this origin call the server, e.g. http://localhost:3000 (repeatable; '*' for any). Default: none (no CORS).",
)
@click.option(
    "--model-name",
    "model_names",
    multiple=True,
    metavar="NAME",
    help="A name requests may give as `model` (repeatable); the first is the id /v1/models lists. The package's name is always accepted.",
)
@click.option(
    "--accept-any-model",
    is_flag=True,
    help="Answer requests whatever `model` they name (llama-server's behaviour); without it an unknown name gets 404.",
)
@click.option(
    "--shutdown-timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGINT/SIGTERM, seconds running requests get to finish before they are stopped.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="The server's logging level.",
)
@prefix_cache_option
@prefix_cache_dir_option
@verify_options
def serve(
    package,
    host,
    port,
    uds,
    parent_pid,
    exit_with_stdin,
    metrics,
    speculative,
    draft_model,
    device,
    threads,
    api_key,
    max_batch,
    max_concurrency,
    max_queue,
    max_tokens_limit,
    max_n,
    max_prompts,
    max_body_bytes,
    request_timeout,
    max_batch_tokens,
    read_timeout,
    allow_hosts,
    allow_origins,
    model_names,
    accept_any_model,
    shutdown_timeout,
    log_level,
    prefix_cache_mb,
    prefix_cache_dir,
    prefix_cache_disk_mb,
    verify,
):
    """Serve a package (-m NAME_OR_PATH, or NAME_OR_PATH alone; default: as for every command) over an
    OpenAI-compatible HTTP API.

    \b
    POST /v1/completions  OpenAI completions (stream, logprobs, echo, n, stop, seed, ...); text or token-id prompts
    POST /v1/chat/completions  OpenAI chat (stream, logprobs, n, stop, seed, tools, response_format, ...), by the
                          package's chat template
    POST /v1/responses    OpenAI's Responses API, stateless (input, instructions, text.format, function tools)
    POST /v1/score        per-token log-probs and perplexity of {"text": ...}
    POST /tokenize, /detokenize   {"content": ...} <-> {"tokens": [...]} (llama-server's shapes)
    GET  /v1/models, /health (503 {"status": "loading"} while the model loads, every other path 503 meanwhile)

    Sampling follows OpenAI: temperature 0 is greedy, default 1.0 (sampling), top_k off (0) unless sent;
    transformers' options and edgelm's (EXTRA_FIELDS) are extra fields. Requests share one running batch (--max-batch), yet a seeded or
    greedy request gives what `edgelm generate` gives (with int8-dynamic weights, nearly always: their
    activation scales span the batch). Streamed log-probs come with the text chunk their tokens print in.
    Clients name the model by the id printed at start (--model-name sets it; --accept-any-model takes any).
    Binds to 127.0.0.1 unless --host says otherwise. Takes only JSON bodies, only Host names it is known
    by (--allow-host adds some) and sends no CORS headers unless --allow-origin names an origin.
    """
    try:
        from ..server.app import create_app
        from ..server.loading import Gate
        from ..server.uvicorn_server import run
    except ImportError as error:
        raise click.ClickException(
            f"edgelm serve needs the server extra ({error.name} is missing): {install_hint('server')}"
        ) from None
    from .. import model as model_module
    from ..store.local import resolve_package

    if speculative == "draft" and draft_model is None:
        raise click.BadParameter("--speculative draft needs --draft-model NAME_OR_PATH", param_hint="--speculative")
    if any(not name.strip() for name in model_names):
        raise click.BadParameter("a model name must not be empty", param_hint="--model-name")

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if threads is None and device != "cuda" and max_batch == 0:
        threads = max(1, (os.cpu_count() or 1) // max_concurrency)  # each request alone gets its share of cores
    package = resolve_package(package)  # a name that is not there fails now, before the socket listens
    gate = Gate(read_timeout)  # the socket listens while the model loads: /health says "loading" (server/loading.py)

    def load():
        # spinning off: the event loop, the tokenizer and the clients share the cores with onnxruntime's threads
        model = model_module.load(
            package, device=device, threads=threads, verify=verify, prefix_cache_mb=prefix_cache_mb, spinning=False,
            prefix_cache_dir=prefix_cache_dir, prefix_cache_disk_mb=prefix_cache_disk_mb, draft=draft_model,
        )  # fmt: skip
        limits = Limits(
            max_tokens=max_tokens_limit or model.arch.n_positions,
            max_n=max_n,
            max_prompts=max_prompts,
            max_body_bytes=max_body_bytes,
            request_timeout=request_timeout,
            max_batch_tokens=max_batch_tokens,
            read_timeout=read_timeout,
            speculative=speculative,
        )
        app = create_app(
            model,
            limits,
            max_concurrency,
            max_queue,
            api_key,
            host,
            allow_hosts,
            allow_origins,
            model_names,
            accept_any_model,
            max_batch,
            metrics,
        )
        names = app.names
        also = "any name" if names.accept_any else ", ".join(repr(n) for n in names.aliases if n != names.id)
        echo(  # the name clients pass as `model`, whatever the log level
            f"edgelm serve: model {names.id!r}"
            + (f" (also answers to {also})" if also else "")
            + (f" at unix:{uds}" if uds else f" at http://{host}:{port}/v1" if port else f" at http://{host} (a free port)"),
            err=True,
        )
        logging.getLogger("edgelm.server").info(
            "serving %s on %s (%s, onnxruntime threads: %s) at http://%s:%d/v1",
            model.package.name,
            model.device,
            f"one running batch of up to {max_batch} rows"
            if app.jobs.scheduler is not None
            else f"{max_concurrency} requests at once, each alone",
            threads or "all",
            host,
            port,
        )
        gate.open(app, _ready_line(names.id))

    run(gate, host, port, log_level, shutdown_timeout, uds, gate.listening, parent_pid, exit_with_stdin, load)


def _ready_line(model_id: str):
    """What edgelm serve prints on stdout once it can answer, one JSON line an app can wait for:
    {"event": "ready", "url", "host", "port", "model", "pid"} ({"uds"} in place of url, host and port)."""

    def ready(address: dict) -> None:
        where = address if "uds" in address else {"url": f"http://{_url_host(address['host'])}:{address['port']}"} | address
        click.echo(json.dumps({"event": "ready", **where, "model": model_id, "pid": os.getpid()}))
        sys.stdout.flush()

    return ready


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# the request fields of edgelm's own, as runtime/generation_options.py declares them
serve.help = serve.help.replace(
    "EXTRA_FIELDS", ", ".join(o.alias or o.name for o in request_fields() if o.http == EXTRA)
)
