"""Bounds on rendering a chat template, which comes from a package and so is hostile input.

Jinja's sandbox keeps a template away from Python's internals but not from work: `'x' * n`, `|center(n)`,
`lipsum(n)`, a list of itself nested sixty times and printed, squaring a number in a loop. So every value a
template builds is measured before or as it is built, and one render has three budgets:
- size: no value may exceed MAX_VALUE, counted expanded (characters, plus one per item, a shared sub-list
  counted each time it appears), so printing, comparing or hashing any value is bounded work;
- work: MAX_RENDER_WORK units in all, a unit being a template line run or a character or item built, printed or
  compared, so a loop of bounded steps cannot add up to hours;
- time: the caller's deadline (`deadline(at)`, the server's --request-timeout), checked between template lines.
Whatever Jinja offers that can multiply size or time is bounded by this module or not offered: filters and string methods
outside the lists below are absent, widths and counts are checked before the call, and json is built in pieces.
chat_sandbox.py applies them to the Jinja environment chat_template.py renders in."""

import contextvars
import itertools
import json
import re
import sys
import threading
import time
from contextlib import contextmanager

from ..errors import ChatError, DeadlineError

MAX_PROMPT_CHARS = 1 << 20  # a rendered conversation; far more than any context here holds
MAX_VALUE = MAX_PROMPT_CHARS  # any one value, expanded (see above)
MAX_RENDER_STEPS = 2_000_000  # lines of template code one render may run; a real one runs ~20 per message
MAX_RENDER_WORK = 32 << 20  # units of work one render may do; a real one does ~5 per character it renders
MAX_COUNT = 100_000  # what a filter or global counts to by itself (batch, slice, lipsum): Jinja's own range limit
MAX_JSON_INDENT = 16
MEMO_FROM = 1024  # containers this large remember their expanded size, so a shared one is measured once

# Jinja's filters a template may use; the rest (pprint, urlize, and any a later Jinja adds) are not offered
FILTERS = (
    "abs attr batch capitalize center count d default dictsort e escape filesizeformat first float forceescape "
    "format groupby indent int items join last length list lower map max min random reject rejectattr replace "
    "reverse round safe select selectattr slice sort string striptags sum title tojson trim truncate unique upper "
    "urlencode wordcount wordwrap xmlattr"
).split()
WALKING_FILTERS = ("unique", "min", "max", "sum", "wordcount")  # read all of their input for a small result
STR_METHODS = frozenset(
    "capitalize casefold center count endswith find format format_map index isalnum isalpha isascii isdecimal "
    "isdigit isidentifier islower isnumeric isprintable isspace istitle isupper join ljust lower lstrip partition "
    "removeprefix removesuffix replace rfind rindex rjust rpartition rsplit rstrip split splitlines startswith "
    "strip swapcase title upper zfill".split()
)  # not encode, expandtabs, translate or maketrans: bytes, tab widths and tables multiply sizes unseen
METHODS = {dict: frozenset("get items keys values copy".split()), list: frozenset("index count copy".split())}
METHODS[tuple] = frozenset(("index", "count"))

_current = threading.local()  # the Budget of the render running in this thread
_deadline = contextvars.ContextVar("chat_template_deadline", default=None)


