"""`edgelm serve`: an OpenAI-compatible HTTP server over one loaded package (the optional `server` extra).

    requests.py        request bodies (pydantic models) and the server's limits -> runtime options
    responses.py       Completions -> response bodies (pydantic models of OpenAI's shapes)
    errors.py          OpenAI's error body; what each runtime error becomes
    jobs.py            the FIFO of slots and the worker threads that run each request's Batch
    app.py             Starlette routes: read, parse, run, answer
    middleware.py      the Host check, CORS, the API-key check and the access log
    uvicorn_server.py  uvicorn with a deadline on request heads, and graceful shutdown
    cli.py             the click command

Only `edgelm serve` imports this package: uvicorn, Starlette and pydantic never load with `import edgelm.runtime`.
"""
