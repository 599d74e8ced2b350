"""Request bodies checked against their pydantic models: one ApiError naming the first bad field.

The models check JSON types and shape only (strict: an integer field takes no "5" and no true, unknown fields
are refused); value ranges belong to the runtime's GenerationConfig. What a model refuses becomes one line:
unknown fields first (listing what the object takes), then text that is not Unicode, then wrong types.
"""

from typing import Annotated, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from ...inputs import text_problem
from ..api_errors import ApiError

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
TEXTS = "a string or a list of strings"


def _text(value: str) -> str:
    """JSON can carry a lone UTF-16 surrogate ("\\ud800") that is no Unicode text: refuse it by name."""
    problem = text_problem(value, "{where}")  # the field's name is filled in by first_problem
    if problem:
        raise PydanticCustomError("invalid_text", problem)
    return value


Text = Annotated[str, AfterValidator(_text)]

TYPE_WORDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
    "list_type": "a list",
    "literal_error": None,  # pydantic's own words name the values allowed
}


def validate(model: type[BaseModel], body) -> BaseModel:
    """`body` (decoded JSON) as an instance of `model`; ApiError (400) naming the first problem."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {json_type(body)}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise first_problem(model, error.errors(include_url=False)) from None


def first_problem(model: type[BaseModel], errors: list) -> ApiError:
    """One ApiError for pydantic's list: unknown fields first, then text that is not Unicode, then wrong types."""
    for e in errors:
        if e["type"] == "extra_forbidden":
            name = dotted(e["loc"])
            holder = _model_at(model, e["loc"][:-1]) or model
            takes = ", ".join(sorted(holder.model_fields))
            return ApiError(400, f"unknown field {name!r}; this endpoint takes: {takes}", name, "unknown_field")
    for e in errors:
        if e["type"] == "invalid_text":
            name = dotted(e["loc"]) if len(e["loc"]) > 1 and _nested(model, e["loc"][0]) else e["loc"][0]
            return ApiError(400, e["msg"].format(where=name), name, "invalid_text")
    first = errors[0]
    if not first["loc"]:  # a field name pydantic cannot read (a lone surrogate in it)
        return ApiError(400, "every field name must be Unicode text", None, "unknown_field")
    top = first["loc"][0]
    if first["type"] == "missing":
        name = dotted(first["loc"]) if _nested(model, top) else top
        return ApiError(400, f"{name} is required", name)
    if top == "logit_bias":
        return ApiError(400, "logit_bias values must be numbers from -100 to 100", "logit_bias", "invalid_type")
    info = model.model_fields.get(top)
    if info is not None and info.description:  # a union: pydantic reports each member; the field says what fits
        name, expected, value = top, info.description, first["input"]
    else:
        parts = [p for p in first["loc"] if isinstance(p, str) and not p.startswith(("function-", "union["))]
        name = dotted(parts if _nested(model, top) else parts[:1])
        expected, value = TYPE_WORDS.get(first["type"], first["msg"].lower()), first["input"]
        if expected is None:
            return ApiError(400, f"{name}: {first['msg'].lower()}, got {short(value)}", name, "invalid_type")
    return ApiError(400, f"{name} must be {expected}, got {json_type(value)} {short(value)}", name, "invalid_type")


def dotted(loc) -> str:
    """pydantic's location as a field path: ("tools", 0, "function") -> "tools[0].function"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _nested(model: type[BaseModel], name) -> bool:
    """Whether the field holds an object of its own (stream_options, response_format): its path is named in full."""
    info = model.model_fields.get(name) if isinstance(name, str) else None
    return info is not None and bool(_models_in(info.annotation))


def _model_at(model: type[BaseModel], loc) -> type[BaseModel] | None:
    """The pydantic model that holds the field at `loc` (a path of names and list indexes), if one does."""
    current = model
    for part in loc:
        if isinstance(part, int):
            continue
        info = current.model_fields.get(part)
        found = _models_in(info.annotation) if info is not None else []
        if not found:
            return None
        current = found[0]
    return current


def _models_in(annotation) -> list:
    """The BaseModel classes an annotation names (through Optional, unions, lists and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, list, Annotated) or type(annotation).__name__ == "UnionType":
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def json_type(value) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def short(value) -> str:
    """A short view of a client's value: scalars as written (cut), containers by size only (they may be deep)."""
    if isinstance(value, (list, dict)):
        return f"of {len(value)} items"
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return repr(value)[:40]
