"""The server's limits: what one request may ask for, and how its tokens are decoded. Their defaults are written
here only; `edgelm serve` (runtime/cli/serve.py) shows them as its options' defaults, and this module imports
nothing of the server extra, so the command's help works without it."""

from dataclasses import dataclass

from ..generation_options import server_defaults


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a command-line option of `edgelm serve`."""

    max_tokens: int = 1024  # max_tokens above this is refused (default: the model's context)
    max_n: int = 8  # completions per prompt
    max_prompts: int = 32  # prompts in one request (LangChain's OpenAI sends 20 at a time)
    max_body_bytes: int = 1_000_000  # request body size (413 above)
    request_timeout: float = 300.0  # seconds from arrival, queue time included (408 above)
    max_batch_tokens: int = 32_768  # prompts x n x (prompt + max_tokens): the tokens one request may hold
    read_timeout: float = 5.0  # seconds for a request's headers, and again for its body (408 / closed)
    # every request's `speculative` option (requests do not set it): several tokens per pass in the running batch
    # while it holds few rows (runtime/batching/scheduler.py), or for a request decoded alone
    speculative: str = server_defaults()["speculative"]
