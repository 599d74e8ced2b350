"""`edgelm serve`: an OpenAI-compatible HTTP server over one loaded package (the optional `server` extra).

    schema.py      request bodies -> runtime options, Completions -> response bodies (no I/O)
    jobs.py        the FIFO of slots and the worker threads that run each request's Batch
    app.py         Starlette routes, error bodies, and the uvicorn runner
    middleware.py  the API-key check and the access log
    cli.py         the click command

Only `edgelm serve` imports this package: uvicorn and Starlette never load with `import edgelm.runtime`.
"""
