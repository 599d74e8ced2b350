"""Structured output: OpenAI's `response_format` (chat, completions) and the Responses API's `text.format`, read
into the runtime's constraint options.

    {"type": "text"}                                        -> no constraint
    {"type": "json_object"}                                 -> json_object=True (any JSON object)
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}
                                                            -> json_schema=<the schema>
    text.format (/v1/responses): the same, the json_schema's keys beside "type"

The schema itself (its keywords, its size, whether it compiles) is checked where the option enters the runtime,
GenerationConfig: its GenerationOptionError names `json_schema`, which the request reports as `response_format`
(or `text.format`). `strict` is accepted either way: the constraint always holds the answer to the schema, so
every answer is what strict: true promises. An answer cut by max_tokens is unfinished JSON, with finish_reason
"length", as OpenAI's is. `stop` with a constrained answer is refused (refuse_stop): a stop string the answer
holds would cut it into text the schema does not allow, under finish_reason "stop", which says it is whole.
"""

from ..api_errors import ApiError
from .schema import json_type, short

TYPES = ("text", "json_object", "json_schema")
SCHEMA_KEYS = ("name", "description", "schema", "strict")
MAX_NAME = 64  # OpenAI's limit on a schema's name


def response_format_options(value, where: str = "response_format") -> dict:
    """The runtime options for a response_format object (None: none given); ApiError naming the field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f'{where} must be an object like {{"type": "json_object"}}, got {json_type(value)}', where)
    kind = value.get("type")
    if kind not in TYPES:
        raise ApiError(
            400, f"{where}.type must be one of {', '.join(TYPES)}, got {short(kind)}", f"{where}.type", "invalid_type"
        )
    if kind == "json_schema" and where == "response_format":
        _only(value, ("type", "json_schema"), where)
        return _schema_options(value.get("json_schema"), f"{where}.json_schema")
    if kind == "json_schema":  # text.format: the schema's keys beside "type"
        _only(value, ("type", *SCHEMA_KEYS), where)
        return _schema_options({k: v for k, v in value.items() if k != "type"}, where)
    _only(value, ("type",), where)
    return {"json_object": True} if kind == "json_object" else {}


def _schema_options(spec, where: str) -> dict:
    if not isinstance(spec, dict):
        raise ApiError(
            400,
            f'{where} must be an object like {{"name": "answer", "schema": {{"type": "object", ...}}}}, '
            f"got {json_type(spec)}",
            where,
        )
    _only(spec, SCHEMA_KEYS, where)
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_NAME):
        raise ApiError(400, f"{where}.name must be a string of 1 to {MAX_NAME} characters", f"{where}.name")
    for key, kind in (("description", str), ("strict", bool)):
        if spec.get(key) is not None and not isinstance(spec[key], kind):
            raise ApiError(
                400, f"{where}.{key} must be {'a string' if kind is str else 'true or false'}", f"{where}.{key}"
            )
    schema = spec.get("schema")
    if schema is None:  # OpenAI's schema is optional: without one, any JSON object
        return {"json_object": True}
    if not isinstance(schema, dict):
        raise ApiError(
            400, f"{where}.schema must be a JSON schema (an object), got {json_type(schema)}", f"{where}.schema"
        )
    return {"json_schema": schema}


def _only(value: dict, keys: tuple, where: str) -> None:
    for key in value:
        if key not in keys:
            name = f"{where}.{str(key)[:40]}"
            raise ApiError(400, f"unknown field {name!r}; {where} takes: {', '.join(keys)}", name, "unknown_field")


def refuse_stop(options: dict, constrained_by: str | None) -> None:
    """ApiError naming `stop` where the request gives stop strings and its answer is constrained (`constrained_by`:
    the field that constrains it, response_format or tool_choice; None: not constrained)."""
    if constrained_by is None or not options.get("stop"):
        return
    raise ApiError(
        400,
        f"stop cannot be given with {constrained_by}: a stop string inside the constrained answer would cut it into "
        "text it does not allow, while finish_reason said \"stop\"; leave stop out (the constraint ends the answer)",
        "stop",
    )
