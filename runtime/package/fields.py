"""The readers of a package manifest's JSON values: each checks one value's type and range and names the field in
every complaint (FormatError). The manifest's sections (architecture.py, graph_section.py, sections.py) are built
from them; this module holds no file names or constants of its own.
"""

import math
import re
from dataclasses import MISSING


class FormatError(ValueError):
    """A JSON value does not fit the package format. The message names the field; the caller turns it into
    its own error (PackageError at load). `advice` replaces the caller's usual advice where it would mislead."""

    def __init__(self, message: str, advice: str | None = None):
        super().__init__(message)
        self.advice = advice


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _show(value) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(where, value, low=0, high=1 << 62):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise FormatError(f"{where} must be an integer from {low} to {high}, got {_show(value)}")
    return value


def _number(where, value, low=-math.inf, high=math.inf):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise FormatError(f"{where} must be a finite number from {low} to {high}, got {_show(value)}")
    return float(value)


def _str(where, value):
    if not isinstance(value, str):
        raise FormatError(f"{where} must be a string, got {_show(value)}")
    return value


def _bool(where, value):
    if not isinstance(value, bool):
        raise FormatError(f"{where} must be true or false, got {_show(value)}")
    return value


def _version(where, value) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\d{1,4}(\.\d{1,6}){0,3}", value):
        raise FormatError(f"{where} must be a version such as \"1.22\", got {_show(value)}")
    return value


def _object(where, value) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be an object, got {_kind(value)}")
    return value


def _list(where, value) -> list:
    if not isinstance(value, list):
        raise FormatError(f"{where} must be a list, got {_kind(value)}")
    return value


def _get(where, data, key, read, default=MISSING):
    """data[key] checked by read(field name, value); a missing key is the default, or an error without one."""
    path = f"{where}.{key}" if where else key
    if key not in data:
        if default is MISSING:
            raise FormatError(f"{path} is missing")
        return default
    return read(path, data[key])


def file_name(where, value) -> str:
    """A file of the package: a plain name in its folder, never a path that could lead out of it."""
    name = _str(where, value)
    if not name or name in (".", "..") or len(name) > 255 or any(c in name for c in "/\\\0:"):
        raise FormatError(f"{where} must be a plain file name inside the package folder, got {_show(name)}")
    return name


def _choice(options):
    def read(where, value):
        if value not in options:
            raise FormatError(f"{where} must be one of {', '.join(options)}, got {_show(value)}")
        return value

    return read
