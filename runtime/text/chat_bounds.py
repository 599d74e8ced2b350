"""Bounds on rendering a chat template, which comes from a package and so is hostile input: a step budget for
loops, and size checks made before a value is built for what the sandbox leaves open (`~`, `+`, `%` and format
widths, and the center, indent, replace, join and format filters). chat_template.py installs them."""

import re
import sys

from ..errors import ChatError

MAX_PROMPT_CHARS = 1 << 20  # a rendered conversation; far more than any context here holds
MAX_RENDER_STEPS = 2_000_000  # lines of template code one render may run; a real one runs ~20 per message


def bound_filters(filters: dict, SecurityError) -> None:
    """Refuse, before it is built, a filter result over MAX_PROMPT_CHARS: center, indent, replace and join can
    each make a short template ask for gigabytes."""

    def check(size: int, name: str) -> None:
        if size > MAX_PROMPT_CHARS:
            raise SecurityError(f"the {name} filter in the template makes a value too large")

    center, indent, replace, join, format = (filters[n] for n in ("center", "indent", "replace", "join", "format"))

    def do_format(value, *args, **kwargs):
        check_widths(str(value), SecurityError)
        return format(value, *args, **kwargs)

    def do_center(value, width=80):
        check(width if isinstance(width, int) else 0, "center")
        return center(value, width)

    def do_indent(s, width=4, *args, **kwargs):
        s = str(s)
        check(len(s) + (s.count("\n") + 1) * (width if isinstance(width, int) else len(str(width))), "indent")
        return indent(s, width, *args, **kwargs)

    def do_replace(eval_ctx, s, old, new, count=None):
        s, old, new = str(s), str(old), str(new)
        check(len(s) + (len(s) + 1 if not old else s.count(old)) * max(len(new) - len(old), 0), "replace")
        return replace(eval_ctx, s, old, new, count)

    def do_join(eval_ctx, value, d="", attribute=None):
        value = list(value)
        check(sum(len(str(v)) for v in value) + len(str(d)) * len(value), "join")
        return join(eval_ctx, value, d, attribute)

    do_replace.jinja_pass_arg = replace.jinja_pass_arg  # Jinja passes the evaluation context to these two
    do_join.jinja_pass_arg = join.jinja_pass_arg
    filters.update(center=do_center, indent=do_indent, replace=do_replace, join=do_join, format=do_format)


def check_widths(template: str, SecurityError) -> None:
    """Refuse a format string ('%1000000000s', '{:>1000000000}') whose width or precision passes MAX_PROMPT_CHARS."""
    if any(int(digits) > MAX_PROMPT_CHARS for digits in re.findall(r"\d{7,}", template)):
        raise SecurityError("a width in a format string of the template makes a value too large")


def bounded_join(seq) -> str:
    """Jinja's `~` (str_join), refusing a result over MAX_PROMPT_CHARS before it is built."""
    parts = [str(part) for part in seq]
    if sum(map(len, parts)) > MAX_PROMPT_CHARS:
        raise ChatError("a concatenation (~) in the chat template makes a value too large", "messages")
    return "".join(parts)


class Budget:
    """Counts the lines the template's own code runs (sys.settrace, in this thread, during one render) and stops
    the render past MAX_RENDER_STEPS: loops nested in loops can run for hours without building anything."""

    def __enter__(self):
        self.steps, self.previous = 0, sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.steps += 1
            if self.steps > MAX_RENDER_STEPS:
                raise ChatError(
                    f"the chat template runs over {MAX_RENDER_STEPS:,} steps for these messages; it loops without end "
                    "or the conversation is too long",
                    "messages",
                )
        return self._line