@contextmanager
def deadline(at: float | None):
    """Renders started inside stop at time.monotonic() `at` with a DeadlineError."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


class Budget:
    """One render's size, work and time budgets. While it is entered it traces the template's lines in this
    thread (sys.settrace) and is what the bounded environment charges."""

    def __init__(self):
        self.steps = self.work = 0
        self.deadline = _deadline.get()
        self.memo = {}  # id -> (container, expanded size): the container is kept so its id is not reused

    def __enter__(self):
        self.previous, self.outer = sys.gettrace(), getattr(_current, "budget", None)
        _current.budget = self
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)
        _current.budget = self.outer

    def charge(self, units: int) -> None:
        self.work += units
        if self.work > MAX_RENDER_WORK:
            raise ChatError(
                f"the chat template does over {MAX_RENDER_WORK:,} units of work for these messages (characters and "
                "items built, compared or printed); it runs away, or the conversation is too long",
                "messages",
            )

    def size(self, value) -> int:
        """The expanded size of `value`: characters of strings, one per item of a container, nested."""
        if isinstance(value, (str, bytes)):
            return len(value)
        if not isinstance(value, (list, tuple, dict)):
            return 1
        return self._expanded(value, {})

    def _expanded(self, value, seen: dict) -> int:
        """size() of a container; `seen` holds the small ones met in this walk, so a shared one costs one visit."""
        hit = self.memo.get(id(value)) or seen.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        total = len(value)
        for item in itertools.chain(value, value.values()) if isinstance(value, dict) else value:
            if isinstance(item, (str, bytes)):
                total += len(item)
            elif isinstance(item, (list, tuple, dict)):
                total += self._expanded(item, seen)
            else:
                total += 1
            if total > MAX_VALUE:
                break  # too large already: the caller refuses it
        (self.memo if total >= MEMO_FROM else seen)[id(value)] = (value, total)
        return total

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.steps += 1
            self.charge(1)
            if self.steps > MAX_RENDER_STEPS:
                raise ChatError(
                    f"the chat template runs over {MAX_RENDER_STEPS:,} steps for these messages; it loops without "
                    "end or the conversation is too long",
                    "messages",
                )
            if self.deadline is not None and self.steps % 1024 == 0 and time.monotonic() > self.deadline:
                raise DeadlineError("rendering the chat template ran past the request's deadline")
        return self._line


class _Unbounded(Budget):
    """What a bound asks outside a render (Jinja folds constants when it compiles): sizes, no work budget."""

    def charge(self, units: int) -> None:
        pass


def budget() -> Budget:
    return getattr(_current, "budget", None) or _Unbounded()


def too_large(what: str):
    from jinja2.exceptions import SecurityError

    return SecurityError(f"{what} in the template makes a value too large")


def checked(value, what: str = "a value", charge: bool = True):
    """`value`, once its expanded size is within MAX_VALUE; its size is charged as work."""
    b = budget()
    size = b.size(value)
    if size > MAX_VALUE:
        raise too_large(what)
    if charge:
        b.charge(size)
    return value


def check_size(size: int, what: str) -> None:
    """Refuse, before it is built, a value that would be `size` long."""
    if size > MAX_VALUE:
        raise too_large(what)


def check_widths(template: str, SecurityError=None) -> None:
    """Refuse a format string ('%1000000000s', '{:>1000000000}') whose width or precision passes MAX_VALUE."""
    if any(int(digits) > MAX_VALUE for digits in re.findall(r"\d{7,}", str(template))):
        raise too_large("a width in a format string")


def check_format(template, values) -> None:
    """Refuse a format string whose result would pass MAX_VALUE: its widths, and each of its fields filled with
    the largest value given ('%s%s%s' % (x, x, x), '{0}{0}'.format(x), '%(a)s%(a)s' % {'a': x})."""
    template = str(template)
    check_widths(template)
    fields = template.count("%") + template.count("{")
    largest = max((budget().size(v) for v in values), default=0)
    if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_VALUE for v in values):
        raise too_large("a width passed to a format string")  # '{:>{w}}'.format(x, w=...)
    check_size(len(template) + fields * largest, "a format string")


def bounded_join(seq) -> str:
    """Jinja's `~` (str_join), refusing a result over MAX_VALUE before it is built."""
    parts = list(seq)
    check_size(sum(budget().size(part) for part in parts), "a concatenation (~)")
    text = "".join(map(str, parts))
    budget().charge(len(text))
    return check_str(text, "a concatenation (~)")


def check_str(text, what: str):
    if isinstance(text, (str, bytes)) and len(text) > MAX_VALUE:
        raise too_large(what)  # a str() of something measured as small, after all large
    return text


def bounded_json(value, **options) -> str:
    """json.dumps(value, **options) built in pieces, refused once it passes MAX_VALUE (an indent multiplies)."""
    indent = options.get("indent")
    if isinstance(indent, int) and not isinstance(indent, bool) and indent > MAX_JSON_INDENT:
        raise too_large(f"a tojson indent of {indent}")
    if isinstance(indent, str) and len(indent) > MAX_JSON_INDENT:
        raise too_large("a tojson indent string")
    checked(value, "tojson")
    out, size = [], 0
    for piece in json.JSONEncoder(**options).iterencode(value):
        size += len(piece)
        check_size(size, "tojson")
        out.append(piece)
    budget().charge(size)
    return "".join(out)


def bounded_lipsum(n=5, html=True, min=20, max=100):
    """Jinja's lipsum, within MAX_COUNT words."""
    from jinja2.utils import generate_lorem_ipsum

    counts = [v for v in (n, min, max) if isinstance(v, int)]
    if len(counts) < 3 or any(v < 0 for v in counts) or n * max > MAX_COUNT:
        raise too_large(f"lipsum({n}, max={max})")
    return generate_lorem_ipsum(n, html, min, max)
