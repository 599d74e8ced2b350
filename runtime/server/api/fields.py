"""OpenAI's request fields that edgelm takes without honouring them, and those it refuses: one list per endpoint.

OpenAI's clients and the frameworks on top of them send fields that mean something only on OpenAI's service
(billing tiers, dashboards, server-side storage). They are accepted and ignored, as other OpenAI-compatible
servers do, so a client written for OpenAI works unchanged; each is listed here with why it means nothing
locally. Fields asking for what edgelm cannot do (audio output, web search, stored state) are refused with a
400 naming the field and why, rather than answered as if they had been honoured. A field no OpenAI schema has,
and none of edgelm's own, is still an unknown field (schema.py); tests/server/test_server_fields.py compares these
lists and the body models with the openai package's request types, so a new client release shows what it adds.
"""

from typing import Any

from pydantic import BaseModel, create_model

from ..api_errors import ApiError
from .schema import STRICT

# Accepted, no local meaning: field -> why.
SHARED_IGNORED = {
    "user": "an end-user id for OpenAI's abuse monitoring",
    "metadata": "tags for OpenAI's dashboard",
    "store": "OpenAI keeps answers for its dashboard and evals; edgelm keeps nothing",
    "service_tier": "OpenAI's billing and latency tiers",
    "safety_identifier": "an end-user id for OpenAI's abuse monitoring",
    "prompt_cache_key": "a routing hint for OpenAI's prompt cache; edgelm's prefix cache needs none",
    "prompt_cache_retention": "how long OpenAI keeps a cached prompt",
    "prompt_cache_options": "OpenAI's prompt cache modes",
}
CHAT_IGNORED = {
    **SHARED_IGNORED,
    "reasoning_effort": "for OpenAI's reasoning models; edgelm's models answer at once",
    "verbosity": "a length hint for OpenAI's reasoning models; max_completion_tokens bounds the answer",
    "prediction": "predicted output to speed up OpenAI's decoding; edgelm decodes every token",
}
RESPONSES_IGNORED = {
    **SHARED_IGNORED,
    "reasoning": "for OpenAI's reasoning models; edgelm's models answer at once",
    "include": "extra output of OpenAI's built-in tools, which edgelm does not run",
    "max_tool_calls": "a bound on OpenAI's built-in tool calls, which edgelm does not run",
    "access_programs": "OpenAI's domain access programs",
    "background_options": "OpenAI's background completion windows",
    "image": "OpenAI's image input options; edgelm reads text",
    "context_management": "OpenAI's server-side compaction of stored conversations",
    "stream_options": "stream obfuscation pads OpenAI's events against length side channels",
}

# Refused when set (to anything but the value given, where there is one): field -> (the value allowed, why).
NO_VALUE = object()
CHAT_REFUSED = {
    "audio": (NO_VALUE, "edgelm writes text only; audio output is not available"),
    "modalities": (["text"], 'edgelm writes text only; leave modalities out or send ["text"]'),
    "web_search_options": (NO_VALUE, "edgelm cannot search the web"),
    "moderation": (NO_VALUE, "edgelm runs no moderation model"),
    "functions": (NO_VALUE, "OpenAI's deprecated function calling is not taken: send tools (and tool_choice)"),
    "function_call": (NO_VALUE, "OpenAI's deprecated function calling is not taken: send tool_choice (and tools)"),
}
RESPONSES_REFUSED = {
    "previous_response_id": (
        NO_VALUE,
        "edgelm keeps no responses (no state is stored): send the whole conversation as input",
    ),
    "conversation": (
        NO_VALUE,
        "edgelm keeps no conversations (no state is stored): send the whole conversation as input",
    ),
    "prompt": (NO_VALUE, "edgelm has no stored prompt templates: send the prompt as instructions and input"),
    "background": (False, "edgelm answers while the request waits; background responses are not available"),
    "moderation": (NO_VALUE, "edgelm runs no moderation model"),
}


def accepted(name: str, ignored: dict, refused: dict) -> type[BaseModel]:
    """A pydantic model with every ignored and refused field (any JSON value): a body model inherits it."""
    return create_model(name, __config__=STRICT, **{f: (Any, None) for f in (*ignored, *refused)})


def refuse(parsed: BaseModel, refused: dict) -> None:
    """ApiError (400) for the first refused field the body set to a value edgelm cannot honour."""
    for name, (allowed, why) in refused.items():
        value = getattr(parsed, name, None)
        if value is not None and value != allowed:
            raise ApiError(400, f"{name} is not supported: {why}", name, "unsupported_field")


ChatExtras = accepted("ChatExtras", CHAT_IGNORED, CHAT_REFUSED)
ResponsesExtras = accepted("ResponsesExtras", RESPONSES_IGNORED, RESPONSES_REFUSED)
