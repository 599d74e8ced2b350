"""`edgelm serve`: an OpenAI-compatible HTTP server over one loaded package (the optional `server` extra).

    request_path.py    the one path of a request that runs on the model: parse, settings, prepare, job, answer
    completions.py     POST /v1/completions: its prompts, echo and stream chunks
    chat.py            POST /v1/chat/completions: the conversation rendered once, its chunks
    schema.py          pydantic bodies checked, the first problem as one ApiError
    limits.py          the server's limits and their defaults (no server extra needed to read them)
    requests.py        the fields the endpoints share, the server's limits -> runtime options; completions' body
    chat_requests.py   the chat body -> runtime options
    completion_answers.py  Completions -> response bodies (pydantic models of OpenAI's shapes)
    chat_answers.py    the chat shapes
    api_errors.py      OpenAI's error body; the one mapping from what was raised to what the client sees
    jobs.py            the FIFO of slots and the worker threads that run each request's Batch
    waiting.py         waiting for a slot, watching for the client leaving
    workers.py         the server's worker threads: requests parsed and prepared, /tokenize run, off the event loop
    text_work.py       /tokenize and /detokenize in the tokenizer's thread
    template_process.py  large conversations' chat templates rendered in a process of their own (off the GIL)
    app.py             Starlette routes
    middleware.py      the Host check, CORS, the API-key check and the access log
    uvicorn_server.py  uvicorn with a deadline on request heads, and graceful shutdown

Only `edgelm serve` (runtime/cli/serve.py) imports this package: uvicorn, Starlette and pydantic never load with
`import edgelm.runtime`.
"""
