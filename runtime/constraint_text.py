"""A constraint as the settings hold it: plain text, checked for shape, compiled by nobody here.

GenerationConfig keeps its constraint (json_schema, json_object, regex, grammar or choices) as a description:
the schema as canonical JSON text (schema_text), the regex, the Lark grammar, the tuple of choices, each at most
MAX_TEXT characters. Turning it into an llguidance grammar is the samplers' work (runtime/sampling/constraint.py):
the model checks it there as a request enters (Model.settings) and compiles it for its tokenizer before the
first token. JSON and the standard library only: the settings layer imports neither NumPy nor llguidance.
"""

import json
import re

from .errors import GenerationOptionError

# Characters of schema, regex, grammar or choices one request may send: a compile takes time in proportion to them
# (0.28 s for a 32,000-character schema on a loaded 2-core machine, benchmarks/results/2026-12-01-constrained.md).
MAX_TEXT = 64_000


def one_line(message, limit: int = 300) -> str:
    """A parser's message on one line, without the source excerpt and caret it draws under it."""
    lines = [x for x in str(message).splitlines() if x.strip(" ^") and not re.match(r"\s*\d+ \|", x)]
    line = " ".join(" ".join(lines).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def schema_text(value) -> str:
    """A JSON schema as JSON text: a dict, JSON text, or a class with model_json_schema() (a pydantic model; the
    runtime never imports pydantic). Raises GenerationOptionError(param="json_schema")."""
    if hasattr(value, "model_json_schema") and callable(value.model_json_schema):
        value = value.model_json_schema()
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise GenerationOptionError(f"json_schema is over {MAX_TEXT:,} characters", param="json_schema")
        try:
            value = json.loads(value)
        except ValueError as error:
            raise GenerationOptionError(f"json_schema is not valid JSON: {one_line(error)}", "json_schema") from None
    if not isinstance(value, dict):
        raise GenerationOptionError(
            f"json_schema must be a JSON schema (an object), its JSON text, or a pydantic model class; got {type(value).__name__}",
            param="json_schema",
        )
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise GenerationOptionError(f"json_schema is not JSON: {one_line(error)}", "json_schema") from None
    if len(text) > MAX_TEXT:
        raise GenerationOptionError(f"json_schema is over {MAX_TEXT:,} characters", param="json_schema")
    return text
